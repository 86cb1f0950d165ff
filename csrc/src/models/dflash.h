// DFlash / DSpark draft models (GGUF arch "dflash").
//
// A draft fuses hidden states captured from its target (fc → RMSNorm) into context K/V cells of
// its own KV cache, then decodes a whole block [anchor, MASK, ...] in one pass. DSpark drafts add
// a Markov head (a low-rank bias on each slot's logits keyed on the previous token, chained by
// argmax) and optionally a confidence head. Reduced-vocab drafts map their logits to the target
// vocabulary through d2t.
//
// Symbols: E = n_embd (= the target's), V = target vocab, Vd = draft vocab, R = Markov rank,
// L = number of target layers fused, D = head dim, H / Hkv = heads, F = FFN width.
#pragma once

#include "dspark-backbone.h"
#include "dspark-weights.h"

#include <string>
#include <vector>

struct target_model;

enum class markov_head { none, vanilla, gated, rnn };

struct dflash_hparams : dspark_backbone {
    int   n_vocab = 0;           // V: ids of the target vocabulary
    int   n_vocab_draft = 0;     // Vd: rows of the lm head (== V unless d2t exists)
    int   block_size = 16;
    std::vector<int32_t> target_layers;
    int   mask_token_id = -1;
    bool  sample_from_anchor = true;  // anchor-first (every slot predicts) or 1+N (slot 0 is the anchor);
                                      // absent key: anchor-first for DSpark, 1+N for DFlash (llama.cpp)
    bool  causal = false;             // block-internal attention
    markov_head markov = markov_head::none;
    int   markov_rank = 0;
    bool  has_confidence = false;
    // DSpark's sequential temperature scaling of the confidence head, one per predicting slot
    // (confidence_j = sigmoid(logit_j / T_j)); empty: T = 1
    std::vector<float> confidence_temperatures;
    float attn_scale = 0.0f;          // 0: 1/sqrt(D)
    float value_scale = 0.0f;         // 0: off
    float embedding_scale = 0.0f;     // 0: off
    float logit_softcap = 0.0f;       // > 0: base logits = c · tanh(logits / c) (Gemma-4 drafts)
    bool  gelu = false;
    int   n_swa = 0;
    std::vector<bool> swa_layers;

    // first block slot that predicts a token, and the most tokens one block can propose
    int first_pred_slot() const { return sample_from_anchor ? 0 : 1; }
    int max_draft() const { return block_size - first_pred_slot(); }
    // one row of fused target features: the captured layers' residual streams side by side
    int32_t feature_width() const { return (int32_t) target_layers.size() * n_embd; }
    bool is_swa(int il) const { return n_swa > 0 && il < (int) swa_layers.size() && swa_layers[il]; }
};

struct dflash_layer {
    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * wq = nullptr, * wk = nullptr, * wv = nullptr, * wo = nullptr;  // wv null: shared KV
    ggml_tensor * wq_s = nullptr, * wk_s = nullptr, * wv_s = nullptr, * wo_s = nullptr;
    ggml_tensor * q_norm = nullptr, * k_norm = nullptr;
    ggml_tensor * post_attn_norm = nullptr, * post_ffw_norm = nullptr, * out_scale = nullptr;
    ggml_tensor * sinks = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * ffn_gate = nullptr, * ffn_up = nullptr, * ffn_down = nullptr;
};

struct dflash_model {
    dflash_hparams hp;
    ggml_tensor * tok_embd = nullptr;    // {E, V}: own or the target's
    ggml_tensor * output = nullptr;      // {E, Vd}: own, own tied embedding, or the target's
    ggml_tensor * output_s = nullptr;
    ggml_tensor * d2t = nullptr;         // I64 {Vd}: absolute target ids
    ggml_tensor * fc = nullptr, * fc_s = nullptr;  // {L·E, E}
    ggml_tensor * enc_norm = nullptr, * output_norm = nullptr, * rope_freqs = nullptr;
    ggml_tensor * markov_w1 = nullptr;   // {R, V}
    ggml_tensor * markov_w2 = nullptr;   // {R, Vd}
    ggml_tensor * markov_w2_s = nullptr;
    ggml_tensor * markov_gate = nullptr, * markov_gate_b = nullptr;    // {E+R, R}, {R}
    ggml_tensor * markov_joint = nullptr, * markov_joint_b = nullptr;  // {2R+E, 3R}, {3R}
    ggml_tensor * conf_w = nullptr, * conf_b = nullptr;               // {E+R, 1}, {1}
    std::vector<dflash_layer> layers;

    // Read hyperparameters and look up every tensor, borrowing embeddings / head from the target
    // when the draft has none; checks that the pair fits together. No data is loaded.
    // sample_from_anchor: -1 = as the file says; layer_offset is added to every target layer id.
    void load(dspark_weights & w, const target_model * target, const std::string & target_path,
              int sample_from_anchor = -1, int layer_offset = 0);
};

std::string dspark_markov_head_name(markov_head h);
