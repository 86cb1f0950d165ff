#include "dspark-matmul.h"

#include "dspark-backend.h"
#include "dspark-impl.h"
#include "dspark-matmul-kernels.h"

#include "ggml-alloc.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

// ---------------------------------------------------------------------------------------------
// The node: every column through a single-column kernel, ggml's vec_dot (rows) or ours (own).

namespace {

constexpr int64_t ROW_BLOCK = 16;  // weight rows kept in L1 while every column passes over them

// The columns of x [K, N] (at i2) converted for the kernel: for vec_dot into the weight type's
// dot-product type (q8_K for K-quants, q8_0 for q4_0, f16 for f16, ...) as ggml's matmul converts
// them, block by block, so the result does not depend on how the row is split.
struct prepared_columns {
    std::vector<uint8_t> data;
    size_t               bytes = 0;  // per column

    void prepare(const ggml_tensor * w, const ggml_tensor * x, int64_t i2, dspark_mm_route route) {
        const int64_t K = x->ne[0], N = x->ne[1];
        const ggml_type vec_type = ggml_get_type_traits_cpu(w->type)->vec_dot_type;
        bytes = route == dspark_mm_route::own ? dspark_own_dot_prepared_size(w->type, K) : ggml_row_size(vec_type, K);
        data.resize(bytes * N);
        for (int64_t c = 0; c < N; ++c) {
            const float * src = (const float *) ((const char *) x->data + c * x->nb[1] + i2 * x->nb[2]);
            uint8_t * out = data.data() + c * bytes;
            if (route == dspark_mm_route::own) {
                dspark_own_dot_prepare(w->type, src, K, out);
            } else if (vec_type == GGML_TYPE_F32) {
                memcpy(out, src, sizeof(float) * K);
            } else {
                ggml_get_type_traits_cpu(vec_type)->from_float(src, out, K);
            }
        }
    }
    const uint8_t * column(int64_t c) const { return data.data() + c * bytes; }
};

// out[r] for rows [r0, r1) of the weight at w_data against one prepared column.
void dot_rows(const ggml_tensor * w, const char * w_data, int64_t r0, int64_t r1, const uint8_t * column,
              dspark_mm_route route, float * out) {
    const int64_t K = w->ne[0];
    if (route == dspark_mm_route::own) {
        dspark_own_dot_rows(w->type, w_data + r0 * w->nb[1], w->nb[1], K, r1 - r0, column, out + r0);
        return;
    }
    const ggml_vec_dot_t vec_dot = ggml_get_type_traits_cpu(w->type)->vec_dot;
    for (int64_t r = r0; r < r1; ++r) {
        vec_dot((int) K, out + r, 0, w_data + r * w->nb[1], 0, column, 0, 1);
    }
}

// dst [M, N] = w [K, M] · x [K, N]. Each thread prepares every column (cheap next to the products:
// K values against M·K), then takes its share of the row blocks; which thread computes a row
// changes nothing in how it is computed.
void matmul_task(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const auto route = (dspark_mm_route) (intptr_t) userdata;
    static thread_local prepared_columns cols;
    cols.prepare(w, x, 0, route);
    const int64_t M = w->ne[1], N = x->ne[1];
    // contiguous shares: each thread streams its own part of the weight
    const int64_t n_blocks = (M + ROW_BLOCK - 1) / ROW_BLOCK;
    for (int64_t b = n_blocks * ith / nth; b < n_blocks * (ith + 1) / nth; ++b) {
        const int64_t r0 = b * ROW_BLOCK, r1 = std::min(M, r0 + ROW_BLOCK);
        for (int64_t c = 0; c < N; ++c) {
            dot_rows(w, (const char *) w->data, r0, r1, cols.column(c), route, (float *) ((char *) dst->data + c * dst->nb[1]));
        }
    }
}

// dst [M, U, T]: column (u, t) = as[:, :, ids[u, t]] · b[:, u % B, t]. Columns are grouped by
// expert so that each expert's row blocks are read once for all the columns routed to it.
void matmul_id_task(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * as = dst->src[0];
    const ggml_tensor * b = dst->src[1];
    const ggml_tensor * ids = dst->src[2];
    const int64_t M = as->ne[1], X = as->ne[2], U = ids->ne[0], T = ids->ne[1], B = b->ne[1];

    static thread_local std::vector<prepared_columns> cols;  // per token
    static thread_local std::vector<std::vector<std::pair<int64_t, int64_t>>> routed;  // per expert: (u, t)
    cols.resize((size_t) T);
    for (int64_t t = 0; t < T; ++t) {
        cols[(size_t) t].prepare(as, b, t, dspark_mm_route::rows);
    }
    routed.assign((size_t) X, {});
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t u = 0; u < U; ++u) {
            const int32_t e = *(const int32_t *) ((const char *) ids->data + u * ids->nb[0] + t * ids->nb[1]);
            if (e >= 0 && e < X) {
                routed[(size_t) e].push_back({u, t});
            }
        }
    }
    const int64_t n_blocks = (M + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t item = 0;  // (expert, row block) pairs with work, dealt round-robin to the threads
    for (int64_t e = 0; e < X; ++e) {
        if (routed[(size_t) e].empty()) {
            continue;
        }
        const char * w_data = (const char *) as->data + e * as->nb[2];
        for (int64_t blk = 0; blk < n_blocks; ++blk, ++item) {
            if (item % nth != ith) {
                continue;
            }
            const int64_t r0 = blk * ROW_BLOCK, r1 = std::min(M, r0 + ROW_BLOCK);
            for (const auto & [u, t] : routed[(size_t) e]) {
                float * out = (float *) ((char *) dst->data + u * dst->nb[1] + t * dst->nb[2]);
                dot_rows(as, w_data, r0, r1, cols[(size_t) t].column(u % B), dspark_mm_route::rows, out);
            }
        }
    }
}

}  // namespace

ggml_tensor * dspark_matmul_node(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, dspark_mm_route route) {
    GGML_ASSERT(route != dspark_mm_route::ggml);
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(ggml_n_dims(w) <= 2 && w->ne[0] == x->ne[0]);
    ggml_tensor * args[2] = {w, x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2, matmul_task, GGML_N_TASKS_MAX,
                          (void *) (intptr_t) route);
}

ggml_tensor * dspark_matmul_id_rows(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids) {
    GGML_ASSERT(b->type == GGML_TYPE_F32 && b->nb[0] == sizeof(float) && ids->type == GGML_TYPE_I32);
    GGML_ASSERT(as->ne[0] == b->ne[0] && ids->ne[1] == b->ne[2]);
    ggml_tensor * args[3] = {as, b, ids};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, as->ne[1], ids->ne[0], ids->ne[1], 1, args, 3, matmul_id_task,
                          GGML_N_TASKS_MAX, nullptr);
}

// ---------------------------------------------------------------------------------------------
// The probe: how does ggml compute this weight at each column count?

namespace {

// Column counts tried: every verify length 1..17 (ggml's kernel switches sit at 2, 4 and 8), then
// a few prefill-sized ones.
const int64_t PROBE_COLS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 32, 33, 64, 100};
constexpr int64_t MAX_COLS = 100;

using columns = std::vector<std::vector<float>>;  // [column][row]

struct probe_run {
    ggml_backend_t             backend;
    ggml_backend_buffer_type_t buft;
    ggml_type                  type;
    int64_t                    K, M;
    std::vector<uint8_t>       weight;  // M rows of the type, quantized from random values
    std::vector<float>         x;       // MAX_COLS random columns

    // ggml: W · columns [first, first + n) (cyclically) in one batch; column c of the result is
    // stored at index (first + c) % MAX_COLS of `out`
    void ggml_batch(int64_t first, int64_t n, columns & out) const {
        ggml_init_params wp = { ggml_tensor_overhead(), nullptr, true };
        ggml_context * wctx = ggml_init(wp);
        ggml_tensor * W = ggml_new_tensor_2d(wctx, type, K, M);
        // the allocator rounds each tensor up to the buffer type's alignment: so must the buffer
        const size_t size = GGML_PAD(ggml_backend_buft_get_alloc_size(buft, W), ggml_backend_buft_get_alignment(buft));
        ggml_backend_buffer_t wbuf = ggml_backend_buft_alloc_buffer(buft, size);
        ggml_tallocr ta = ggml_tallocr_new(wbuf);
        ggml_tallocr_alloc(&ta, W);
        ggml_backend_tensor_set(W, weight.data(), 0, weight.size());

        ggml_init_params gp = { 4 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
        ggml_context * gctx = ggml_init(gp);
        ggml_tensor * X = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, K, n);
        ggml_tensor * Y = ggml_mul_mat(gctx, W, X);
        ggml_cgraph * gf = ggml_new_graph(gctx);
        ggml_build_forward_expand(gf, Y);
        ggml_backend_buffer_t gbuf = ggml_backend_alloc_ctx_tensors(gctx, backend);
        for (int64_t c = 0; c < n; ++c) {
            ggml_backend_tensor_set(X, x.data() + ((first + c) % MAX_COLS) * K, c * X->nb[1], sizeof(float) * K);
        }
        std::vector<float> y((size_t) (M * n), NAN);
        if (ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS) {
            ggml_backend_tensor_get(Y, y.data(), 0, sizeof(float) * y.size());
        }
        for (int64_t c = 0; c < n; ++c) {
            out[(size_t) ((first + c) % MAX_COLS)].assign(y.begin() + c * M, y.begin() + (c + 1) * M);
        }
        ggml_backend_buffer_free(gbuf);
        ggml_free(gctx);
        ggml_backend_buffer_free(wbuf);
        ggml_free(wctx);
    }

    // our single-column kernel on every column
    columns own() const {
        columns out((size_t) MAX_COLS);
        std::vector<uint8_t> prepared(dspark_own_dot_prepared_size(type, K));
        for (int64_t c = 0; c < MAX_COLS; ++c) {
            dspark_own_dot_prepare(type, x.data() + c * K, K, prepared.data());
            out[(size_t) c].resize((size_t) M);
            dspark_own_dot_rows(type, (const char *) weight.data(), ggml_row_size(type, K), K, M, prepared.data(),
                                out[(size_t) c].data());
        }
        return out;
    }
};

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// The smallest probed column count from which every probed batch gives `reference`'s bits for
// all its columns (each batch starts at a different column); 0 if even the largest does not.
int64_t agrees_from(const probe_run & run, const columns & reference) {
    int64_t from = 0;
    columns got((size_t) MAX_COLS);
    for (int64_t n : PROBE_COLS) {
        run.ggml_batch(n, n, got);
        bool all = true;
        for (int64_t c = 0; c < n && all; ++c) {
            const size_t i = (size_t) ((n + c) % MAX_COLS);
            all = same_bits(got[i], reference[i]);
        }
        if (!all) {
            from = 0;
        } else if (from == 0) {
            from = n;
        }
    }
    return from;
}

dspark_mm_plan probe(ggml_backend_buffer_type_t buft, ggml_type type, int64_t K, int64_t M) {
    ggml_backend_t backend = dspark_backend_init(dspark_device_cpu());
    dspark_backend_set_threads(backend, 1);
    probe_run run = {backend, buft, type, K, M, {}, {}};

    uint64_t state = 0x9E3779B97F4A7C15ull ^ ((uint64_t) type << 32) ^ (uint64_t) K;
    auto uniform = [&]() {  // xorshift: fixed values, so a probe's verdict never varies between runs
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return (float) ((state >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f;
    };
    std::vector<float> values((size_t) (M * K));
    for (float & v : values) {
        v = uniform() * 0.1f;
    }
    run.x.resize((size_t) (MAX_COLS * K));
    for (float & v : run.x) {
        v = uniform();
    }
    run.weight.resize(ggml_row_size(type, K) * M);
    const std::vector<float> importance((size_t) K, 1.0f);  // some types quantize only with one
    ggml_quantize_chunk(type, values.data(), run.weight.data(), 0, M, K, importance.data());

    columns alone((size_t) MAX_COLS);
    for (int64_t c = 0; c < MAX_COLS; ++c) {
        run.ggml_batch(c, 1, alone);
    }
    dspark_mm_plan plan;
    plan.route = dspark_mm_route::rows;
    const bool plain = ggml_backend_buft_is_host(buft);
    if (agrees_from(run, alone) == 1) {
        plan.route = dspark_mm_route::ggml;
    } else if (plain && dspark_own_dot_available(type, K)) {
        const int64_t from = agrees_from(run, run.own());
        if (from > 0 && from <= 17) {
            plan.route = dspark_mm_route::own;
            plan.own_below = from;
        }
    }
    ggml_backend_free(backend);
    return plan;
}

}  // namespace

dspark_mm_plan dspark_matmul_plan(ggml_backend_buffer_type_t buft, ggml_type type, int64_t n_per_row, int64_t n_rows) {
    // ggml's kernels also choose by the row count modulo 4, 8 and 16 (tiles, interleaved layouts)
    const int64_t M = 16 + n_rows % 16;
    static std::mutex mutex;
    static std::map<std::tuple<ggml_backend_buffer_type_t, ggml_type, int64_t, int64_t>, dspark_mm_plan> known;
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(buft, type, n_per_row, M);
    auto it = known.find(key);
    if (it == known.end()) {
        const dspark_mm_plan plan = probe(buft, type, n_per_row, M);
        DSPARK_LOG_DEBUG("matmul plan for %s rows of %lld in %s: %s (own below %lld)", ggml_type_name(type),
                         (long long) n_per_row, ggml_backend_buft_name(buft), dspark_mm_route_name(plan.route),
                         (long long) plan.own_below);
        it = known.emplace(key, plan).first;
    }
    return it->second;
}

dspark_mm_plan dspark_matmul_plan_of(const ggml_tensor * w) {
    if (!w->buffer || !ggml_get_type_traits_cpu(w->type)->vec_dot) {
        return {};
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(w->buffer);
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);  // none for a mapped file's buffer
    if ((dev && !dspark_device_is_cpu(dev)) || !ggml_backend_buft_is_host(buft)) {
        return {};  // not on the CPU, or a repacked layout (used only where its plan is ggml)
    }
    // a plain layout, whether mapped from the file or copied: one plan
    return dspark_matmul_plan(ggml_backend_dev_buffer_type(dspark_device_cpu()), w->type, w->ne[0], w->ne[1]);
}

const char * dspark_mm_route_name(dspark_mm_route route) {
    switch (route) {
        case dspark_mm_route::ggml: return "ggml";
        case dspark_mm_route::own:  return "own";
        case dspark_mm_route::rows: return "rows";
    }
    return "?";
}
