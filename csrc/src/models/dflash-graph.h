// Graphs of a DFlash / DSpark draft: feature injection into the draft's KV cache, and block
// decoding with the DSpark Markov chain, confidence head and d2t mapping, for many sequences at once.
#pragma once

#include "dspark-graph.h"
#include "dspark-sampler.h"
#include "models/dflash.h"

#include <vector>

// Inject target features as context K/V cells: g = RMSNorm(fc · f); per layer K = rope(k_norm(W_k g)),
// V = W_v g (or the weightless RMSNorm of W_k g when the draft shares K and V).
struct dflash_inject_graph {
    ggml_tensor * feat   = nullptr;  // F32 [L·E, T]
    ggml_tensor * pos    = nullptr;  // I32 [T]
    ggml_tensor * kv_idx = nullptr;  // I64 [T]
};

dflash_inject_graph build_dflash_inject(const dspark_graph & g, const dflash_model & m, const dspark_kv_cache & kv,
                                        int n_rows);

// How drafted tokens are picked from each slot's (biased) logits.
struct dflash_pick {
    // sample: each slot of each block drawn in-graph by its sequence's sampler chain
    // (dspark-sampler.h; input `sampler`, one column per slot), a sampler of this shape; blocks
    // whose sampler is greedy take the argmax. sampler.sample false: argmax drafting.
    dspark_sampler_shape sampler;
    int   markov_top_k = 0;      // > 0 (argmax only): add the Markov bias to each slot's top-k base
                                 // candidates only, instead of the whole vocabulary (vLLM's
                                 // dspark_draft_topk): reads k rows of W2 per slot instead of all
};

// A reduced vocabulary's tables, on the draft's compute device (all null without d2t). The
// full-vocabulary logits are a gather through t2d plus a mask, not a scatter through d2t into a
// filled tensor: on Vulkan that scatter (and a -inf fill feeding the gather) corrupted memory.
struct dflash_vocab_maps {
    ggml_tensor * d2t  = nullptr;  // I32 {1, Vd}: draft id -> target id (a gather of the picks)
    ggml_tensor * t2d  = nullptr;  // I32 {V}: target id -> draft id (0 for ids the draft lacks)
    ggml_tensor * mask = nullptr;  // F32 {V}: 0, or -inf for target ids the draft lacks
};

// Decode n_blocks blocks of B tokens [anchor, MASK, ...] (block-major). Outputs cover the P
// predicting slots of each block (P = B - first_pred_slot), block-major.
struct dflash_block_graph {
    // inputs
    ggml_tensor * tokens   = nullptr;  // I32 [B·n_blocks]
    ggml_tensor * pos      = nullptr;  // I32 [B·n_blocks]
    ggml_tensor * kv_idx   = nullptr;  // I64 [B·n_blocks]
    ggml_tensor * mask     = nullptr;  // F16 [n_kv, B·n_blocks]
    ggml_tensor * mask_swa = nullptr;  // F16 [n_kv, B·n_blocks], sliding-window layers only
    ggml_tensor * sampler  = nullptr;  // F32 [DSPARK_SAMPLER_N_INPUTS, P·n_blocks] when sampling: each slot's
                                       // sampler inputs (its block's sampler, its own uniform), block-major
    // outputs
    std::vector<ggml_tensor *> tokens_out;  // per predicting slot: I32 [n_blocks], target ids
    std::vector<ggml_tensor *> conf_out;    // per predicting slot: F32 [1, n_blocks] (confidence head)
    std::vector<ggml_tensor *> prob_out;    // as tokens_out when sampling: F32 [1, ...] probability of each
                                            // drafted token under the distribution it was drawn from
    ggml_tensor * logits = nullptr;         // F32 [V, P·n_blocks] when asked for (full vocabulary; when
                                            // sampling, as the samplers' filters left them)
};

dflash_block_graph build_dflash_block(const dspark_graph & g, const dflash_model & m, const dspark_kv_cache & kv,
                                      const dflash_vocab_maps & maps, int n_blocks, int block_len, int n_kv, bool flash,
                                      bool want_logits, const dflash_pick & pick);
