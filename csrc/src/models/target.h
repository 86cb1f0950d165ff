// Target LLMs: the decoder-only transformers that verify draft blocks. One description covers the
// three GGUF architectures; they differ only in small switches:
//
//   arch    rope     q/k norm   q/k/v bias
//   qwen3   NEOX     yes        no
//   qwen2   NEOX     no         yes
//   llama   normal   no         no      (optional rope_freqs per-pair factors)
#pragma once

#include "dspark-rope.h"
#include "dspark-weights.h"

#include <string>
#include <vector>

struct target_hparams {
    std::string arch;
    int   n_vocab     = 0;
    int   n_embd      = 0;
    int   n_layer     = 0;
    int   n_head      = 0;
    int   n_head_kv   = 0;
    int   head_dim_k  = 0;
    int   head_dim_v  = 0;
    int   n_ff        = 0;
    int   n_ctx_train = 0;
    float rms_eps     = 1e-6f;
    bool  qk_norm     = false;
    dspark_rope rope;

    int n_embd_k_gqa() const { return head_dim_k * n_head_kv; }
    int n_embd_v_gqa() const { return head_dim_v * n_head_kv; }
};

struct target_layer {
    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * wq = nullptr, * wk = nullptr, * wv = nullptr, * wo = nullptr;
    ggml_tensor * bq = nullptr, * bk = nullptr, * bv = nullptr, * bo = nullptr;
    ggml_tensor * q_norm = nullptr, * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * ffn_gate = nullptr, * ffn_up = nullptr, * ffn_down = nullptr;
};

struct target_model {
    target_hparams hp;
    ggml_tensor * tok_embd    = nullptr;  // {E, V}
    ggml_tensor * output_norm = nullptr;  // {E}
    ggml_tensor * output      = nullptr;  // {E, V}; the token embeddings when tied
    ggml_tensor * rope_freqs  = nullptr;  // {n_rot/2} or null
    std::vector<target_layer> layers;

    // Read hyperparameters and look up (and shape-check) every tensor; no data is loaded.
    void load(dspark_weights & w);
};

bool dspark_is_target_arch(const std::string & arch);
