// The forward graph of a target model for one batch.
#pragma once

#include "dspark-graph.h"
#include "dspark-sampler.h"
#include "models/target.h"

#include <vector>

// What attention in sequence order is built for (dspark_graph::attention_in_order): `cells` per
// slot (0: ggml's attention everywhere) in `slots` slots; per_slot > 0 lays the queries out by
// channels, that many per slot (ggml-cuda's form), else by ids; batch_order: by channels, the batch
// already is that layout (each slot's per_slot tokens in a row: one sequence, say), so the queries
// need no gathering. host_too: layers whose cache is in host memory take it too
// (DSPARK_DEVICE_RULES=cuda), not only those on a device.
struct target_in_order_shape {
    int  cells = 0, slots = 0, per_slot = 0;
    bool batch_order = false, host_too = false;

    bool operator==(const target_in_order_shape & o) const {
        return cells == o.cells && slots == o.slots && per_slot == o.per_slot && batch_order == o.batch_order &&
               host_too == o.host_too;
    }
};

// The inputs of attention in sequence order, when the graph has it.
struct target_in_order {
    int64_t       n = 0, n_v = 0, slots = 0;  // cells per slot (0: ggml's attention everywhere), slots
    int64_t       per_slot = 0;               // by channels: query columns per slot, else 0
    bool          host_too = false;
    ggml_tensor * cells_k  = nullptr;         // I32 [n·slots]
    ggml_tensor * cells_v  = nullptr;         // by ids: I32 [n_v·slots]
    ggml_tensor * mask     = nullptr;         // F32 [n, T] (by channels [n, slots·per_slot])
    ggml_tensor * mask_swa = nullptr;         // likewise, the sliding layers' mask
    std::vector<std::pair<int, ggml_tensor *>> heads;  // by ids, per KV head count Hkv of the layers: I32 [H·T]
    ggml_tensor * columns  = nullptr;         // by channels: I32 [slots·per_slot], the token of each query column
    ggml_tensor * rows     = nullptr;         // by channels: I32 [T], the query column of each token

    // The inputs of a layer with n_head_kv KV heads (sliding: its window's mask).
    dspark_in_order_io layer(int n_head_kv, bool sliding) const;
};

struct target_graph {
    // inputs
    ggml_tensor * tokens  = nullptr;  // I32 [T]
    ggml_tensor * pos     = nullptr;  // I32 [T]
    ggml_tensor * kv_idx  = nullptr;  // I64 [T]  cache cell of each token
    ggml_tensor * mask    = nullptr;  // F16 [n_kv, T]
    ggml_tensor * mask_swa = nullptr; // F16 [n_kv, T], the sliding layers' mask (null without them)
    ggml_tensor * out_ids = nullptr;  // I32 [n_outputs], null when every token is an output
    target_in_order in_order;         // a cache on a device: batch-invariant attention
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
    target_in_order_shape in_order;  // attention in sequence order (cells 0: none)
    std::vector<int32_t> capture;
    bool sampled = false;          // the output rows sampled in the graph, by a sampler of this shape
    dspark_sampler_shape sampler;

    bool operator==(const target_graph_key & o) const {
        return n_tokens == o.n_tokens && n_outputs == o.n_outputs && n_kv == o.n_kv &&
               in_order == o.in_order && capture == o.capture &&
               sampled == o.sampled && sampler == o.sampler;
    }
};

// What a layer's graph is built with, handed to the architectures' layer builders.
struct target_layer_io {
    const dspark_graph & g;
    const target_model & m;
    const dspark_kv_cache & kv;
    const target_graph & io;
    int  n_kv;
    bool flash;
    ggml_tensor * layer_inp = nullptr;  // the architecture's per-graph layer input (layer_inputs), or null

    const target_layer & layer(int il) const { return m.layers[il]; }
    // RMSNorm with the model's epsilon; w may be null (no weight).
    ggml_tensor * norm(ggml_tensor * x, ggml_tensor * w) const { return g.rms_norm(x, w, m.hp.rms_eps); }
};

// How an architecture's self-attention differs beyond the tensors its layers have.
struct target_attn_opts {
    float kq_scale = 0.0f;   // attention logits times this; 0: 1/sqrt(head_dim)
    bool  v_norm   = false;  // V RMS-normalised (no weight) before it is cached
};

// Self-attention of layer il on the normed input h [E, T] (projections, optional biases and q/k
// norms, rope, cache write unless the layer shares another's KV, attention, output projection).
ggml_tensor * dspark_target_attention(const target_layer_io & c, int il, ggml_tensor * h,
                                      const target_attn_opts & opts = target_attn_opts());
// The layer's experts on h [E, T], routed by router_in [E, T]; plus the qwen-style shared expert
// when the layer has one. GELU or SiLU gates.
ggml_tensor * dspark_target_moe(const target_layer_io & c, int il, ggml_tensor * h, ggml_tensor * router_in, bool gelu);

// models/llama.cpp: the pre-norm decoder layer that llama, qwen2 and qwen3 share.
ggml_tensor * dspark_llama_layer(const target_layer_io & c, int il, ggml_tensor * x);

// in_order.cells > 0: the layers whose cache is on a device attend in sequence order, over that
// many cells in each of in_order.slots slots (the sums over V over at least 1024).
target_graph build_target_graph(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv,
                                int n_tokens, int n_outputs, int n_kv, const std::vector<int32_t> & capture,
                                bool flash_attn, const dspark_sampler_shape * sampling = nullptr,
                                const target_in_order_shape & in_order = {});
