#include "dspark-context.h"

#include "dspark-backend.h"
#include "dspark-impl.h"
#include "dspark-matmul.h"
#include "dspark-rpc.h"
#include "dspark-sampler.h"
#include "models/target-graph.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

ggml_type dspark_kv_ggml_type(int32_t t) {
    switch (t) {
        case DSPARK_KV_TYPE_F16:  return GGML_TYPE_F16;
        case DSPARK_KV_TYPE_F32:  return GGML_TYPE_F32;
        case DSPARK_KV_TYPE_BF16: return GGML_TYPE_BF16;
        case DSPARK_KV_TYPE_Q8_0: return GGML_TYPE_Q8_0;
        default: dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "unknown KV cache type %d (0=f16, 1=f32, 2=bf16, 3=q8_0)", t);
    }
}

void dspark_check_kv_type(ggml_type type, int head_dim) {
    if (head_dim % ggml_blck_size(type) != 0) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "KV cache type %s stores blocks of %lld values; this model's head_dim (%d) "
                     "is not a multiple of it: use f16, bf16 or f32", ggml_type_name(type), (long long) ggml_blck_size(type), head_dim);
    }
}

dspark_context_params dspark_resolve_context_params(const dspark_context_params & in, int n_ctx_train) {
    dspark_context_params p = in;
    if (p.n_ctx == 0) {
        p.n_ctx = (uint32_t) n_ctx_train;
    }
    if (p.n_batch == 0) {
        p.n_batch = 512;
    }
    if (p.n_seq_max == 0) {
        p.n_seq_max = 1;
    }
    if (p.n_threads <= 0) {
        p.n_threads = (int32_t) std::min<unsigned>(GGML_MAX_N_THREADS, std::max(1u, std::thread::hardware_concurrency()));
    }
    if (p.n_threads > GGML_MAX_N_THREADS) {  // ggml's thread pool has room for no more
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "n_threads = %d exceeds the maximum of %d", p.n_threads, GGML_MAX_N_THREADS);
    }
    if (p.n_seq_max > DSPARK_MAX_SEQ) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "n_seq_max = %u exceeds the maximum of %d", p.n_seq_max, DSPARK_MAX_SEQ);
    }
    if (p.n_ctx < 1 || p.n_ctx > (1u << 24)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "n_ctx = %u is out of range (1 .. 16777216)", p.n_ctx);
    }
    p.n_batch = std::min(p.n_batch, p.n_ctx);
    if (p.n_outputs_max_per_seq > p.n_batch) {
        p.n_outputs_max_per_seq = p.n_batch;
    }
    if (p.flash_attn < DSPARK_FLASH_ATTN_AUTO || p.flash_attn > DSPARK_FLASH_ATTN_ON) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "flash_attn must be -1 (auto), 0 or 1");
    }
    dspark_kv_ggml_type(p.type_kv);  // validates
    return p;
}

// Does the device run flash attention for these head and cache types?
static bool flash_attn_supported(const dspark_compute & c, int head_dim, int n_head, int n_head_kv, ggml_type kv_type) {
    ggml_init_params ip = { /*.mem_size =*/ 8 * ggml_tensor_overhead(), nullptr, /*.no_alloc =*/ true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, 1, n_head);
    ggml_tensor * k = ggml_new_tensor_3d(ctx, kv_type, head_dim, 32, n_head_kv);
    ggml_tensor * v = ggml_new_tensor_3d(ctx, kv_type, head_dim, 32, n_head_kv);
    ggml_tensor * m = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 32, 1);
    ggml_tensor * fa = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f, 0.0f, 0.0f);
    const bool ok = c.device_supports(fa);
    ggml_free(ctx);
    return ok;
}

dspark_context::dspark_context(dspark_model & m, const dspark_context_params & p) : dspark_runtime(m) {
    if (!model.target) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "%s: not a target model", model.path().c_str());
    }
    params = dspark_resolve_context_params(p, hp().n_ctx_train);
    const uint32_t per_seq = params.n_outputs_max_per_seq ? params.n_outputs_max_per_seq : params.n_batch;
    n_outputs_max = std::min<uint32_t>(params.n_batch, per_seq * params.n_seq_max);

    // node budget: the layers (MoE and Gemma-4 layers take about twice the nodes of a plain one),
    // plus the in-graph sampler (engine backend sampling), plus what splitting the matmuls of a
    // batch takes on a device (dspark-matmul.h; up to a dozen matmuls a layer, and the head and
    // input projections)
    dspark_rpc_check_alive(model.devices());
    compute.init(model.device(), params.n_threads,
                 (size_t) 256 + (size_t) hp().n_layer * 128 + dspark_sampler_graph_size() +
                     dspark_matmul_extra_nodes(model.devices(), (size_t) hp().n_layer * 12 + 4),
                 model.devices());
    compute.set_batch_invariant(params.batch_invariant);
    const ggml_type kv_type = dspark_kv_ggml_type(params.type_kv);
    for (const target_layer & l : model.target->layers) {
        dspark_check_kv_type(kv_type, l.head_dim);
    }
    kv.init(model.layer_buffer_types((int) hp().n_layer), model.target->kv_widths(), kv_type, params.n_ctx, params.n_seq_max);
    flash_attn = params.flash_attn == DSPARK_FLASH_ATTN_ON;
    if (params.flash_attn == DSPARK_FLASH_ATTN_AUTO) {
        flash_attn = true;
        for (const target_layer & l : model.target->layers) {
            flash_attn = flash_attn && flash_attn_supported(compute, l.head_dim, hp().n_head, l.n_head_kv, kv_type);
        }
    }
    params.flash_attn = flash_attn ? DSPARK_FLASH_ATTN_ON : DSPARK_FLASH_ATTN_OFF;
    pad_odd_columns = dspark_device_is_cpu(model.device());
    rules = dspark_device_rules_of(model.device());
    for (ggml_tensor * k : kv.k) {
        device_cache = device_cache || (k && !dspark_graph_cache_on_host(k));
        host_cache = host_cache || (k && dspark_graph_cache_on_host(k));
    }
    logits.resize((size_t) n_outputs_max * hp().n_vocab);
    reserve_worst_case();
}

// On a device, attention runs in sequence order (dspark_graph::attention_in_order) for batches of at
// most this many query rows (query columns times heads): its scores take n·rows floats, where ggml's
// flash attention keeps none, so a long prompt is better off with the latter. Decode steps and verify
// blocks stay far below it. DSPARK_DEVICE_ATTENTION=ggml keeps ggml's attention for every batch.
constexpr int IN_ORDER_MAX_ROWS = 4096;

bool dspark_context::in_order_possible() const {
    static const bool off = getenv("DSPARK_DEVICE_ATTENTION") && strcmp(getenv("DSPARK_DEVICE_ATTENTION"), "ggml") == 0;
    return !off && (device_cache || rules != dspark_device_rules::cpu);
}

bool dspark_context::in_order_by_channels() const {
    return rules == dspark_device_rules::cuda;
}

// Cells per slot: whole blocks of 256, so that a graph serves 256 lengths; by channels whole blocks
// of 512 and at least 1024 (dspark_graph::in_order_by_channels: ggml-cuda's softmax and mmvf then
// add a row's cells in one order, whatever its length).
static int in_order_cells(size_t longest, bool by_channels) {
    const size_t block = by_channels ? 512 : 256, least = by_channels ? 1024 : 256;
    return (int) std::max<size_t>(least, (longest + block - 1) / block * block);
}

// The most tokens one slot of `order` has in the batch.
static int most_per_slot(const dspark_kv_seq_cells & order) {
    std::vector<int> count(order.seqs.size(), 0);
    int most = 0;
    for (int32_t s : order.slot) {
        most = std::max(most, ++count[(size_t) s]);
    }
    return most;
}

// Whether the batch's tokens already are the by-channels layout: slot s's per_slot tokens at s·per_slot...
static bool in_batch_order(const dspark_kv_seq_cells & order, int per_slot) {
    if ((int) order.slot.size() != (int) order.seqs.size() * per_slot) {
        return false;
    }
    for (size_t t = 0; t < order.slot.size(); ++t) {
        if (order.slot[t] != (int32_t) (t / (size_t) per_slot)) {
            return false;
        }
    }
    return true;
}

target_in_order_shape dspark_context::in_order_shape(const dspark_kv_seq_cells & order) const {
    target_in_order_shape shape;
    const int slots = (int) order.seqs.size();
    const int per_slot = in_order_by_channels() ? most_per_slot(order) : 0;
    const int queries = per_slot > 0 ? slots * per_slot : (int) order.slot.size();
    if (slots > 0 && queries * (int) hp().n_head <= IN_ORDER_MAX_ROWS) {
        shape = {in_order_cells(order.longest(), per_slot > 0), slots, per_slot,
                 per_slot > 0 && in_batch_order(order, per_slot), !device_cache};
    }
    return shape;
}

void dspark_context::reserve_worst_case() {
    ggml_context * ctx = compute.begin();
    ggml_cgraph * gf = compute.new_graph(ctx);
    dspark_graph g = {ctx, gf, pad_odd_columns};
    build_target_graph(g, *model.target, kv, (int) params.n_batch, (int) n_outputs_max, (int) params.n_ctx, capture,
                       flash_attn);
    compute.reserve(gf);
    const int T = std::min((int) params.n_batch, IN_ORDER_MAX_ROWS / (int) hp().n_head);
    if (in_order_possible() && T > 0) {  // the largest batch in sequence order, one sequence
        const bool by_channels = in_order_by_channels();
        const target_in_order_shape shape = {in_order_cells(params.n_ctx, by_channels), 1, by_channels ? T : 0, false,
                                             !device_cache};
        ctx = compute.begin();
        gf = compute.new_graph(ctx);
        g = {ctx, gf, pad_odd_columns};
        build_target_graph(g, *model.target, kv, T, std::min(T, (int) n_outputs_max), (int) params.n_ctx, capture,
                           flash_attn, nullptr, shape);
        compute.reserve(gf);
    }
}

// The inputs of by-channels attention: the query column of each token (slot·R + its rank among its
// slot's tokens), the token of each column (an unused column repeats its slot's first token, so it
// computes a real row, which nothing reads), and the mask rows of the columns.
static void fill_in_order_columns(const dspark_kv_seq_cells & order, int per_slot, int n, const std::vector<float> & mask_rows,
                                  std::vector<int32_t> & columns, std::vector<int32_t> & rows, std::vector<float> & mask) {
    const int T = (int) order.slot.size(), C = (int) order.seqs.size() * per_slot;
    columns.assign((size_t) C, -1);
    rows.assign((size_t) T, 0);
    std::vector<int> count(order.seqs.size(), 0);
    for (int t = 0; t < T; ++t) {
        const int s = order.slot[(size_t) t];
        rows[(size_t) t] = s * per_slot + count[(size_t) s]++;
        columns[(size_t) rows[(size_t) t]] = t;
    }
    for (int c = 0; c < C; ++c) {
        if (columns[(size_t) c] < 0) {
            columns[(size_t) c] = columns[(size_t) (c - c % per_slot)];
        }
    }
    mask.resize((size_t) C * n);
    for (int c = 0; c < C; ++c) {
        std::copy_n(mask_rows.begin() + (size_t) columns[(size_t) c] * n, n, mask.begin() + (size_t) c * n);
    }
}

void dspark_context::set_in_order_inputs(const target_in_order & io, const dspark_kv_seq_cells & order,
                                         const dspark_batch & b) const {
    const int T = b.n_tokens, H = (int) hp().n_head;
    std::vector<int32_t> cells((size_t) io.n_v * io.slots);
    dspark_kv_cache::fill_in_order_cells(order, (uint32_t) io.n, cells.data());
    dspark_set_input(io.cells_k, cells.data(), sizeof(int32_t) * io.n * io.slots);
    if (io.cells_v) {
        dspark_kv_cache::fill_in_order_cells(order, (uint32_t) io.n_v, cells.data());
        dspark_set_input(io.cells_v, cells.data(), sizeof(int32_t) * io.n_v * io.slots);
    }
    std::vector<float> mask((size_t) io.n * T);
    std::vector<int32_t> columns, rows;
    std::vector<float> column_mask;
    for (ggml_tensor * input : {io.mask, io.mask_swa}) {
        if (!input) {
            continue;
        }
        dspark_kv_mask_params mp;
        mp.n_swa = input == io.mask_swa ? hp().n_swa : 0;
        kv.fill_in_order_mask(order, (uint32_t) io.n, T, b.pos, mp, mask.data());
        if (io.columns) {
            fill_in_order_columns(order, (int) io.per_slot, (int) io.n, mask, columns, rows, column_mask);
            dspark_set_input(input, column_mask.data(), column_mask.size() * sizeof(float));
        } else {
            dspark_set_input(input, mask.data(), mask.size() * sizeof(float));
        }
    }
    if (io.columns) {
        dspark_set_input(io.columns, columns.data(), columns.size() * sizeof(int32_t));
        dspark_set_input(io.rows, rows.data(), rows.size() * sizeof(int32_t));
    }
    if (io.per_slot > 0) {
        return;
    }
    std::vector<int32_t> heads((size_t) H * T);
    for (const auto & h : io.heads) {
        const int Hkv = h.first;
        for (int t = 0; t < T; ++t) {
            for (int q = 0; q < H; ++q) {
                heads[(size_t) t * H + q] = order.slot[t] * Hkv + q / (H / Hkv);
            }
        }
        dspark_set_input(h.second, heads.data(), heads.size() * sizeof(int32_t));
    }
}

void dspark_context::set_capture(const std::vector<int32_t> & ids) {
    for (int32_t id : ids) {
        if (id < 0 || id > hp().n_layer) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "layer id %d out of range: this model has layers 0..%d "
                         "(%d = the input of the final norm)", id, hp().n_layer, hp().n_layer);
        }
    }
    capture = ids;
    captured.assign((size_t) params.n_batch * ids.size() * hp().n_embd, 0.0f);
    n_captured = 0;
    reserve_worst_case();
}

void dspark_context::validate(const dspark_batch & b, int32_t & n_out) const {
    if (b.n_tokens < 1 || (uint32_t) b.n_tokens > params.n_batch) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "batch of %d tokens: must be 1 .. n_batch (%u)", b.n_tokens, params.n_batch);
    }
    if (!b.token || !b.pos || !b.seq_id) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "batch token, pos and seq_id arrays are required");
    }
    std::vector<int32_t> last_pos(params.n_seq_max, -2);
    std::vector<uint32_t> outs(params.n_seq_max, 0);
    n_out = 0;
    for (int32_t i = 0; i < b.n_tokens; ++i) {
        const int32_t tok = b.token[i], pos = b.pos[i], seq = b.seq_id[i];
        if (tok < 0 || tok >= hp().n_vocab) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "token %d at batch index %d is outside the vocabulary (0 .. %d)", tok, i, hp().n_vocab - 1);
        }
        if (seq < 0 || (uint32_t) seq >= params.n_seq_max) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence id %d at batch index %d: must be 0 .. n_seq_max-1 (%u)", seq, i, params.n_seq_max - 1);
        }
        if (pos < 0 || (uint32_t) pos >= params.n_ctx) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "position %d at batch index %d: must be 0 .. n_ctx-1 (%u)", pos, i, params.n_ctx - 1);
        }
        if (last_pos[seq] == -2) {
            last_pos[seq] = kv.seq_pos_max(seq);
        }
        if (pos <= last_pos[seq]) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "position %d of sequence %d at batch index %d: positions must increase "
                         "and follow the cached ones (last is %d; remove cells with kv_seq_rm first)", pos, seq, i, last_pos[seq]);
        }
        last_pos[seq] = pos;
        const bool out = b.output ? b.output[i] != 0 : i == b.n_tokens - 1;
        if (out) {
            n_out++;
            outs[seq]++;
            if (params.n_outputs_max_per_seq && outs[seq] > params.n_outputs_max_per_seq) {
                dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence %d asks for %u outputs in one batch, above n_outputs_max_per_seq (%u)",
                             seq, outs[seq], params.n_outputs_max_per_seq);
            }
        }
    }
    if ((uint32_t) n_out > n_outputs_max) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "batch asks for %d outputs, above the context's maximum (%u)", n_out, n_outputs_max);
    }
}

void dspark_context::decode(const dspark_batch & b, const dspark_sampler_rows * sampling) {
    int32_t n_out = 0;
    validate(b, n_out);
    std::vector<int32_t> slots;
    if (!kv.find_slots((uint32_t) b.n_tokens, slots, b.seq_id, b.pos)) {
        dspark_throw(DSPARK_STATUS_CONTEXT_FULL, "the KV cache is full: %u of %u cells used, the batch needs %d",
                     kv.n_used(), kv.n_cells, b.n_tokens);
    }
    // The batch's own cells take part in its attention: claim them now, give them back on failure.
    kv.commit(slots, b.pos, b.seq_id, b.token);  // the tokens let a later request reuse the cells
    try {
        run(b, slots, n_out, sampling);
    } catch (...) {
        kv.release(slots);
        n_outputs = 0;
        n_captured = 0;
        throw;
    }
}

void dspark_context::run(const dspark_batch & b, const std::vector<int32_t> & slots, int32_t n_out,
                         const dspark_sampler_rows * sampling) {
    const int T = b.n_tokens;
    const int n_kv = (int) kv.n_kv();
    if (sampling && sampling->size() != (size_t) n_out) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "in-graph sampling of %zu rows for %d outputs", sampling->size(), n_out);
    }

    dspark_kv_seq_cells order;  // empty: ggml's attention
    target_in_order_shape in_order;
    if (in_order_possible()) {
        order = kv.seq_cells(T, b.seq_id);
        in_order = in_order_shape(order);
    }
    // when every layer attends in sequence order, no graph reads the mask over the whole cache: one
    // graph then serves every cache extent within its 256-cell blocks
    const bool all_in_order = in_order.cells > 0 && (in_order.host_too || !host_cache);
    target_graph_key key;
    key.n_tokens = T;
    key.n_outputs = n_out;
    key.n_kv = all_in_order ? 1 : n_kv;
    key.in_order = in_order;
    key.capture = capture;
    key.sampled = sampling != nullptr;
    if (sampling) {
        key.sampler = sampling->shape(hp().n_vocab);
    }
    ggml_cgraph * gf = graph_for(graph, key, [&](const dspark_graph & g) {
        cached_io = build_target_graph(g, *model.target, kv, T, n_out, key.n_kv, capture, flash_attn,
                                       key.sampled ? &key.sampler : nullptr, key.in_order);
    });
    const target_graph & io = cached_io;
    if (sampling) {
        dspark_set_sampler_inputs(io.sampler, *sampling, key.sampler, hp().n_vocab,
                                  sampling->adjust.empty() ? nullptr : sampling->adjust.data());
    }

    dspark_set_input(io.tokens, b.token, sizeof(int32_t) * T);
    dspark_set_input(io.pos, b.pos, sizeof(int32_t) * T);
    std::vector<int64_t> idx(slots.begin(), slots.end());
    dspark_set_input(io.kv_idx, idx.data(), sizeof(int64_t) * T);
    if (!all_in_order) {
        std::vector<ggml_fp16_t> mask((size_t) n_kv * T);
        kv.fill_mask(mask.data(), n_kv, T, b.pos, b.seq_id, dspark_kv_mask_params());
        dspark_set_input(io.mask, mask.data(), mask.size() * sizeof(ggml_fp16_t));
        if (io.mask_swa) {
            dspark_kv_mask_params swa;
            swa.n_swa = hp().n_swa;
            kv.fill_mask(mask.data(), n_kv, T, b.pos, b.seq_id, swa);
            dspark_set_input(io.mask_swa, mask.data(), mask.size() * sizeof(ggml_fp16_t));
        }
    }
    if (io.in_order.n > 0) {
        set_in_order_inputs(io.in_order, order, b);
    }
    if (io.out_ids) {
        std::vector<int32_t> rows;
        for (int i = 0; i < T; ++i) {
            if (b.output ? b.output[i] != 0 : i == T - 1) {
                rows.push_back(i);
            }
        }
        dspark_set_input(io.out_ids, rows.data(), sizeof(int32_t) * rows.size());
    }

    compute.compute(gf);

    has_sampled = io.sampler.tokens != nullptr;
    if (has_sampled) {
        sampled.resize(n_out);
        ggml_backend_tensor_get(io.sampler.tokens, sampled.data(), 0, sizeof(int32_t) * n_out);
        if (io.sampler.probed) {
            probed.resize(n_out);
            ggml_backend_tensor_get(io.sampler.probed, probed.data(), 0, sizeof(float) * n_out);
        }
    } else {
        ggml_backend_tensor_get(io.logits, logits.data(), 0, sizeof(float) * (size_t) n_out * hp().n_vocab);
    }
    if (io.captured) {
        ggml_backend_tensor_get(io.captured, captured.data(), 0, ggml_nbytes(io.captured));
    }
    n_outputs = n_out;
    n_captured = io.captured ? T : 0;
}

void dspark_context::logits_row(int32_t row, float * out) const {
    if (!has_sampled || !graph.valid(compute) || !cached_io.sampler.probed || row < 0 || row >= n_outputs) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "logits of output row %d are not kept", row);
    }
    dspark_rpc_check_alive(compute.devices);
    const size_t size = cached_io.logits->nb[1];
    ggml_backend_tensor_get(cached_io.logits, out, size * (size_t) row, size);
}
