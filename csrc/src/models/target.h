// Target LLMs: the decoder-only transformers that verify draft blocks. One description covers the
// GGUF architectures; they differ in switches and in what each layer holds:
//
//   arch      rope     q/k norm   q/k/v bias   FFN
//   qwen3     NEOX     yes        no           SwiGLU
//   qwen2     NEOX     no         yes          SwiGLU
//   llama     normal   no         no           SwiGLU    (optional rope_freqs per-pair factors)
//   qwen3moe  NEOX     yes        no           top-k of SwiGLU experts (+ optional shared expert)
//   gemma4    NEOX     yes        no           GELU, sandwich norms, optional experts next to the
//                                              dense FFN, sliding-window and global layers with
//                                              their own head size, KV heads and rope (models/gemma4.cpp)
#pragma once

#include "dspark-backbone.h"
#include "dspark-weights.h"

#include <string>
#include <vector>

struct target_hparams : dspark_backbone {
    std::string arch;
    int   n_vocab = 0;
    bool  qk_norm = false;
    bool  gemma   = false;          // Gemma-4 layer shape (models/gemma4.cpp)
    float embd_scale    = 1.0f;     // token embeddings times this (Gemma: sqrt(n_embd))
    float logit_softcap = 0.0f;     // > 0: logits = c · tanh(logits / c)
    int   n_swa = 0;                // sliding window of the sliding layers (0: none)
    int   n_embd_per_layer = 0;     // Gemma-4 per-layer token embeddings (0: none)
    // mixture of experts
    int   n_expert = 0, n_expert_used = 0;
    bool  expert_weights_norm = true;   // renormalise the top-k router probabilities
    float expert_weights_scale = 1.0f;
};

struct target_layer {
    // geometry: per layer, since Gemma-4 mixes sliding and global layers
    int  head_dim = 0, n_head_kv = 0;
    bool swa    = false;            // sliding-window layer: masked to the last n_swa positions
    int  kv_src = -1;               // the layer whose K/V this layer attends to (itself unless shared)
    dspark_rope   rope;
    ggml_tensor * rope_freqs = nullptr;  // {n_rot/2} per-pair divisors, or null

    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * wq = nullptr, * wk = nullptr, * wv = nullptr, * wo = nullptr;  // wv null: V = K (k_eq_v)
    ggml_tensor * bq = nullptr, * bk = nullptr, * bv = nullptr, * bo = nullptr;
    ggml_tensor * q_norm = nullptr, * k_norm = nullptr;
    ggml_tensor * attn_post_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * ffn_gate = nullptr, * ffn_up = nullptr, * ffn_down = nullptr;  // dense FFN (null in pure MoE layers)
    ggml_tensor * ffn_post_norm = nullptr;
    ggml_tensor * out_scale = nullptr;   // {1}: the layer's output times this

    // experts: router {E, n_expert}; experts {E, F, n_expert} / {F, E, n_expert}
    ggml_tensor * ffn_gate_inp = nullptr, * ffn_gate_inp_s = nullptr;
    ggml_tensor * ffn_gate_exps = nullptr, * ffn_up_exps = nullptr, * ffn_gate_up_exps = nullptr;
    ggml_tensor * ffn_down_exps = nullptr, * ffn_down_exps_s = nullptr;  // _s: {n_expert} per-expert output scale
    ggml_tensor * ffn_pre_norm_2 = nullptr, * ffn_post_norm_1 = nullptr, * ffn_post_norm_2 = nullptr;
    // shared expert (qwen-style), gated by sigmoid(gate_inp_shexp · x) when that exists
    ggml_tensor * ffn_gate_shexp = nullptr, * ffn_up_shexp = nullptr, * ffn_down_shexp = nullptr;
    ggml_tensor * ffn_gate_inp_shexp = nullptr;

    // Gemma-4 per-layer embeddings
    ggml_tensor * per_layer_inp_gate = nullptr, * per_layer_proj = nullptr, * per_layer_post_norm = nullptr;

    bool has_kv() const { return wk != nullptr; }
    bool is_moe() const { return ffn_gate_inp != nullptr; }
};

struct target_model {
    target_hparams hp;
    ggml_tensor * tok_embd    = nullptr;  // {E, V}
    ggml_tensor * output_norm = nullptr;  // {E}
    ggml_tensor * output      = nullptr;  // {E, V}; the token embeddings when tied
    ggml_tensor * rope_freqs  = nullptr;  // {n_rot/2} or null
    // Gemma-4 per-layer embeddings: {P·L, V}, {E, P·L}, {P}
    ggml_tensor * per_layer_tok_embd = nullptr, * per_layer_model_proj = nullptr, * per_layer_proj_norm = nullptr;
    std::vector<target_layer> layers;

    // Read hyperparameters and look up (and shape-check) every tensor; no data is loaded.
    void load(dspark_weights & w);

    bool has_swa() const;
    // K (and V) width of each layer's cache; 0 for layers that read another layer's cache.
    std::vector<int64_t> kv_widths() const;
};

bool dspark_is_target_arch(const std::string & arch);

// models/gemma4.cpp
void dspark_load_gemma4(target_model & m, dspark_weights & w);
// The mixture-of-experts tensors of layer il (router, experts, optional shared expert); for
// qwen3moe and gemma4 (whose experts may be fused as gate_up and carry router / expert scales).
void dspark_load_experts(target_model & m, dspark_weights & w, int il, bool gemma_fused_allowed);
