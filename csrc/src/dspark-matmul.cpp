#include "dspark-matmul.h"

#include "dspark-backend.h"
#include "dspark-impl.h"
#include "dspark-matmul-amx-bf16.h"
#include "dspark-matmul-blocks.h"
#include "dspark-matmul-kernels.h"
#include "dspark-quant.h"

#include "ggml-alloc.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

// ---------------------------------------------------------------------------------------------
// The node: every column through a single-column kernel, ggml's vec_dot (rows) or ours (own).

namespace {

// Batches of fewer columns than this run our float kernels where they take many columns at once
// (verify blocks, the decode of many sequences); prefills keep ggml's matmul.
constexpr int64_t OWN_COLUMNS_BELOW = 17;
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
        bytes = route == dspark_mm_route::own      ? dspark_own_dot_prepared_size(w->type, K)
              : route == dspark_mm_route::blocks   ? dspark_blocks_column_size(K)
                                                   : ggml_row_size(vec_type, K);
        data.resize(bytes * N);
        for (int64_t c = 0; c < N; ++c) {
            const float * src = (const float *) ((const char *) x->data + c * x->nb[1] + i2 * x->nb[2]);
            uint8_t * out = data.data() + c * bytes;
            if (route == dspark_mm_route::blocks) {
                dspark_blocks_prepare(src, K, out);
            } else if (route == dspark_mm_route::own) {
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
    const bool together = route == dspark_mm_route::own && dspark_own_dot_columns_available(w->type, w->ne[0]);
    if (together && dspark_own_dot_takes_row_ranges(w->type, w->ne[0])) {  // this thread's rows in one call
        const int64_t r0 = n_blocks * ith / nth * ROW_BLOCK, r1 = std::min(M, n_blocks * (ith + 1) / nth * ROW_BLOCK);
        if (r1 > r0) {
            dspark_own_dot_rows_columns(w->type, (const char *) w->data + r0 * w->nb[1], w->nb[1], w->ne[0], r1 - r0,
                                        cols.column(0), cols.bytes, N, (float *) dst->data + r0, dst->nb[1] / sizeof(float));
        }
        return;
    }
    for (int64_t b = n_blocks * ith / nth; b < n_blocks * (ith + 1) / nth; ++b) {
        const int64_t r0 = b * ROW_BLOCK, r1 = std::min(M, r0 + ROW_BLOCK);
        if (together) {  // every column over each row at once
            dspark_own_dot_rows_columns(w->type, (const char *) w->data + r0 * w->nb[1], w->nb[1], w->ne[0], r1 - r0,
                                        cols.column(0), cols.bytes, N, (float *) dst->data + r0, dst->nb[1] / sizeof(float));
            continue;
        }
        for (int64_t c = 0; c < N; ++c) {
            dot_rows(w, (const char *) w->data, r0, r1, cols.column(c), route, (float *) ((char *) dst->data + c * dst->nb[1]));
        }
    }
}

// The own route of mul_mat_id (where our kernel takes a thread's rows and any number of columns at
// once: bf16 on AMX tiles): rows [r0, r1) of every expert against all its columns together, the
// columns gathered and the results scattered.
void own_experts(const ggml_tensor * as, ggml_tensor * dst, const std::vector<prepared_columns> & cols,
                 const std::vector<std::vector<std::pair<int64_t, int64_t>>> & routed, int64_t B, int64_t r0, int64_t r1) {
    if (r1 <= r0) {
        return;
    }
    static thread_local std::vector<uint8_t> gathered;
    static thread_local std::vector<float> out;
    for (size_t e = 0; e < routed.size(); ++e) {
        const auto & columns = routed[e];
        if (columns.empty()) {
            continue;
        }
        const size_t bytes = cols[0].bytes;
        gathered.resize(columns.size() * bytes);
        for (size_t i = 0; i < columns.size(); ++i) {
            memcpy(gathered.data() + i * bytes, cols[(size_t) columns[i].second].column(columns[i].first % B), bytes);
        }
        const int64_t n = r1 - r0;
        out.resize(columns.size() * (size_t) n);
        const char * w = (const char *) as->data + e * as->nb[2] + r0 * as->nb[1];
        dspark_own_dot_rows_columns(as->type, w, as->nb[1], as->ne[0], n, gathered.data(), bytes, (int64_t) columns.size(),
                                    out.data(), (size_t) n);
        for (size_t i = 0; i < columns.size(); ++i) {
            const auto [u, t] = columns[i];
            memcpy((float *) ((char *) dst->data + u * dst->nb[1] + t * dst->nb[2]) + r0, out.data() + i * n, sizeof(float) * n);
        }
    }
}

// dst [M, U, T]: column (u, t) = as[:, :, ids[u, t]] · b[:, u % B, t]. Columns are grouped by
// expert so that each expert's row blocks are read once for all the columns routed to it.
void matmul_id_task(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * as = dst->src[0];
    const ggml_tensor * b = dst->src[1];
    const ggml_tensor * ids = dst->src[2];
    const int64_t M = as->ne[1], X = as->ne[2], U = ids->ne[0], T = ids->ne[1], B = b->ne[1];
    const auto route = (dspark_mm_route) ((intptr_t) userdata & 0xFF);  // rows, blocks or own
    const bool packed = ((intptr_t) userdata >> 8) != 0;                  // blocks on packed experts
    const size_t expert_bytes = packed ? dspark_blocks_packed_size(as->type, as->ne[0], M) : as->nb[2];

    static thread_local std::vector<prepared_columns> cols;  // per token
    static thread_local std::vector<std::vector<std::pair<int64_t, int64_t>>> routed;  // per expert: (u, t)
    cols.resize((size_t) T);
    for (int64_t t = 0; t < T; ++t) {
        cols[(size_t) t].prepare(as, b, t, route);
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
    if (route == dspark_mm_route::own) {
        own_experts(as, dst, cols, routed, B, n_blocks * ith / nth * ROW_BLOCK, std::min(M, n_blocks * (ith + 1) / nth * ROW_BLOCK));
        return;
    }
    int64_t item = 0;  // (expert, row block) pairs with work, dealt round-robin to the threads
    for (int64_t e = 0; e < X; ++e) {
        if (routed[(size_t) e].empty()) {
            continue;
        }
        const char * w_data = (const char *) as->data + e * expert_bytes;
        for (int64_t blk = 0; blk < n_blocks; ++blk, ++item) {
            if (item % nth != ith) {
                continue;
            }
            const int64_t r0 = blk * ROW_BLOCK, r1 = std::min(M, r0 + ROW_BLOCK);
            if (route == dspark_mm_route::blocks) {  // the expert's columns together
                static thread_local std::vector<const void *> columns;
                static thread_local std::vector<float *> outputs;
                columns.clear();
                outputs.clear();
                for (const auto & [u, t] : routed[(size_t) e]) {
                    columns.push_back(cols[(size_t) t].column(u % B));
                    outputs.push_back((float *) ((char *) dst->data + u * dst->nb[1] + t * dst->nb[2]) + r0);
                }
                if (packed) {
                    dspark_blocks_rows_packed(as->type, w_data + dspark_blocks_packed_size(as->type, as->ne[0], r0),
                                              as->ne[0], r1 - r0, columns.data(), outputs.data(), (int) columns.size());
                } else {
                    dspark_blocks_rows(as->type, w_data + r0 * as->nb[1], as->nb[1], as->ne[0], r1 - r0, columns.data(),
                                       outputs.data(), (int) columns.size());
                }
                continue;
            }
            for (const auto & [u, t] : routed[(size_t) e]) {
                float * out = (float *) ((char *) dst->data + u * dst->nb[1] + t * dst->nb[2]);
                dot_rows(as, w_data, r0, r1, cols[(size_t) t].column(u % B), dspark_mm_route::rows, out);
            }
        }
    }
}

}  // namespace

// The blocks route (dspark-matmul-blocks.h) in two nodes: the columns quantized once, each by one
// thread (and shared by the matmuls of one input), then every column at once, 16 rows at a time.
static void blocks_columns_task(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * x = dst->src[0];
    for (int64_t c = ith; c < x->ne[1]; c += nth) {
        dspark_blocks_prepare((const float *) ((const char *) x->data + c * x->nb[1]), x->ne[0], (char *) dst->data + c * dst->nb[1]);
    }
}

static void blocks_matmul_task(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const bool packed = userdata != nullptr;
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * cols = dst->src[1];
    const int64_t M = w->ne[1], N = cols->ne[1];
    static thread_local std::vector<const void *> columns;
    static thread_local std::vector<float *> outputs;
    const int64_t n_blocks = (M + ROW_BLOCK - 1) / ROW_BLOCK;  // contiguous shares of whole row blocks
    const int64_t r0 = std::min(M, n_blocks * ith / nth * ROW_BLOCK), r1 = std::min(M, n_blocks * (ith + 1) / nth * ROW_BLOCK);
    if (r1 <= r0) {
        return;
    }
    columns.resize((size_t) N);
    outputs.resize((size_t) N);
    for (int64_t c = 0; c < N; ++c) {
        columns[(size_t) c] = (const char *) cols->data + c * cols->nb[1];
        outputs[(size_t) c] = (float *) ((char *) dst->data + c * dst->nb[1]) + r0;
    }
    if (packed) {  // r0 starts a group of 16 rows
        dspark_blocks_rows_packed(w->type, (const char *) w->data + dspark_blocks_packed_size(w->type, w->ne[0], r0), w->ne[0],
                                  r1 - r0, columns.data(), outputs.data(), (int) N);
    } else {
        dspark_blocks_rows(w->type, (const char *) w->data + r0 * w->nb[1], w->nb[1], w->ne[0], r1 - r0, columns.data(),
                           outputs.data(), (int) N);
    }
}

ggml_tensor * dspark_matmul_blocks_columns(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1 && x->ne[0] % 32 == 0);
    // w, unread, puts the node where the weight is: ggml's scheduler places a node by its weights first
    // (with only x it could land on the backend that computed x, an RPC server that cannot run it)
    ggml_tensor * args[2] = {x, w};
    return ggml_custom_4d(ctx, GGML_TYPE_I8, (int64_t) dspark_blocks_column_size(x->ne[0]), x->ne[1], 1, 1, args, 2,
                          blocks_columns_task, GGML_N_TASKS_MAX, nullptr);
}

ggml_tensor * dspark_matmul_blocks(ggml_context * ctx, ggml_tensor * w, ggml_tensor * columns, bool packed) {
    GGML_ASSERT(ggml_n_dims(w) <= 2 && columns->type == GGML_TYPE_I8 &&
                (size_t) columns->ne[0] == dspark_blocks_column_size(w->ne[0]));
    ggml_tensor * args[2] = {w, columns};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], columns->ne[1], 1, 1, args, 2, blocks_matmul_task, GGML_N_TASKS_MAX,
                          packed ? (void *) 1 : nullptr);
}

ggml_tensor * dspark_matmul_blocks(ggml_context * ctx, ggml_tensor * w, ggml_tensor * columns) {
    return dspark_matmul_blocks(ctx, w, columns, dspark_matmul_is_packed(w));
}

// ---------------------------------------------------------------------------------------------
// Weights packed for the blocks route: the buffers that hold them (few: one per loaded file).

static std::mutex packed_mutex;
static std::vector<ggml_backend_buffer_t> packed_buffers;

void dspark_matmul_hold_packed(ggml_backend_buffer_t buf, bool held) {
    std::lock_guard<std::mutex> lock(packed_mutex);
    auto it = std::find(packed_buffers.begin(), packed_buffers.end(), buf);
    if (held && it == packed_buffers.end()) {
        packed_buffers.push_back(buf);
    } else if (!held && it != packed_buffers.end()) {
        packed_buffers.erase(it);
    }
}

bool dspark_matmul_is_packed(const ggml_tensor * w) {
    std::lock_guard<std::mutex> lock(packed_mutex);
    return w->buffer && std::find(packed_buffers.begin(), packed_buffers.end(), w->buffer) != packed_buffers.end();
}

bool dspark_matmul_packs(ggml_backend_dev_t dev, const ggml_tensor * w) {
    const int nd = ggml_n_dims(w);
    return (nd == 2 || nd == 3) && dspark_device_is_cpu(dev) && dspark_device_rules_of(dev) == dspark_device_rules::cpu &&
           dspark_matmul_plan(ggml_backend_dev_buffer_type(dev), w->type, w->ne[0], w->ne[1]).route == dspark_mm_route::blocks;
}

ggml_tensor * dspark_matmul_node(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, dspark_mm_route route) {
    GGML_ASSERT(route != dspark_mm_route::ggml);
    if (route == dspark_mm_route::blocks) {
        return dspark_matmul_blocks(ctx, w, dspark_matmul_blocks_columns(ctx, x, w), false);
    }
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(ggml_n_dims(w) <= 2 && w->ne[0] == x->ne[0]);
    ggml_tensor * args[2] = {w, x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2, matmul_task, GGML_N_TASKS_MAX,
                          (void *) (intptr_t) route);
}

ggml_tensor * dspark_matmul_id_rows(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids,
                                    dspark_mm_route route) {
    GGML_ASSERT(b->type == GGML_TYPE_F32 && b->nb[0] == sizeof(float) && ids->type == GGML_TYPE_I32);
    GGML_ASSERT(route == dspark_mm_route::rows || route == dspark_mm_route::blocks ||
                (route == dspark_mm_route::own && dspark_own_dot_takes_row_ranges(as->type, as->ne[0])));
    GGML_ASSERT(as->ne[0] == b->ne[0] && ids->ne[1] == b->ne[2]);
    ggml_tensor * args[3] = {as, b, ids};
    const intptr_t packed = route == dspark_mm_route::blocks && dspark_matmul_is_packed(as);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, as->ne[1], ids->ne[0], ids->ne[1], 1, args, 3, matmul_id_task,
                          GGML_N_TASKS_MAX, (void *) ((intptr_t) route | packed << 8));
}

// The columns left over after ggml's gemm took the groups of four, through our kernel for the
// repacked layout. The weight travels in userdata, not as a source: ggml's CPU backend takes an op
// reading a repacked tensor only if the repack buffer type claims it (matmuls only).
static void quads_task(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * w = (const ggml_tensor *) userdata;
    const ggml_tensor * x = dst->src[0];
    const int64_t K = w->ne[0], M = w->ne[1], N = x->ne[1];
    const size_t bytes = dspark_own_dot_x8_prepared_size(w->type, K);
    static thread_local std::vector<uint8_t> prepared;
    prepared.resize(bytes * N);
    for (int64_t c = 0; c < N; ++c) {  // each thread prepares every column (at most three)
        dspark_own_dot_x8_prepare(w->type, (const float *) ((const char *) x->data + c * x->nb[1]), K, prepared.data() + c * bytes);
    }
    const int64_t n_groups = M / 8;  // contiguous shares of 8-row groups
    const int64_t g0 = n_groups * ith / nth, g1 = n_groups * (ith + 1) / nth;
    if (g1 > g0) {
        for (int64_t c = 0; c < N; ++c) {
            dspark_own_dot_x8_rows(w->type, w->data, K, 8 * g0, 8 * (g1 - g0), prepared.data() + c * bytes,
                                   (float *) ((char *) dst->data + c * dst->nb[1]) + 8 * g0);
        }
    }
}

ggml_tensor * dspark_matmul_quads(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->ne[2] == 1 && x->ne[3] == 1 && ggml_n_dims(w) <= 2 && w->ne[1] % 8 == 0);
    x = ggml_is_contiguous(x) ? x : ggml_cont(ctx, x);
    const int64_t K = x->ne[0], N = x->ne[1], N4 = N - N % 4;
    ggml_tensor * y = nullptr;
    if (N4 > 0) {
        y = ggml_mul_mat(ctx, w, N4 == N ? x : ggml_view_2d(ctx, x, K, N4, x->nb[1], 0));
    }
    if (N4 < N) {
        ggml_tensor * rest = ggml_view_2d(ctx, x, K, N - N4, x->nb[1], N4 * x->nb[1]);
        ggml_tensor * args[1] = {rest};
        ggml_tensor * z = ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], N - N4, 1, 1, args, 1, quads_task,
                                         GGML_N_TASKS_MAX, (void *) w);
        y = y ? ggml_concat(ctx, y, z, 1) : z;
    }
    return y;
}

// ---------------------------------------------------------------------------------------------
// The probe: how does ggml compute this weight at each column count?

namespace {

// xorshift from a seed of the type and row length: fixed values, so a probe's verdict never varies
// between runs (the CPU's probe and the devices')
struct probe_random {
    uint64_t state;

    probe_random(ggml_type type, int64_t K) : state(0x9E3779B97F4A7C15ull ^ ((uint64_t) type << 32) ^ (uint64_t) K) {}

    float uniform() {  // in [-1, 1)
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return (float) ((state >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f;
    }
};

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

    // the weight in a buffer of the probed type (converted on upload for a repacked one)
    ggml_tensor * upload(ggml_context *& wctx, ggml_backend_buffer_t & wbuf) const {
        ggml_init_params wp = { ggml_tensor_overhead(), nullptr, true };
        wctx = ggml_init(wp);
        ggml_tensor * W = ggml_new_tensor_2d(wctx, type, K, M);
        // the allocator rounds each tensor up to the buffer type's alignment: so must the buffer
        const size_t size = GGML_PAD(ggml_backend_buft_get_alloc_size(buft, W), ggml_backend_buft_get_alignment(buft));
        wbuf = ggml_backend_buft_alloc_buffer(buft, size);
        ggml_tallocr ta = ggml_tallocr_new(wbuf);
        ggml_tallocr_alloc(&ta, W);
        ggml_backend_tensor_set(W, weight.data(), 0, weight.size());
        return W;
    }

    // ggml: W · columns [first, first + n) (cyclically) in one batch; column c of the result is
    // stored at index (first + c) % MAX_COLS of `out`
    void ggml_batch(int64_t first, int64_t n, columns & out) const {
        ggml_context * wctx;
        ggml_backend_buffer_t wbuf;
        ggml_tensor * W = upload(wctx, wbuf);

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

    // our kernel for the repacked layout on every column (the weight repacked by ggml's upload)
    columns own_x8() const {
        ggml_context * wctx;
        ggml_backend_buffer_t wbuf;
        ggml_tensor * W = upload(wctx, wbuf);
        columns out((size_t) MAX_COLS);
        std::vector<uint8_t> prepared(dspark_own_dot_x8_prepared_size(type, K));
        for (int64_t c = 0; c < MAX_COLS; ++c) {
            dspark_own_dot_x8_prepare(type, x.data() + c * K, K, prepared.data());
            out[(size_t) c].resize((size_t) M);
            dspark_own_dot_x8_rows(type, W->data, K, 0, M, prepared.data(), out[(size_t) c].data());
        }
        ggml_backend_buffer_free(wbuf);
        ggml_free(wctx);
        return out;
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

// Does every probed batch of a multiple of four columns give `reference`'s bits?
bool agrees_in_fours(const probe_run & run, const columns & reference) {
    columns got((size_t) MAX_COLS);
    for (int64_t n : PROBE_COLS) {
        if (n % 4 != 0) {
            continue;
        }
        run.ggml_batch(n, n, got);
        for (int64_t c = 0; c < n; ++c) {
            const size_t i = (size_t) ((n + c) % MAX_COLS);
            if (!same_bits(got[i], reference[i])) {
                return false;
            }
        }
    }
    return true;
}

dspark_mm_plan probe(ggml_backend_buffer_type_t buft, ggml_type type, int64_t K, int64_t M) {
    ggml_backend_t backend = dspark_backend_init(dspark_device_cpu());
    dspark_backend_set_threads(backend, 1);
    probe_run run = {backend, buft, type, K, M, {}, {}};

    probe_random rnd(type, K);
    std::vector<float> values((size_t) (M * K));
    for (float & v : values) {
        v = rnd.uniform() * 0.1f;
    }
    run.x.resize((size_t) (MAX_COLS * K));
    for (float & v : run.x) {
        v = rnd.uniform();
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
            // where ours takes many columns at once, a verify (and the decode of many sequences)
            // is ours too: the bits ggml's batches give, at less than their cost
            plan.own_below = dspark_own_dot_columns_available(type, K) ? std::max<int64_t>(from, OWN_COLUMNS_BELOW) : from;
        }
    } else if (!plain && M % 8 == 0 && dspark_own_dot_x8_available(type, K) && agrees_in_fours(run, run.own_x8())) {
        plan.route = dspark_mm_route::quads;
    }
    ggml_backend_free(backend);
    return plan;
}

}  // namespace

// DSPARK_CPU_MATMUL=ggml / DSPARK_DEVICE_MATMUL=ggml: ggml's matmuls as they are (rows may then
// depend on the batch): for measuring what batch invariance costs, and a way out.
static bool env_says_ggml(const char * var) {
    const char * v = getenv(var);
    return v && strcmp(v, "ggml") == 0;
}

dspark_mm_plan dspark_matmul_plan(ggml_backend_buffer_type_t buft, ggml_type type, int64_t n_per_row, int64_t n_rows) {
    static const bool off = env_says_ggml("DSPARK_CPU_MATMUL");
    if (off) {
        return {};
    }
    if (dspark_blocks_available(type, n_per_row)) {
        dspark_mm_plan plan;  // in any buffer type: a repacked layout is then not used (dspark-weights.cpp)
        plan.route = dspark_mm_route::blocks;
        return plan;
    }
    if (dspark_amx_bf16_available(type, n_per_row) && ggml_backend_buft_is_host(buft)) {
        dspark_mm_plan plan;  // the tile program's bits for every batch, prefills included (dspark-matmul-amx-bf16.h)
        plan.route = dspark_mm_route::own;
        plan.own_below = INT64_MAX;
        return plan;
    }
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

static bool is_vulkan(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg && strcmp(ggml_backend_reg_name(reg), "Vulkan") == 0;
}

// ---------------------------------------------------------------------------------------------
// Devices: which batches does the device compute as it computes each column alone?

namespace {

constexpr int64_t DEV_SINGLES = 17;  // columns the probe computes alone (a verify block's most)
const int64_t DEV_BATCHES[] = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33, 64};
const int64_t DEV_BATCHED[] = {9, 64};  // as [K, 1, n]: n single columns in one matmul

// The rows a probe multiplies: the weight's own count up to 8208, else 8208 + (n_rows mod 16).
// ggml-vulkan sizes its mul_mat_vec workgroups by the row count (thresholds at 4096 and 8192 rows
// on some vendors) and tiles its matmuls by it; the value of a row does not depend on how many
// rows follow it beyond that.
int64_t device_probe_rows(int64_t n_rows) {
    return n_rows <= 8208 ? n_rows : 8208 + n_rows % 16;
}

// One matmul of the device probe: input columns (first + c) mod DEV_SINGLES for c < n, with token
// c on expert (its input column) mod 2 for mul_mat_id.
struct probe_item {
    int64_t       n, first;
    bool          batched;  // x [K, 1, n] rather than [K, n]
    ggml_tensor * x = nullptr, * ids = nullptr, * y = nullptr;

    int64_t source(int64_t c) const { return (first + c) % DEV_SINGLES; }
};

// The singles first (item c is column c alone), then every batch to compare with them.
std::vector<probe_item> probe_items(bool id) {
    std::vector<probe_item> items;
    for (int64_t c = 0; c < DEV_SINGLES; ++c) {
        items.push_back({1, c, false});
    }
    for (int64_t n : DEV_BATCHES) {
        items.push_back({n, n % DEV_SINGLES, false});
    }
    if (!id) {  // (mul_mat_id takes its tokens in [K, 1, T] already)
        for (int64_t n : DEV_BATCHED) {
            items.push_back({n, (n + 5) % DEV_SINGLES, true});
        }
    }
    return items;
}

// M rows (per expert, X experts) of `type` quantized from 32 random rows, repeated: a device's
// result for a row depends on the row count, not on the values of other rows.
std::vector<uint8_t> probe_weight(ggml_type type, int64_t K, int64_t M, int64_t X, probe_random & rnd) {
    constexpr int64_t BASE_ROWS = 32;
    std::vector<float> values((size_t) (BASE_ROWS * K));
    for (float & v : values) {
        v = rnd.uniform() * 0.1f;
    }
    const size_t row_size = ggml_row_size(type, K);
    std::vector<uint8_t> base(row_size * BASE_ROWS);
    const std::vector<float> importance((size_t) K, 1.0f);  // some types quantize only with one
    ggml_quantize_chunk(type, values.data(), base.data(), 0, BASE_ROWS, K, importance.data());
    std::vector<uint8_t> weight(row_size * (size_t) (M * X));
    for (int64_t e = 0; e < X; ++e) {
        for (int64_t r = 0; r < M; ++r) {
            memcpy(weight.data() + (e * M + r) * row_size, base.data() + ((r + 7 * e) % BASE_ROWS) * row_size, row_size);
        }
    }
    return weight;
}

// Every item of `items` on the device in one graph: W [K, M] (with `id`, 2 experts [K, M, 2]) times
// the item's columns of `x` (DEV_SINGLES columns of K). Returns each item's result ([M, n]; [M, 1, n]
// for mul_mat_id, the same layout), or nothing when the device could not run the probe.
std::vector<std::vector<float>> probe_device_compute(ggml_backend_dev_t dev, ggml_type type, int64_t K, int64_t M, bool id,
                                                     const std::vector<uint8_t> & weight, const std::vector<float> & x,
                                                     std::vector<probe_item> & items) {
    const int64_t X = id ? 2 : 1;
    ggml_init_params gp = { (1 + 3 * items.size()) * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(gp);
    ggml_tensor * W = id ? ggml_new_tensor_3d(ctx, type, K, M, X) : ggml_new_tensor_2d(ctx, type, K, M);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    for (probe_item & it : items) {
        const bool as_3d = id || it.batched;
        it.x = as_3d ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, 1, it.n) : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, it.n);
        it.ids = id ? ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, it.n) : nullptr;
        it.y = id ? ggml_mul_mat_id(ctx, W, it.x, it.ids) : ggml_mul_mat(ctx, W, it.x);
        ggml_build_forward_expand(gf, it.y);
    }
    ggml_backend_t backend = dspark_backend_init(dev);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    bool ok = buf != nullptr;
    for (int i = 0; ok && i < ggml_graph_n_nodes(gf); ++i) {
        ok = ggml_backend_supports_op(backend, ggml_graph_node(gf, i));
    }
    std::vector<std::vector<float>> out;
    if (ok) {
        ggml_backend_tensor_set(W, weight.data(), 0, weight.size());
        for (probe_item & it : items) {
            std::vector<int32_t> ids((size_t) it.n);
            for (int64_t c = 0; c < it.n; ++c) {
                ggml_backend_tensor_set(it.x, x.data() + it.source(c) * K, c * sizeof(float) * K, sizeof(float) * K);
                ids[(size_t) c] = (int32_t) (it.source(c) % X);
            }
            if (it.ids) {
                ggml_backend_tensor_set(it.ids, ids.data(), 0, sizeof(int32_t) * ids.size());
            }
        }
        ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
    }
    for (size_t i = 0; ok && i < items.size(); ++i) {
        out.emplace_back((size_t) (M * items[i].n));
        ggml_backend_tensor_get(items[i].y, out.back().data(), 0, sizeof(float) * out.back().size());
    }
    if (buf) {
        ggml_backend_buffer_free(buf);
    }
    ggml_backend_free(backend);
    ggml_free(ctx);
    return out;
}

// The plan from the probe's verdicts: `agree[i]` says whether item DEV_SINGLES + i gave every
// column the bits of that column alone.
dspark_mm_plan device_plan_from(const std::vector<probe_item> & items, const std::vector<bool> & agree) {
    dspark_mm_plan plan;  // ggml
    int64_t group = 1;    // the largest n whose batches 2..n all agree
    bool all = true, batched = true;
    for (size_t b = 0; b < agree.size(); ++b) {
        const probe_item & it = items[DEV_SINGLES + b];
        if (it.batched) {
            batched = batched && agree[b];
            continue;
        }
        all = all && agree[b];
        if (all && it.n <= DEV_SINGLES) {
            group = it.n;
        }
    }
    if (!all) {
        plan.route = dspark_mm_route::groups;
        plan.group = group;
        plan.batched = batched && items.back().batched;  // (mul_mat_id probes no [K, 1, n] item)
    }
    return plan;
}

dspark_mm_plan probe_device(ggml_backend_dev_t dev, ggml_type type, int64_t K, int64_t M, bool id) {
    probe_random rnd(type, K);
    const std::vector<uint8_t> weight = probe_weight(type, K, M, id ? 2 : 1, rnd);
    std::vector<float> x((size_t) (DEV_SINGLES * K));
    for (float & v : x) {
        v = rnd.uniform();
    }
    std::vector<probe_item> items = probe_items(id);
    const std::vector<std::vector<float>> out = probe_device_compute(dev, type, K, M, id, weight, x, items);
    if (out.empty()) {
        DSPARK_LOG_WARN("%s: could not probe %s%s matmuls of %lld x %lld; using ggml's as they are",
                        ggml_backend_dev_name(dev), ggml_type_name(type), id ? " (id)" : "", (long long) K, (long long) M);
        return {};
    }
    std::vector<bool> agree;
    std::string table;  // for the log: "2= 3= ... 9x ... 1x9=" (= agrees, x differs)
    for (size_t i = DEV_SINGLES; i < items.size(); ++i) {
        bool all = true;
        for (int64_t c = 0; c < items[i].n && all; ++c) {
            all = memcmp(out[i].data() + c * M, out[(size_t) items[i].source(c)].data(), sizeof(float) * M) == 0;
        }
        agree.push_back(all);
        table += (table.empty() ? "" : " ") + std::string(items[i].batched ? "1x" : "") + std::to_string(items[i].n) +
                 (all ? "=" : "x");
    }
    const dspark_mm_plan plan = device_plan_from(items, agree);
    DSPARK_LOG_DEBUG("matmul plan for %s%s rows of %lld (%lld probed) on %s: %s (group %lld%s) [%s]", ggml_type_name(type),
                     id ? " experts" : "", (long long) K, (long long) M, ggml_backend_dev_name(dev),
                     dspark_mm_route_name(plan.route), (long long) plan.group, plan.batched ? ", batched" : "", table.c_str());
    return plan;
}

// Concatenate parts along dimension `dim`, pairwise (each column is copied log2(parts) times).
ggml_tensor * concat_all(ggml_context * ctx, std::vector<ggml_tensor *> parts, int dim) {
    while (parts.size() > 1) {
        std::vector<ggml_tensor *> next;
        for (size_t i = 0; i < parts.size(); i += 2) {
            next.push_back(i + 1 < parts.size() ? ggml_concat(ctx, parts[i], parts[i + 1], dim) : parts[i]);
        }
        parts.swap(next);
    }
    return parts[0];
}

// A view at byte offset `offs` into its source that the device can bind: copied when the offset
// is not a multiple of the device's alignment (ggml-vulkan binds storage buffers at aligned offsets).
ggml_tensor * bindable(ggml_context * ctx, ggml_tensor * view, size_t offs, const ggml_tensor * w) {
    const size_t align = w->buffer ? ggml_backend_buft_get_alignment(ggml_backend_buffer_get_type(w->buffer)) : 1;
    return align > 1 && offs % align != 0 ? ggml_cont(ctx, view) : view;
}

}  // namespace

dspark_mm_plan dspark_matmul_plan_device(ggml_backend_dev_t dev, ggml_type type, int64_t n_per_row, int64_t n_rows, bool id) {
    static const bool off = env_says_ggml("DSPARK_DEVICE_MATMUL");
    if (off) {
        return {};
    }
    const int64_t M = device_probe_rows(n_rows);
    static std::mutex mutex;
    static std::map<std::tuple<ggml_backend_dev_t, ggml_type, int64_t, int64_t, bool>, dspark_mm_plan> known;
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(dev, type, n_per_row, M, id);
    auto it = known.find(key);
    if (it == known.end()) {
        it = known.emplace(key, probe_device(dev, type, n_per_row, M, id)).first;
    }
    return it->second;
}

ggml_tensor * dspark_matmul_groups(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const dspark_mm_plan & plan) {
    GGML_ASSERT(plan.route == dspark_mm_route::groups && plan.group >= 1 && x->ne[2] == 1 && x->ne[3] == 1);
    const int64_t K = x->ne[0], N = x->ne[1], group = plan.group;
    if (N <= group) {
        return ggml_mul_mat(ctx, w, x);  // the device computes this batch as each column alone
    }
    x = ggml_is_contiguous(x) ? x : ggml_cont(ctx, x);
    if (plan.batched && (group == 1 || N > group * DSPARK_MM_MAX_GROUPS)) {
        // one matmul of N single columns: ggml-vulkan runs its one-column shader on each
        ggml_tensor * y = ggml_mul_mat(ctx, w, ggml_reshape_3d(ctx, x, K, 1, N));  // [M, 1, N]
        return ggml_reshape_2d(ctx, y, y->ne[0], N);
    }
    if (N > group * DSPARK_MM_MAX_GROUPS) {
        return ggml_mul_mat(ctx, w, x);  // a prefill the device cannot compute column by column
    }
    std::vector<ggml_tensor *> parts;
    for (int64_t c0 = 0; c0 < N; c0 += group) {
        const size_t offs = c0 * x->nb[1];
        ggml_tensor * cols = ggml_view_2d(ctx, x, K, std::min(group, N - c0), x->nb[1], offs);
        parts.push_back(ggml_mul_mat(ctx, w, bindable(ctx, cols, offs, w)));
    }
    return concat_all(ctx, parts, 1);
}

ggml_tensor * dspark_matmul_id_groups(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids,
                                      const dspark_mm_plan & plan) {
    GGML_ASSERT(plan.route == dspark_mm_route::groups && plan.group >= 1 && b->ne[2] == ids->ne[1]);
    const int64_t T = ids->ne[1], group = plan.group;
    if (T <= group || T > group * DSPARK_MM_MAX_GROUPS) {
        return ggml_mul_mat_id(ctx, as, b, ids);  // (the second: a prefill, ggml's as it is)
    }
    std::vector<ggml_tensor *> parts;
    for (int64_t t0 = 0; t0 < T; t0 += group) {
        const int64_t n = std::min(group, T - t0);
        const size_t boffs = t0 * b->nb[2], ioffs = t0 * ids->nb[1];
        ggml_tensor * bs = ggml_view_3d(ctx, b, b->ne[0], b->ne[1], n, b->nb[1], b->nb[2], boffs);
        ggml_tensor * is = ggml_view_2d(ctx, ids, ids->ne[0], n, ids->nb[1], ioffs);
        parts.push_back(ggml_mul_mat_id(ctx, as, bindable(ctx, bs, boffs, as), bindable(ctx, is, ioffs, as)));
    }
    return concat_all(ctx, parts, 2);
}

// The largest grid dimension ggml-cuda launches over channels (gridDim.y): a prefill of more columns
// keeps ggml's matmul.
constexpr int64_t MAX_CHANNELS = 65535;

ggml_tensor * dspark_matmul_channels(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const dspark_mm_plan & plan) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_n_dims(w) <= 2 && x->ne[0] == w->ne[0] && plan.group >= 1);
    const int64_t K = x->ne[0], N = ggml_nelements(x) / K, G = plan.group, N_pad = (N + G - 1) / G * G;
    if (N_pad / G > MAX_CHANNELS) {
        return ggml_mul_mat(ctx, w, x);
    }
    x = ggml_is_contiguous(x) ? x : ggml_cont(ctx, x);
    ggml_tensor * cols = ggml_reshape_2d(ctx, x, K, N);
    if (N_pad > N) {
        cols = ggml_pad(ctx, cols, 0, (int) (N_pad - N), 0, 0);  // zero columns, computed and dropped
    }
    ggml_tensor * y = ggml_mul_mat(ctx, w, ggml_reshape_3d(ctx, cols, K, G, N_pad / G));  // [M, G, N_pad / G]
    y = ggml_reshape_2d(ctx, y, w->ne[1], N_pad);
    if (N_pad > N) {
        y = ggml_view_2d(ctx, y, w->ne[1], N, y->nb[1], 0);
    }
    return ggml_reshape_4d(ctx, y, w->ne[1], x->ne[1], x->ne[2], x->ne[3]);
}

ggml_tensor * dspark_matmul_id_channels(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids) {
    GGML_ASSERT(b->type == GGML_TYPE_F32 && ids->type == GGML_TYPE_I32 && ids->ne[1] == b->ne[2]);
    const int64_t K = b->ne[0], B = b->ne[1], U = ids->ne[0], T = ids->ne[1];
    GGML_ASSERT(B == 1 || B == U);
    if (U * T > MAX_CHANNELS) {
        return ggml_mul_mat_id(ctx, as, b, ids);
    }
    // the pair (slot u, token t) becomes channel c = u·T + t of one token: its expert is ids1[c] and
    // its input column c mod (columns of b1), which is t for a shared input and c for one per slot
    ggml_tensor * ids1 = ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_transpose(ctx, ids)), U * T, 1);
    ggml_tensor * b1 = B == 1 ? ggml_reshape_3d(ctx, ggml_cont(ctx, b), K, T, 1)
                              : ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_permute(ctx, b, 0, 2, 1, 3)), K, U * T, 1);
    ggml_tensor * y = ggml_mul_mat_id(ctx, as, b1, ids1);                         // [M, U·T, 1], c order
    y = ggml_reshape_3d(ctx, y, as->ne[1], T, U);
    return ggml_cont(ctx, ggml_permute(ctx, y, 0, 2, 1, 3));                       // [M, U, T]
}

// Columns per channel for quantized weights on CUDA: 4, or 1 under DSPARK_CUDA_COLUMNS=1 (read once).
static int64_t cuda_quantized_columns() {
    static const int64_t columns = getenv("DSPARK_CUDA_COLUMNS") && atoi(getenv("DSPARK_CUDA_COLUMNS")) == 1 ? 1 : 4;
    return columns;
}

// A CUDA device's plan (dspark-matmul.h): channels where ggml-cuda has a one-column kernel.
static dspark_mm_plan cuda_plan(ggml_type type, bool id) {
    const bool quantized = ggml_is_quantized(type);
    const bool one_column = quantized || type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    dspark_mm_plan plan;
    if (one_column && (quantized || !id) && !env_says_ggml("DSPARK_DEVICE_MATMUL")) {
        plan.route = dspark_mm_route::channels;
        plan.group = quantized ? cuda_quantized_columns() : 1;
    }
    return plan;
}

size_t dspark_matmul_extra_nodes(const std::vector<ggml_backend_dev_t> & devs, size_t n_matmuls) {
    // per group at most: views of the input and of mm_id's ids, copies of both where misaligned, the
    // matmul and (but for one group) a concatenation
    constexpr size_t PER_GROUP = 6;
    const bool any = std::any_of(devs.begin(), devs.end(), [](ggml_backend_dev_t d) { return d && is_vulkan(d); });
    constexpr size_t PER_QUADS = 4;     // CPU, repacked: two views, our node, a concatenation
    constexpr size_t PER_CHANNELS = 10; // mm_id's: transpose, copies and reshapes of ids, input and output
    return (any ? n_matmuls * PER_GROUP * DSPARK_MM_MAX_GROUPS : 0) + n_matmuls * (PER_QUADS + PER_CHANNELS);
}

dspark_mm_plan dspark_matmul_plan_of(const ggml_tensor * w, bool id) {
    if (!w->buffer) {
        return {};
    }
    if (dspark_matmul_is_packed(w)) {  // in the blocks route's layout: no other route can read it
        dspark_mm_plan plan;
        plan.route = dspark_mm_route::blocks;
        return plan;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(w->buffer);
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);  // none for a mapped file's buffer
    switch (dspark_device_rules_of(dev)) {
        case dspark_device_rules::cuda:   return cuda_plan(w->type, id);
        case dspark_device_rules::other:  return {};
        case dspark_device_rules::vulkan:
            if (dev && !dspark_device_is_cpu(dev)) {  // (the CPU told to build Vulkan's graphs keeps its plans)
                return dspark_matmul_plan_device(dev, w->type, w->ne[0], w->ne[1], id);
            }
            break;
        case dspark_device_rules::cpu: break;
    }
    if (!ggml_get_type_traits_cpu(w->type)->vec_dot) {
        return {};
    }
    if (!ggml_backend_buft_is_host(buft)) {  // a repacked layout (used only where its plan is ggml or quads)
        return ggml_n_dims(w) <= 2 && !id ? dspark_matmul_plan(buft, w->type, w->ne[0], w->ne[1]) : dspark_mm_plan{};
    }
    // a plain layout, whether mapped from the file or copied: one plan
    return dspark_matmul_plan(ggml_backend_dev_buffer_type(dspark_device_cpu()), w->type, w->ne[0], w->ne[1]);
}

const char * dspark_mm_route_name(dspark_mm_route route) {
    switch (route) {
        case dspark_mm_route::ggml: return "ggml";
        case dspark_mm_route::own:  return "own";
        case dspark_mm_route::rows: return "rows";
        case dspark_mm_route::groups: return "groups";
        case dspark_mm_route::quads: return "quads";
        case dspark_mm_route::channels: return "channels";
        case dspark_mm_route::blocks: return "blocks";
    }
    return "?";
}

// ---------------------------------------------------------------------------------------------
// One matmul on the CPU by a named route, for the tests and benchmarks (dspark_cpu_matmul).

static dspark_mm_route cpu_route_by_name(const char * name, ggml_type type, int64_t K, int64_t M) {
    const std::string r = name ? name : "auto";
    if (r == "auto") {
        return dspark_matmul_plan(ggml_backend_dev_buffer_type(dspark_device_cpu()), type, K, M).route;
    }
    if (r == "ggml") {
        return dspark_mm_route::ggml;
    }
    if (!ggml_get_type_traits_cpu(type)->vec_dot) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "the CPU has no single-column kernel for %s", ggml_type_name(type));
    }
    if (r == "rows") {
        return dspark_mm_route::rows;
    }
    if (r == "blocks" || r == "blocks_plain" || r == "own") {
        const bool ok = r == "own" ? dspark_own_dot_available(type, K) : dspark_blocks_available(type, K);
        if (!ok) {
            dspark_throw(DSPARK_STATUS_UNSUPPORTED, "route %s cannot run %s rows of %lld on this CPU (%s)", r.c_str(),
                         ggml_type_name(type), (long long) K, dspark_cpu_isa_name(dspark_cpu_isa_in_use()));
        }
        return r == "own" ? dspark_mm_route::own : dspark_mm_route::blocks;
    }
    dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "unknown matmul route '%s' (auto, blocks, blocks_plain, own, rows, ggml)",
                 r.c_str());
}

std::string dspark_matmul_cpu_run(const char * type_name, const void * w, size_t w_size, int64_t M, int64_t K, const float * x,
                                  int64_t N, float * y, const char * route_name, int n_threads) {
    if (!w || !x || !y || M <= 0 || K <= 0 || N <= 0 || n_threads <= 0) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "dspark_cpu_matmul: bad buffers, sizes or thread count");
    }
    const ggml_type type = dspark_type_by_name(type_name, K);
    if (w_size != ggml_row_size(type, K) * (size_t) M) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "dspark_cpu_matmul: %lld rows of %lld %s values are %zu bytes, got %zu",
                     (long long) M, (long long) K, type_name, ggml_row_size(type, K) * (size_t) M, w_size);
    }
    dspark_mm_route route = cpu_route_by_name(route_name, type, K, M);
    if (route == dspark_mm_route::own && dspark_matmul_plan(ggml_backend_dev_buffer_type(dspark_device_cpu()), type, K, M).own_below <= N &&
        (!route_name || strcmp(route_name, "auto") == 0)) {
        route = dspark_mm_route::ggml;  // the plan's own route hands batches this large to ggml
    }
    // a model's block weights are packed at load (the auto route takes them so too)
    const bool packed = route == dspark_mm_route::blocks && (!route_name || strcmp(route_name, "blocks_plain") != 0);
    ggml_init_params ip = { 5 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_context * w_ctx = ggml_init(ip);  // W alone: packed, it lives in a buffer of its own size
    ggml_tensor * W = ggml_new_tensor_2d(packed ? w_ctx : ctx, type, K, M);
    ggml_tensor * X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    ggml_tensor * Y = route == dspark_mm_route::ggml   ? ggml_mul_mat(ctx, W, X)
                    : route == dspark_mm_route::blocks ? dspark_matmul_blocks(ctx, W, dspark_matmul_blocks_columns(ctx, X, W), packed)
                                                       : dspark_matmul_node(ctx, W, X, route);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, Y);
    ggml_backend_t backend = dspark_backend_init(dspark_device_cpu());
    dspark_backend_set_threads(backend, n_threads);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_buffer_t w_buf = nullptr;
    if (packed) {
        const size_t size = dspark_blocks_packed_size(type, K, M);
        w_buf = ggml_backend_buft_alloc_buffer(ggml_backend_get_default_buffer_type(backend), size);
        if (w_buf && ggml_backend_tensor_alloc(w_buf, W, ggml_backend_buffer_get_base(w_buf)) == GGML_STATUS_SUCCESS) {
            dspark_blocks_pack(type, (const char *) w, ggml_row_size(type, K), K, M, W->data);
        }
    }
    ggml_status status = GGML_STATUS_ALLOC_FAILED;
    if (buf && (!packed || W->data)) {
        if (!packed) {
            ggml_backend_tensor_set(W, w, 0, w_size);
        }
        ggml_backend_tensor_set(X, x, 0, sizeof(float) * (size_t) (K * N));
        status = ggml_backend_graph_compute(backend, gf);
        if (status == GGML_STATUS_SUCCESS) {
            ggml_backend_tensor_get(Y, y, 0, sizeof(float) * (size_t) (M * N));
        }
    }
    if (buf) {
        ggml_backend_buffer_free(buf);
    }
    if (w_buf) {
        ggml_backend_buffer_free(w_buf);
    }
    ggml_backend_free(backend);
    ggml_free(w_ctx);
    ggml_free(ctx);
    if (status != GGML_STATUS_SUCCESS) {
        dspark_throw(DSPARK_STATUS_OUT_OF_MEMORY, "dspark_cpu_matmul: the graph did not run (%d)", (int) status);
    }
    return dspark_mm_route_name(route);
}
