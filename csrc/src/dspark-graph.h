// Shared graph builders: the pieces every transformer in this project is made of, written so the
// model files read like the math. Shapes use ggml order, fastest dimension first:
//   E = embedding width, T = tokens in the batch, D = head dim, H / Hkv = query / KV heads,
//   n_kv = cache cells attention looks at.
#pragma once

#include <map>

#include "dspark-kv-cache.h"
#include "dspark-rope.h"

#include "ggml.h"

// One mixture-of-experts FFN: expert tensors {E, F, X} (gate, up; or gate_up {E, 2F, X} with gate
// first) and {F, E, X} (down); `expert_scale` {X} multiplies each expert's output (may be null).
struct dspark_moe {
    ggml_tensor * gate = nullptr, * up = nullptr, * gate_up = nullptr, * down = nullptr;
    ggml_tensor * expert_scale = nullptr;
    int   n_used = 1;         // experts per token (top-k)
    bool  renorm = true;      // the top-k probabilities renormalised to sum to 1
    float scale  = 1.0f;      // all weights times this
    bool  gelu   = false;     // GELU (tanh) gate, else SiLU
};

// The inputs of dspark_graph::attention_in_order for S sequence slots (filled by
// dspark_kv_cache::fill_in_order_cells / _mask). Two forms, by the device's kernels:
//   by ids       (per_slot 0) single-column products as ggml_mul_mat_id over one token, one "expert"
//                per (slot, KV head): ggml-vulkan's matrix-vector shaders.
//   by channels  (per_slot R > 0) the queries laid out R per slot, and products as matmuls of one
//                column per channel, the cells broadcast over a slot's queries and heads: ggml-cuda's
//                one-column kernel (mmvf), whose mul_mat_id would sort a row that repeats an id; the
//                softmax is ggml's, over n = n_v cells (whole blocks of 512, at least 1024).
struct dspark_in_order_io {
    int64_t       n = 0, n_v = 0;       // cells per slot of the scores, of the sums over V (n_v >= n)
    int64_t       per_slot = 0;         // by channels: query columns per slot (R), else 0
    ggml_tensor * cells_k = nullptr;    // I32 [n·S]: each slot's cells in position order
    ggml_tensor * cells_v = nullptr;    // by ids: I32 [n_v·S]
    ggml_tensor * mask    = nullptr;    // F32 [n, T] (by channels: [n, S·R], a row per query column)
    ggml_tensor * heads   = nullptr;    // by ids: I32 [H·T], the (slot, KV head) of each query head, slot·Hkv + h / (H / Hkv)
    ggml_tensor * columns = nullptr;    // by channels: I32 [S·R], the token in query column slot·R + r
    ggml_tensor * rows    = nullptr;    // by channels: I32 [T], the query column of each token
                                        // (both null: the batch is in that layout already)
};

struct dspark_graph {
    ggml_context * ctx;
    ggml_cgraph *  gf;
    // Pad odd column counts (> 1) of matmul inputs to even: the CPU's tiled matmul (llamafile
    // sgemm) is measurably faster on 2k columns than on 2k-1, so the padding column is free.
    bool pad_odd_columns = false;
    // Inputs already quantized for the blocks matmuls (dspark-matmul.h), by input tensor and the
    // buffer type of the weights (the node runs where they are).
    mutable std::map<std::pair<const ggml_tensor *, const void *>, ggml_tensor *> blocks_columns;

    // x / sqrt(mean(x^2) + eps) * w, over the first dimension; w may be null (no weight).
    ggml_tensor * rms_norm(ggml_tensor * x, ggml_tensor * w, float eps) const;

    // w · x, then times the optional one-element tensor `scale` (per-tensor scales of some GGUFs).
    // On the CPU each column comes out as it would alone (the routes of dspark-matmul.h).
    ggml_tensor * mm(ggml_tensor * w, ggml_tensor * x, ggml_tensor * scale = nullptr) const;

    // ggml_mul_mat_id (experts [E, F, X], x [E, B, T], ids I32 [K, T]), batch-invariant the same way.
    ggml_tensor * mm_id(ggml_tensor * experts, ggml_tensor * x, ggml_tensor * ids) const;

    // x + b when b is given.
    ggml_tensor * add(ggml_tensor * x, ggml_tensor * b) const;

    // Rotary embedding of x [D, heads, T] at positions pos [T] (I32).
    ggml_tensor * rope(ggml_tensor * x, ggml_tensor * pos, const dspark_rope & r, ggml_tensor * freq_factors) const;

    // Write k [D, Hkv, T] and v into the cache rows kv_idx [T] (I64) of layer il.
    void store_kv(const dspark_kv_cache & kv, int il, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kv_idx) const;

    // softmax(scale · q·kᵀ + mask) · v over the first n_kv cache cells of layer il; q [D, H, T],
    // mask [n_kv, T] (F16). Returns [D·H, T]. `sinks` [H] adds per-head sink logits (may be null).
    ggml_tensor * attention(const dspark_kv_cache & kv, int il, ggml_tensor * q, ggml_tensor * mask, int n_kv,
                            int head_dim, int n_head_kv, float scale, bool flash, ggml_tensor * sinks = nullptr) const;

    // The same attention for a cache on a device, computed so that a row's value depends only on
    // its own sequence (dspark-graph.cpp): every query attends to its sequence's cells gathered in
    // position order, through single-column products.
    ggml_tensor * attention_in_order(const dspark_kv_cache & kv, int il, ggml_tensor * q, const dspark_in_order_io & io,
                                     int head_dim, int n_head_kv, float scale) const;
    ggml_tensor * in_order_by_ids(const dspark_kv_cache & kv, int il, ggml_tensor * q, const dspark_in_order_io & io,
                                  int head_dim, int n_head_kv, float scale) const;
    ggml_tensor * in_order_by_channels(const dspark_kv_cache & kv, int il, ggml_tensor * q, const dspark_in_order_io & io,
                                       int head_dim, int n_head_kv, float scale) const;

    // down · (act(gate · x) ⊙ (up · x)), act = SiLU or GELU (tanh approximation).
    ggml_tensor * ffn(ggml_tensor * x, ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down, bool gelu) const;

    // sum over the top-k experts e of p_e · expert_e(x), p = softmax(router_logits [X, T]) (renormalised
    // over the chosen k when e.renorm); x [E, T]. Experts run through ggml_mul_mat_id.
    ggml_tensor * moe_ffn(ggml_tensor * x, ggml_tensor * router_logits, const dspark_moe & e) const;

    void expand(ggml_tensor * t) const { ggml_build_forward_expand(gf, t); }
};

// An input tensor of the graph (filled on the host after allocation): 1-D [ne0] when ne1 is 0,
// else 2-D [ne0, ne1].
ggml_tensor * dspark_graph_input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, const char * name);

// Per-column gather: out[i, c] = src[idx[i, c], c]; src [n, r] (F32 or I32), idx I32 [m, r].
ggml_tensor * dspark_gather_cols(ggml_context * ctx, ggml_tensor * src, ggml_tensor * idx);

// Whether a KV cache tensor lives in host memory (attention there runs on the CPU).
bool dspark_graph_cache_on_host(const ggml_tensor * cache);

// Fill an input after allocation; an input no node uses got no memory and is skipped.
void dspark_set_input(ggml_tensor * t, const void * data, size_t nbytes);
