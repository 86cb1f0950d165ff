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
    ggml_tensor * out_ids = nullptr;  // I32 [n_outputs], null when every token is an output
    // outputs
    ggml_tensor * logits   = nullptr; // [V, n_outputs]
    ggml_tensor * captured = nullptr; // [len(capture)·E, T]: residual stream entering each layer id
    // in-graph sampling (backend sampling)
    ggml_tensor * uniforms = nullptr;        // F32 [1, n_outputs]
    std::vector<ggml_tensor *> sampled;      // I32 per sampling group, in output-row order
};

// Output rows [begin, begin+count) sampled in-graph with one set of parameters.
struct target_sampling_group {
    int begin = 0, count = 0;
    dspark_sampler_params params;
};

target_graph build_target_graph(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv,
                                int n_tokens, int n_outputs, int n_kv, const std::vector<int32_t> & capture,
                                bool flash_attn, const std::vector<target_sampling_group> * sampling = nullptr);
