// Target LLMs: the decoder-only transformers that verify draft blocks. These structs hold what the
// architectures share; each architecture's own file (models/<arch>.cpp, registered in
// models/target-arch.cpp) fills them and says how a layer computes:
//
//   arch      file          rope     q/k norm   q/k/v bias   FFN
//   llama     llama.cpp     normal   no         no           SwiGLU    (optional rope_freqs per-pair factors)
//   qwen2     qwen2.cpp     NEOX     no         yes          SwiGLU
//   qwen3     qwen3.cpp     NEOX     yes        no           SwiGLU
//   qwen3moe  qwen3moe.cpp  NEOX     yes        no           top-k of SwiGLU experts (+ optional shared expert)
//   gemma3    gemma3.cpp    NEOX     yes        no           GELU, sandwich norms, sliding-window and global
//                                                            layers with their own rope base
//   gemma4    gemma4.cpp    NEOX     yes        no           GELU, sandwich norms, optional experts next to the
//                                                            dense FFN, sliding-window and global layers with
//                                                            their own head size, KV heads and rope
#pragma once

#include "dspark-backbone.h"
#include "dspark-weights.h"
#include "models/target-arch.h"

#include <memory>
#include <string>
#include <vector>

struct target_hparams : dspark_backbone {
    int   n_vocab = 0;
    float embd_scale    = 1.0f;     // token embeddings times this (e.g. sqrt(n_embd))
    float logit_softcap = 0.0f;     // > 0: logits = c · tanh(logits / c)
    int   n_swa = 0;                // sliding window of the sliding layers (0: none)
    // mixture of experts
    int   n_expert = 0, n_expert_used = 0;
    bool  expert_weights_norm = true;   // renormalise the top-k router probabilities
    float expert_weights_scale = 1.0f;
};

struct target_layer {
    // geometry: per layer, since some architectures mix sliding and global layers
    int  head_dim = 0, n_head_kv = 0;
    bool swa    = false;            // sliding-window layer: masked to the last n_swa positions
    int  kv_src = -1;               // the layer whose K/V this layer attends to (itself unless shared)
    dspark_rope   rope;
    ggml_tensor * rope_freqs = nullptr;  // {n_rot/2} per-pair divisors, or null

    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * wq = nullptr, * wk = nullptr, * wv = nullptr, * wo = nullptr;  // wv null: V = K
    ggml_tensor * bq = nullptr, * bk = nullptr, * bv = nullptr, * bo = nullptr;
    ggml_tensor * q_norm = nullptr, * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * ffn_gate = nullptr, * ffn_up = nullptr, * ffn_down = nullptr;  // dense FFN (null in pure MoE layers)

    // experts: router {E, n_expert}; experts {E, F, n_expert} (or gate_up {E, 2F, n_expert}) / {F, E, n_expert}
    ggml_tensor * ffn_gate_inp = nullptr;
    ggml_tensor * ffn_gate_exps = nullptr, * ffn_up_exps = nullptr, * ffn_gate_up_exps = nullptr;
    ggml_tensor * ffn_down_exps = nullptr, * ffn_down_exps_s = nullptr;  // _s: {n_expert} per-expert output scale
    // shared expert (qwen-style), gated by sigmoid(gate_inp_shexp · x) when that exists
    ggml_tensor * ffn_gate_shexp = nullptr, * ffn_up_shexp = nullptr, * ffn_down_shexp = nullptr;
    ggml_tensor * ffn_gate_inp_shexp = nullptr;

    bool has_kv() const { return wk != nullptr; }
    bool is_moe() const { return ffn_gate_inp != nullptr; }
};

// What only one architecture has (values, tensors), defined and read by that architecture's file.
struct target_arch_data {
    virtual ~target_arch_data() = default;
};

struct target_model {
    const target_arch_info * arch = nullptr;  // the registry row: name, loader, layer graph
    target_hparams hp;
    ggml_tensor * tok_embd    = nullptr;  // {E, V}
    ggml_tensor * output_norm = nullptr;  // {E}
    ggml_tensor * output      = nullptr;  // {E, V}; the token embeddings when tied
    ggml_tensor * rope_freqs  = nullptr;  // {n_rot/2} or null
    std::vector<target_layer> layers;
    std::unique_ptr<target_arch_data> arch_data;  // null unless the architecture has some
    // tensors read by row lookups (embedding tables): they keep the plain layout
    std::vector<std::string> lookup_tables = {"token_embd.weight"};

    // Read hyperparameters and look up (and shape-check) every tensor; no data is loaded.
    void load(dspark_weights & w);

    bool has_swa() const;
    // K (and V) width of each layer's cache; 0 for layers that read another layer's cache.
    std::vector<int64_t> kv_widths() const;
};

// Pieces the architectures' loaders share (models/target.cpp).

// "blk.{il}.{t}"
std::string dspark_target_tensor_name(int il, const char * t);
// Every layer alike: the backbone's head size, KV heads and rope (with rope_freqs.weight when
// present), each attending to its own cache; per-layer arrays of head_count_kv or
// feed_forward_length are refused.
void dspark_target_uniform_layers(target_model & m, dspark_weights & w);
// A pre-norm layer's attention: attn_norm, q/k/v/output projections, the optional output bias,
// required q/k/v biases (qkv_bias) and per-head q/k norms (qk_norm).
void dspark_target_load_attention(target_model & m, dspark_weights & w, int il, bool qkv_bias, bool qk_norm);
// ffn_norm and the dense gate / up / down projections of width F.
void dspark_target_load_ffn(target_model & m, dspark_weights & w, int il, int64_t F);
// expert_count and expert_used_count, checked against each other.
void dspark_target_load_expert_counts(target_model & m, const dspark_gguf & f);
// Router and experts of layer il (their width from the tensors, checked against the key when
// there is one); experts fused as gate_up are accepted when fused_gate_up.
void dspark_target_load_experts(target_model & m, dspark_weights & w, int il, bool fused_gate_up);
// The shared expert of layer il, when the file has one (width from its tensors).
void dspark_target_load_shared_expert(target_model & m, dspark_weights & w, int il);
// Gemma's scalars around the layers: token embeddings times sqrt(E), and final_logit_softcapping
// (0 when absent) checked finite and non-negative.
void dspark_target_load_gemma_scales(target_model & m, const dspark_gguf & f);

// models/llama.cpp: the layers of llama and of the architectures that only add tensors to them.
void dspark_load_llama_layers(target_model & m, dspark_weights & w, bool qkv_bias, bool qk_norm);
