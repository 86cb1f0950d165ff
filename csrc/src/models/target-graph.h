// The forward graph of a target model for one batch.
#pragma once

#include "dspark-graph.h"
#include "dspark-sampler.h"
#include "models/target.h"

#include <vector>

struct target_graph {
    // inputs
    ggml_tensor * tokens  = nullptr;  // I32 [T]
    ggml_tensor * pos     = nullptr;  // I32 [T]
    ggml_tensor * kv_idx  = nullptr;  // I64 [T]  cache cell of each token
    ggml_tensor * mask    = nullptr;  // F16 [n_kv, T]
    ggml_tensor * mask_swa = nullptr; // F16 [n_kv, T], the sliding layers' mask (null without them)
    ggml_tensor * out_ids = nullptr;  // I32 [n_outputs], null when every token is an output
    // outputs
    ggml_tensor * logits   = nullptr; // [V, n_outputs]
    ggml_tensor * captured = nullptr; // [len(capture)·E, T]: residual stream entering each layer id
    // in-graph sampling (backend sampling): every output row, each with its own sampler
    dspark_sampler_graph sampler;
};

// What a target graph is built for: a graph built for one key runs every batch of that key (only
// its inputs change), so consecutive decode steps and verify batches of one size reuse it.
struct target_graph_key {
    int n_tokens = 0, n_outputs = 0, n_kv = 0;
    std::vector<int32_t> capture;
    bool sampled = false;          // the output rows sampled in the graph, by a sampler of this shape
    dspark_sampler_shape sampler;

    bool operator==(const target_graph_key & o) const {
        return n_tokens == o.n_tokens && n_outputs == o.n_outputs && n_kv == o.n_kv && capture == o.capture &&
               sampled == o.sampled && sampler == o.sampler;
    }
};

// The pieces of one layer's graph, shared by the architectures' layer builders.
struct target_layer_io {
    const dspark_graph & g;
    const target_model & m;
    const dspark_kv_cache & kv;
    const target_graph & io;
    int  n_kv;
    bool flash;
};

// Self-attention of layer il on the normed input h [E, T] (projections, optional q/k norms, rope,
// cache write unless the layer shares another's KV, attention, output projection).
ggml_tensor * dspark_target_attention(const target_layer_io & c, int il, ggml_tensor * h);
// The layer's FFN on h [E, T]: dense SwiGLU/GELU, experts, or both (qwen-style shared expert).
ggml_tensor * dspark_target_moe(const target_layer_io & c, int il, ggml_tensor * h, ggml_tensor * router_in, bool gelu);

// models/gemma4-graph.cpp: the per-layer embedding inputs [P, T, L] of tokens whose scaled
// embeddings are x [E, T]; one Gemma-4 decoder layer.
ggml_tensor * dspark_gemma4_per_layer_inputs(const dspark_graph & g, const target_model & m, ggml_tensor * tokens, ggml_tensor * x);
ggml_tensor * dspark_gemma4_layer(const target_layer_io & c, int il, ggml_tensor * x, ggml_tensor * per_layer_inp);

target_graph build_target_graph(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv,
                                int n_tokens, int n_outputs, int n_kv, const std::vector<int32_t> & capture,
                                bool flash_attn, const dspark_sampler_shape * sampling = nullptr);
