#include "dspark-graph.h"

#include "dspark-attention.h"
#include "dspark-matmul.h"

#include "ggml-backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

ggml_tensor * dspark_graph_input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, const char * name) {
    ggml_tensor * t = ne1 > 0 ? ggml_new_tensor_2d(ctx, type, ne0, ne1) : ggml_new_tensor_1d(ctx, type, ne0);
    ggml_set_input(t);
    if (name) {
        ggml_set_name(t, name);
    }
    return t;
}

ggml_tensor * dspark_gather_cols(ggml_context * ctx, ggml_tensor * src, ggml_tensor * idx) {
    ggml_tensor * s3 = ggml_reshape_3d(ctx, src, 1, src->ne[0], src->ne[1]);  // rows of one value
    ggml_tensor * out = ggml_get_rows(ctx, s3, idx);                           // [1, m, r]
    return ggml_reshape_2d(ctx, out, idx->ne[0], idx->ne[1]);
}

void dspark_set_input(ggml_tensor * t, const void * data, size_t nbytes) {
    if (t && t->buffer) {
        ggml_backend_tensor_set(t, data, 0, nbytes);
    }
}

ggml_tensor * dspark_graph::rms_norm(ggml_tensor * x, ggml_tensor * w, float eps) const {
    ggml_tensor * y = ggml_rms_norm(ctx, x, eps);
    return w ? ggml_mul(ctx, y, w) : y;
}

ggml_tensor * dspark_graph::mm(ggml_tensor * w, ggml_tensor * x, ggml_tensor * scale) const {
    const int64_t n = x->ne[1];
    const bool plain_2d = x->ne[2] == 1 && x->ne[3] == 1 && ggml_n_dims(w) <= 2;
    dspark_mm_plan plan = ggml_n_dims(w) <= 2 ? dspark_matmul_plan_of(w) : dspark_mm_plan{};
    if (plan.route == dspark_mm_route::channels) {
        ggml_tensor * y = dspark_matmul_channels(ctx, w, x, plan);  // CUDA: the same columns per channel in any batch
        return scale ? ggml_mul(ctx, y, scale) : y;
    }
    if (!plain_2d && (plan.route == dspark_mm_route::quads || plan.route == dspark_mm_route::blocks)) {
        // a repacked (or packed) weight computes any batch exactly only through its plan: as one 2-D batch
        ggml_tensor * x2 = ggml_reshape_2d(ctx, ggml_cont(ctx, x), x->ne[0], ggml_nelements(x) / x->ne[0]);
        ggml_tensor * y2 = plan.route == dspark_mm_route::quads ? dspark_matmul_quads(ctx, w, x2)
                                                                : dspark_matmul_blocks(ctx, w, dspark_matmul_blocks_columns(ctx, x2, w));
        ggml_tensor * y = ggml_reshape_4d(ctx, y2, w->ne[1], x->ne[1], x->ne[2], x->ne[3]);
        return scale ? ggml_mul(ctx, y, scale) : y;
    }
    if (!plain_2d) {
        plan = {};  // the other plans take 2-D batches: ggml's matmul as it is
    }
    ggml_tensor * y;
    if (plan.route == dspark_mm_route::groups) {
        y = dspark_matmul_groups(ctx, w, x, plan);  // a device: batches split into groups it computes exactly
    } else if (plan.route == dspark_mm_route::quads) {
        y = dspark_matmul_quads(ctx, w, x);  // repacked: ggml's gemm on fours, ours on the rest
    } else if (plan.route == dspark_mm_route::blocks) {
        // q, k, v (and gate, up) multiply the same input: quantize its columns once
        ggml_tensor *& columns = blocks_columns[{x, w->buffer ? ggml_backend_buffer_get_type(w->buffer) : nullptr}];
        if (!columns) {
            columns = dspark_matmul_blocks_columns(ctx, ggml_is_contiguous(x) ? x : ggml_cont(ctx, x), w);
        }
        y = dspark_matmul_blocks(ctx, w, columns);
    } else if (plan.route == dspark_mm_route::rows || (plan.route == dspark_mm_route::own && n < plan.own_below)) {
        y = dspark_matmul_node(ctx, w, ggml_is_contiguous(x) ? x : ggml_cont(ctx, x), plan.route);
    } else if (pad_odd_columns && n > 1 && n % 2 == 1 && plain_2d && ggml_is_contiguous(x) &&
               ggml_nelements(w) >= (1 << 20)) {
        // llamafile's sgemm is measurably faster on 2k columns than on 2k-1, so the padding
        // column is free (only worth its copy for large weights)
        y = ggml_mul_mat(ctx, w, ggml_pad(ctx, x, 0, 1, 0, 0));       // [out, n+1]
        y = ggml_view_2d(ctx, y, y->ne[0], n, y->nb[1], 0);            // the real columns
    } else {
        y = ggml_mul_mat(ctx, w, x);
    }
    return scale ? ggml_mul(ctx, y, scale) : y;
}

ggml_tensor * dspark_graph::mm_id(ggml_tensor * experts, ggml_tensor * x, ggml_tensor * ids) const {
    const dspark_mm_plan plan = dspark_matmul_plan_of(experts, true);
    if (plan.route == dspark_mm_route::groups) {
        return dspark_matmul_id_groups(ctx, experts, x, ids, plan);  // a device: tokens in groups, likewise
    }
    if (plan.route == dspark_mm_route::channels) {
        return dspark_matmul_id_channels(ctx, experts, x, ids);  // CUDA: each (token, expert) one channel
    }
    if (plan.route != dspark_mm_route::ggml) {
        // ggml picks a kernel per expert by how many rows chose it: one row at a time instead, or a
        // kernel that any number of columns leaves alone (blocks; own where it runs every batch, as
        // bf16 on AMX tiles does) on each expert's columns
        const bool own_every_batch = plan.route == dspark_mm_route::own && plan.own_below == INT64_MAX;
        const dspark_mm_route route = plan.route == dspark_mm_route::blocks || own_every_batch ? plan.route : dspark_mm_route::rows;
        return dspark_matmul_id_rows(ctx, experts, ggml_is_contiguous(x) ? x : ggml_cont(ctx, x), ids, route);
    }
    return ggml_mul_mat_id(ctx, experts, x, ids);
}

ggml_tensor * dspark_graph::add(ggml_tensor * x, ggml_tensor * b) const {
    return b ? ggml_add(ctx, x, b) : x;
}

ggml_tensor * dspark_graph::rope(ggml_tensor * x, ggml_tensor * pos, const dspark_rope & r, ggml_tensor * freq_factors) const {
    return ggml_rope_ext(ctx, x, pos, freq_factors, r.n_rot, r.mode, r.n_ctx_orig, r.freq_base, r.freq_scale,
                         r.ext_factor, r.attn_factor, r.beta_fast, r.beta_slow);
}

void dspark_graph::store_kv(const dspark_kv_cache & kv, int il, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kv_idx) const {
    const int64_t T = k->ne[2];
    ggml_tensor * k2 = ggml_reshape_2d(ctx, k, k->ne[0] * k->ne[1], T);  // [D·Hkv, T]
    ggml_tensor * v2 = ggml_reshape_2d(ctx, v, v->ne[0] * v->ne[1], T);
    // The attention reads the cache after these writes: expanding them first fixes the order.
    expand(ggml_set_rows(ctx, kv.k[il], k2, kv_idx));
    expand(ggml_set_rows(ctx, kv.v[il], v2, kv_idx));
}

bool dspark_graph_cache_on_host(const ggml_tensor * cache) {
    return cache->buffer && ggml_backend_buffer_is_host(cache->buffer);
}

// A cache in host memory is read by the CPU: there our attention node replaces ggml's flash
// attention (see dspark-attention.h), unless DSPARK_CPU_ATTENTION=ggml asks for ggml's.
static bool own_cpu_attention(const ggml_tensor * cache) {
    static const bool off = getenv("DSPARK_CPU_ATTENTION") && strcmp(getenv("DSPARK_CPU_ATTENTION"), "ggml") == 0;
    return !off && dspark_graph_cache_on_host(cache);
}

ggml_tensor * dspark_graph::attention(const dspark_kv_cache & kv, int il, ggml_tensor * q, ggml_tensor * mask, int n_kv,
                                      int head_dim, int n_head_kv, float scale, bool flash, ggml_tensor * sinks) const {
    const int64_t H = q->ne[1], T = q->ne[2];
    ggml_tensor * kc = kv.k[il];
    ggml_tensor * vc = kv.v[il];
    // cache rows are cells; view them as [D, Hkv, n_kv] and put heads last: [D, n_kv, Hkv]
    ggml_tensor * k = ggml_view_3d(ctx, kc, head_dim, n_head_kv, n_kv, ggml_row_size(kc->type, head_dim), kc->nb[1], 0);
    ggml_tensor * v = ggml_view_3d(ctx, vc, head_dim, n_head_kv, n_kv, ggml_row_size(vc->type, head_dim), vc->nb[1], 0);
    k = ggml_permute(ctx, k, 0, 2, 1, 3);
    v = ggml_permute(ctx, v, 0, 2, 1, 3);
    ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);  // [D, T, H]

    ggml_tensor * out;
    if (flash && !sinks && q->type == GGML_TYPE_F32 && own_cpu_attention(kc) && dspark_attention_cpu_supports(k, v, mask)) {
        out = dspark_attention_cpu(ctx, q, k, v, mask, scale);  // [D, H, T]
    } else if (flash) {
        out = ggml_flash_attn_ext(ctx, qp, k, v, mask, scale, 0.0f, 0.0f);  // [D, H, T]
        if (sinks) {
            ggml_flash_attn_ext_add_sinks(out, sinks);
        }
    } else {
        ggml_tensor * kq = ggml_mul_mat(ctx, k, qp);  // [n_kv, T, H]
        kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
        if (sinks) {
            ggml_soft_max_add_sinks(kq, sinks);
        }
        ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, v, 1, 0, 2, 3));  // [n_kv, D, Hkv]
        out = ggml_mul_mat(ctx, vt, kq);                                    // [D, T, H]
        out = ggml_permute(ctx, out, 0, 2, 1, 3);                           // [D, H, T]
        out = ggml_cont(ctx, out);
    }
    return ggml_reshape_2d(ctx, out, head_dim * H, T);
}

// Why not ggml's flash attention on a device: ggml-vulkan splits the cells into parts whose number
// follows the batch's shape and the device's core count, and its softmax and matrix-vector shaders
// change workgroup size with the row length; ggml-cuda picks its kernel by the number of queries and
// splits the cells by the grid it fills. So a verify row and the decode step it replaces add in other
// orders. Here each product is a single column (a matrix-vector kernel, which computes each column
// alone), the reductions run over a row in an order fixed by the row's index (the max is exact), and a
// sequence's cells are gathered in position order, so another sequence's cells, where they lie in
// the cache and how long the padded rows are do not enter a row's arithmetic: padding adds exact
// zeros (exp(-inf) = 0 times finite values). The sums over V run over at least 1024 cells (io.n_v):
// ggml-vulkan picks that shader's workgroup size by the length of its rows on some vendors,
// switching at 1024, and ggml-cuda's mmvf by it (its 256-thread block from 512 values on, on whole
// blocks of 512: it takes the block that needs the fewest passes, smallest first, 224 at 1280).
ggml_tensor * dspark_graph::attention_in_order(const dspark_kv_cache & kv, int il, ggml_tensor * q,
                                               const dspark_in_order_io & io, int head_dim, int n_head_kv,
                                               float scale) const {
    return io.per_slot > 0 ? in_order_by_channels(kv, il, q, io, head_dim, n_head_kv, scale)
                           : in_order_by_ids(kv, il, q, io, head_dim, n_head_kv, scale);
}

// Each slot's cells in position order: K [D, n, Hkv, S] and Vᵀ [n_v, D, Hkv, S].
static ggml_tensor * cells_in_order(ggml_context * ctx, ggml_tensor * cache, ggml_tensor * cells, int64_t D, int64_t Hkv,
                                    int64_t n, bool transposed) {
    const int64_t S = cells->ne[0] / n;
    ggml_tensor * c = ggml_reshape_4d(ctx, ggml_get_rows(ctx, cache, cells), D, Hkv, n, S);  // [D·Hkv, n·S] as 4-D
    return ggml_cont(ctx, transposed ? ggml_permute(ctx, c, 1, 2, 0, 3) : ggml_permute(ctx, c, 0, 2, 1, 3));
}

// ggml-vulkan's form: every query head of every token is one column of "token" 0 of a mul_mat_id
// whose experts are the (slot, KV head) matrices.
ggml_tensor * dspark_graph::in_order_by_ids(const dspark_kv_cache & kv, int il, ggml_tensor * q,
                                            const dspark_in_order_io & io, int head_dim, int n_head_kv,
                                            float scale) const {
    const int64_t D = head_dim, Hkv = n_head_kv, H = q->ne[1], T = q->ne[2], n = io.n, n_v = io.n_v;
    const int64_t S = io.cells_k->ne[0] / n;
    ggml_tensor * k = ggml_reshape_3d(ctx, cells_in_order(ctx, kv.k[il], io.cells_k, D, Hkv, n, false), D, n, Hkv * S);
    ggml_tensor * v = ggml_reshape_3d(ctx, cells_in_order(ctx, kv.v[il], io.cells_v, D, Hkv, n_v, true), n_v, D, Hkv * S);

    // scores [n, H·T, 1]
    ggml_tensor * s = ggml_mul_mat_id(ctx, k, ggml_reshape_3d(ctx, q, D, H * T, 1), io.heads);
    ggml_set_name(s, "in_order_scores");
    s = ggml_add(ctx, ggml_scale(ctx, ggml_reshape_3d(ctx, s, n, H, T), scale), ggml_reshape_3d(ctx, io.mask, n, 1, T));
    ggml_tensor * m = ggml_pool_2d(ctx, s, GGML_OP_POOL_MAX, (int) n, 1, (int) n, 1, 0.0f, 0.0f);  // [1, H, T]
    ggml_tensor * e = ggml_exp(ctx, ggml_sub(ctx, s, m));                                         // [n, H, T]
    ggml_tensor * e_v = n_v > n ? ggml_pad(ctx, e, (int) (n_v - n), 0, 0, 0) : e;                 // [n_v, H, T]
    ggml_tensor * o = ggml_mul_mat_id(ctx, v, ggml_reshape_3d(ctx, e_v, n_v, H * T, 1), io.heads); // [D, H·T, 1]
    ggml_set_name(o, "in_order_sums_v");
    o = ggml_div(ctx, ggml_reshape_3d(ctx, o, D, H, T), ggml_sum_rows(ctx, e));
    return ggml_reshape_2d(ctx, o, D * H, T);
}

// ggml-cuda's form: the queries in columns slot·R + r, each product a matmul of one column per
// channel (head) and sample (query column), K and V broadcast over a slot's heads and queries (mmvf,
// whose block follows the row length alone), and the softmax ggml's: with rows of at least 1024
// cells its block is always 1024 threads, each adding its cells in order, so the cells past a
// sequence (masked, exp 0) add exact zeros. Scores and sums run over the same n cells (io.n_v = n).
ggml_tensor * dspark_graph::in_order_by_channels(const dspark_kv_cache & kv, int il, ggml_tensor * q,
                                                 const dspark_in_order_io & io, int head_dim, int n_head_kv,
                                                 float scale) const {
    const int64_t D = head_dim, Hkv = n_head_kv, H = q->ne[1], T = q->ne[2], n = io.n;
    const int64_t C = io.columns ? io.columns->ne[0] : T;  // S·R query columns
    ggml_tensor * k = cells_in_order(ctx, kv.k[il], io.cells_k, D, Hkv, n, false);   // [D, n, Hkv, S]
    ggml_tensor * v = cells_in_order(ctx, kv.v[il], io.cells_k, D, Hkv, n, true);    // [n, D, Hkv, S]
    q = ggml_reshape_2d(ctx, ggml_is_contiguous(q) ? q : ggml_cont(ctx, q), D * H, T);
    ggml_tensor * qc = ggml_reshape_4d(ctx, io.columns ? ggml_get_rows(ctx, q, io.columns) : q, D, 1, H, C);

    ggml_tensor * s = ggml_mul_mat(ctx, k, qc);                                          // [n, 1, H, S·R]
    ggml_tensor * p = ggml_soft_max_ext(ctx, s, ggml_reshape_4d(ctx, io.mask, n, 1, 1, C), scale, 0.0f);
    ggml_tensor * o = ggml_reshape_2d(ctx, ggml_mul_mat(ctx, v, p), D * H, C);            // [D·H, S·R]
    return io.rows ? ggml_get_rows(ctx, o, io.rows) : o;                                 // [D·H, T]
}

ggml_tensor * dspark_graph::ffn(ggml_tensor * x, ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down, bool gelu) const {
    ggml_tensor * g = mm(gate, x);
    ggml_tensor * u = mm(up, x);
    ggml_tensor * h = gelu ? ggml_geglu_split(ctx, g, u) : ggml_swiglu_split(ctx, g, u);
    return mm(down, h);
}

ggml_tensor * dspark_graph::moe_ffn(ggml_tensor * x, ggml_tensor * router_logits, const dspark_moe & e) const {
    const int64_t X = router_logits->ne[0], T = router_logits->ne[1], K = e.n_used, E = x->ne[0];
    ggml_tensor * probs = ggml_soft_max(ctx, router_logits);                              // [X, T]
    ggml_tensor * chosen = ggml_argsort_top_k(ctx, probs, (int) K);                       // I32 [K, T]
    ggml_tensor * w = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, X, T), chosen);   // [1, K, T]
    if (e.renorm) {
        ggml_tensor * w2 = ggml_reshape_2d(ctx, w, K, T);
        // the clamp keeps a row of underflowed probabilities finite (it cannot sum to 0 otherwise)
        ggml_tensor * sum = ggml_clamp(ctx, ggml_sum_rows(ctx, w2), 6.103515625e-5f, INFINITY);  // [1, T]
        w = ggml_reshape_3d(ctx, ggml_div(ctx, w2, sum), 1, K, T);
    }
    if (e.scale != 1.0f) {
        w = ggml_scale(ctx, w, e.scale);
    }
    if (e.expert_scale) {
        ggml_tensor * ids = ggml_reshape_1d(ctx, ggml_cont(ctx, chosen), K * T);
        ggml_tensor * s = ggml_get_rows(ctx, ggml_reshape_2d(ctx, e.expert_scale, 1, X), ids);  // [1, K·T]
        w = ggml_mul(ctx, w, ggml_reshape_3d(ctx, s, 1, K, T));
    }

    ggml_tensor * x3 = ggml_reshape_3d(ctx, x, E, 1, T);
    ggml_tensor * g, * u;
    if (e.gate_up) {
        ggml_tensor * gu = mm_id(e.gate_up, x3, chosen);                  // [2F, K, T]
        const int64_t F = gu->ne[0] / 2;
        g = ggml_view_3d(ctx, gu, F, K, T, gu->nb[1], gu->nb[2], 0);
        u = ggml_view_3d(ctx, gu, F, K, T, gu->nb[1], gu->nb[2], F * gu->nb[0]);
    } else {
        g = mm_id(e.gate, x3, chosen);                                     // [F, K, T]
        u = mm_id(e.up, x3, chosen);
    }
    ggml_tensor * h = e.gelu ? ggml_geglu_split(ctx, g, u) : ggml_swiglu_split(ctx, g, u);
    ggml_tensor * y = ggml_mul(ctx, mm_id(e.down, h, chosen), w);          // [E, K, T]
    ggml_tensor * out = ggml_view_2d(ctx, y, E, T, y->nb[2], 0);
    for (int64_t k = 1; k < K; ++k) {
        out = ggml_add(ctx, out, ggml_view_2d(ctx, y, E, T, y->nb[2], k * y->nb[1]));
    }
    return K == 1 ? ggml_cont(ctx, out) : out;
}
