// Target LLMs: the decoder-only transformers that verify draft blocks. One description covers the
// three GGUF architectures; they differ only in small switches:
//
//   arch    rope     q/k norm   q/k/v bias
//   qwen3   NEOX     yes        no
//   qwen2   NEOX     no         yes
//   llama   normal   no         no      (optional rope_freqs per-pair factors)
#pragma once

#include "dspark-backbone.h"
#include "dspark-weights.h"

#include <string>
#include <vector>

struct target_hparams : dspark_backbone {
    std::string arch;
    int  n_vocab = 0;
    bool qk_norm = false;
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
