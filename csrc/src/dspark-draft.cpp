#include "dspark-draft.h"

#include "dspark-backend.h"
#include "dspark-context.h"
#include "dspark-impl.h"
#include "dspark-matmul.h"
#include "dspark-rpc.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

// ggml-vulkan 0.25.3 on lavapipe: when the target's and the draft's graphs alternate on one Vulkan
// device, the draft's graphs crash the driver now and then (a segfault in a worker thread, or heap
// corruption: an out-of-bounds write). Submitting them node by node, each waited for, never did
// in our runs; each model alone on the device, or the draft on another device, never crashed.
static bool vulkan_shared_with_target(const dspark_model & m) {
    ggml_backend_dev_t dev = m.device();
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    const bool vulkan = reg && std::string(ggml_backend_reg_name(reg)) == "Vulkan";
    return vulkan && m.borrowed && m.borrowed->device() == dev && !getenv("DSPARK_VK_NO_NODE_SYNC");
}

dspark_draft_context::dspark_draft_context(dspark_model & m, const dspark_context_params & p) : dspark_runtime(m) {
    if (!model.draft) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "%s: not a DFlash/DSpark draft model", model.path().c_str());
    }
    params = dspark_resolve_context_params(p, hp().n_ctx_train);
    // a block of every sequence must fit next to a full context: its cells are temporary
    const uint32_t n_cells = params.n_ctx + params.n_seq_max * (uint32_t) hp().block_size;
    dspark_rpc_check_alive(model.devices());
    // node budget: the layers, per block slot the Markov chain's step and an in-graph sampler, and
    // what splitting the matmuls of a batch takes on a device (dspark-matmul.h)
    compute.init(model.device(), params.n_threads,
                 (size_t) 512 + (size_t) hp().n_layer * 64 + (size_t) hp().block_size * (128 + dspark_sampler_graph_size()) +
                     dspark_matmul_extra_nodes(model.devices(), (size_t) hp().n_layer * 12 + 4),
                 model.devices());
    compute.set_batch_invariant(params.batch_invariant);  // the same kernels as its target's
    const ggml_type kv_type = dspark_kv_ggml_type(params.type_kv);
    dspark_check_kv_type(kv_type, hp().head_dim);
    kv.init(model.layer_buffer_types((int) hp().n_layer), std::vector<int64_t>(hp().n_layer, hp().n_embd_kv()), kv_type,
            n_cells, params.n_seq_max);
    flash_attn = params.flash_attn != DSPARK_FLASH_ATTN_OFF;  // CPU and GPU backends run it for these shapes
    params.flash_attn = flash_attn ? DSPARK_FLASH_ATTN_ON : DSPARK_FLASH_ATTN_OFF;
    pad_odd_columns = dspark_device_is_cpu(model.device());
    if (vulkan_shared_with_target(model)) {
        compute.sync_every_node();
    }

    if (!model.d2t.empty()) {
        upload_vocab_maps();
    }
    reserve_worst_case();
}

dspark_draft_context::~dspark_draft_context() {
    if (maps_buf) {
        ggml_backend_buffer_free(maps_buf);
    }
    if (maps_ctx) {
        ggml_free(maps_ctx);
    }
}

// d2t (draft id -> target id), its inverse t2d (target id -> draft id) and the mask of the target
// ids the draft lacks, in a buffer of the compute device.
void dspark_draft_context::upload_vocab_maps() {
    const std::vector<int32_t> & d2t = model.d2t;
    std::vector<int32_t> t2d(hp().n_vocab, 0);
    std::vector<float> mask(hp().n_vocab, -INFINITY);
    for (size_t j = 0; j < d2t.size(); ++j) {
        t2d[d2t[j]] = (int32_t) j;
        mask[d2t[j]] = 0.0f;
    }
    ggml_init_params ip = { /*.mem_size =*/ 3 * ggml_tensor_overhead(), nullptr, /*.no_alloc =*/ true };
    maps_ctx = ggml_init(ip);
    vocab_maps.d2t = ggml_new_tensor_2d(maps_ctx, GGML_TYPE_I32, 1, (int64_t) d2t.size());
    vocab_maps.t2d = ggml_new_tensor_1d(maps_ctx, GGML_TYPE_I32, (int64_t) t2d.size());
    vocab_maps.mask = ggml_new_tensor_1d(maps_ctx, GGML_TYPE_F32, (int64_t) mask.size());
    maps_buf = ggml_backend_alloc_ctx_tensors_from_buft(maps_ctx, ggml_backend_get_default_buffer_type(compute.backend));
    if (!maps_buf) {
        dspark_throw(DSPARK_STATUS_OUT_OF_MEMORY, "cannot allocate the reduced vocabulary's tables");
    }
    ggml_backend_tensor_set(vocab_maps.d2t, d2t.data(), 0, ggml_nbytes(vocab_maps.d2t));
    ggml_backend_tensor_set(vocab_maps.t2d, t2d.data(), 0, ggml_nbytes(vocab_maps.t2d));
    ggml_backend_tensor_set(vocab_maps.mask, mask.data(), 0, ggml_nbytes(vocab_maps.mask));
}

void dspark_draft_context::reserve_worst_case() {
    ggml_context * ctx = compute.begin();
    ggml_cgraph * gf = compute.new_graph(ctx);
    dspark_graph g = {ctx, gf, pad_odd_columns};
    build_dflash_block(g, *model.draft, kv, vocab_maps, (int) params.n_seq_max, hp().block_size, (int) kv.n_cells, flash_attn,
                       false, dflash_pick());
    compute.reserve(gf);
}

// ---- injection ----------------------------------------------------------------------------------

// Check feature rows; `last` tracks each sequence's last position (-2 = not looked up yet).
void dspark_draft_context::validate_inject(const float * features, int32_t n_rows, int32_t width, const dspark_pos * pos,
                                           const dspark_seq_id * seq, std::vector<int32_t> & last) const {
    const int32_t want = hp().feature_width();
    if (width != want) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "feature rows have width %d, the draft expects %zu layers x %d = %d",
                     width, hp().target_layers.size(), hp().n_embd, want);
    }
    if (n_rows < 1 || (uint32_t) n_rows > params.n_batch || !features || !pos || !seq) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "inject: need 1 .. n_batch (%u) rows with positions and sequence ids", params.n_batch);
    }
    for (int32_t i = 0; i < n_rows; ++i) {
        if (seq[i] < 0 || (uint32_t) seq[i] >= params.n_seq_max) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence id %d at row %d: must be 0 .. %u", seq[i], i, params.n_seq_max - 1);
        }
        if (pos[i] < 0 || (uint32_t) pos[i] >= params.n_ctx) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "position %d at row %d: must be 0 .. n_ctx-1 (%u)", pos[i], i, params.n_ctx - 1);
        }
        if (last[seq[i]] == -2) {
            last[seq[i]] = kv.seq_pos_max(seq[i]);
        }
        if (pos[i] <= last[seq[i]]) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "position %d of sequence %d: features must follow the injected ones (last %d)",
                         pos[i], seq[i], last[seq[i]]);
        }
        last[seq[i]] = pos[i];
    }
}

void dspark_draft_context::inject(const float * features, int32_t n_rows, int32_t width, const dspark_pos * pos,
                                  const dspark_seq_id * seq, const dspark_token * tokens) {
    std::vector<int32_t> last(params.n_seq_max, -2);
    validate_inject(features, n_rows, width, pos, seq, last);
    std::vector<int32_t> slots;
    if (!kv.find_slots((uint32_t) n_rows, slots, seq, pos)) {
        dspark_throw(DSPARK_STATUS_CONTEXT_FULL, "the draft KV cache is full (%u of %u cells used)", kv.n_used(), kv.n_cells);
    }
    kv.commit(slots, pos, seq, tokens);
    try {
        ggml_context * ctx = compute.begin();
        ggml_cgraph * gf = compute.new_graph(ctx);
        dspark_graph g = {ctx, gf, pad_odd_columns};
        dflash_inject_graph io = build_dflash_inject(g, *model.draft, kv, n_rows);
        compute.alloc(gf);
        dspark_set_input(io.feat, features, sizeof(float) * (size_t) n_rows * width);
        dspark_set_input(io.pos, pos, sizeof(int32_t) * n_rows);
        std::vector<int64_t> idx(slots.begin(), slots.end());
        dspark_set_input(io.kv_idx, idx.data(), sizeof(int64_t) * n_rows);
        compute.compute(gf);
    } catch (...) {
        kv.release(slots);
        throw;
    }
}

// ---- propose ------------------------------------------------------------------------------------

void dspark_draft_context::validate_propose(const dspark_propose_request & r, std::vector<int32_t> & last) const {
    if (r.n_seqs < 1 || (uint32_t) r.n_seqs > params.n_seq_max || !r.anchors || !r.pos0 || !r.seq_ids) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "propose: need 1 .. n_seq_max (%u) sequences with anchors, positions and ids",
                     params.n_seq_max);
    }
    if (r.n_draft < 1 || r.n_draft > hp().max_draft()) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "n_draft = %d: this draft proposes 1 .. %d tokens per block (block_size %d, %s)",
                     r.n_draft, hp().max_draft(), hp().block_size,
                     hp().first_pred_slot() == 0 ? "anchor-first" : "anchor + masks");
    }
    if (r.sample && (!r.samplers || !r.seeds)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampling needs a sampler and a seed per block");
    }
    for (int32_t i = 0; r.sample && i < r.n_seqs; ++i) {
        const dspark_sampler_params & sp = r.samplers[i];
        if (!(sp.temperature >= 0.0f) || !std::isfinite(sp.temperature) || sp.top_k < 0 || !(sp.top_p > 0.0f && sp.top_p <= 1.0f) ||
            !(sp.min_p >= 0.0f && sp.min_p <= 1.0f)) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampler of block %d: need a finite temperature >= 0, top_k >= 0, "
                         "0 < top_p <= 1, 0 <= min_p <= 1", i);
        }
    }
    std::set<int32_t> seen;
    const int B = block_len(r.n_draft);
    for (int32_t i = 0; i < r.n_seqs; ++i) {
        const int32_t s = r.seq_ids[i];
        if (s < 0 || (uint32_t) s >= params.n_seq_max || !seen.insert(s).second) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence id %d: must be unique and 0 .. %u", s, params.n_seq_max - 1);
        }
        if (r.anchors[i] < 0 || r.anchors[i] >= hp().n_vocab) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "anchor token %d of sequence %d is outside the vocabulary", r.anchors[i], s);
        }
        if (r.pos0[i] < 0 || (int64_t) r.pos0[i] + B > (int64_t) params.n_ctx) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "a block at position %d of sequence %d does not fit in n_ctx (%u)", r.pos0[i], s,
                         params.n_ctx);
        }
        if (last[s] == -2) {
            last[s] = kv.seq_pos_max(s);
        }
        if (last[s] >= r.pos0[i]) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence %d has injected cells at positions >= the anchor position %d; "
                         "remove them with seq_rm first", s, r.pos0[i]);
        }
    }
}

void dspark_draft_context::propose(const dspark_propose_request & r) {
    std::vector<int32_t> last(params.n_seq_max, -2);  // pending injections count as injected
    if (r.n_inject > 0) {
        const int32_t width = hp().feature_width();
        validate_inject(r.inject_features, r.n_inject, width, r.inject_pos, r.inject_seq, last);
    }
    validate_propose(r, last);
    const int B = block_len(r.n_draft);
    const int n_tok = B * r.n_seqs;
    std::vector<int32_t> pos(n_tok), seq(n_tok);
    for (int32_t b = 0; b < r.n_seqs; ++b) {
        for (int i = 0; i < B; ++i) {
            pos[b * B + i] = r.pos0[b] + i;
            seq[b * B + i] = r.seq_ids[b];
        }
    }
    // A step injects at most n_draft + 1 rows per sequence: padding them to that many makes
    // consecutive steps one graph shape (reused); the padding rows write cells left empty.
    int32_t n_rows = r.n_inject;
    const int32_t step_rows = r.n_seqs * (r.n_draft + 1);
    // the sequence of each cell wanted: the injected rows', padding (any cell), the blocks'
    auto owners = [&](int32_t rows, bool positions) {
        std::vector<int32_t> o(positions ? r.inject_pos : r.inject_seq, (positions ? r.inject_pos : r.inject_seq) + r.n_inject);
        o.resize(rows, positions ? 0 : -1);
        o.insert(o.end(), positions ? pos.begin() : seq.begin(), positions ? pos.end() : seq.end());
        return o;
    };
    std::vector<int32_t> slots;
    if (r.n_inject > 0 && r.n_inject < step_rows &&
        kv.find_slots((uint32_t) (step_rows + n_tok), slots, owners(step_rows, false).data(), owners(step_rows, true).data())) {
        n_rows = step_rows;
    } else if (!kv.find_slots((uint32_t) (r.n_inject + n_tok), slots, owners(r.n_inject, false).data(),
                              owners(r.n_inject, true).data())) {
        dspark_throw(DSPARK_STATUS_CONTEXT_FULL, "the draft KV cache has no room for the context rows and the blocks");
    }
    const std::vector<int32_t> inj_slots(slots.begin(), slots.begin() + n_rows);  // real rows first
    const std::vector<int32_t> block_slots(slots.begin() + n_rows, slots.end());
    // Injected cells stay; the block's own cells are temporary: claimed for this decode only.
    kv.commit(std::vector<int32_t>(inj_slots.begin(), inj_slots.begin() + r.n_inject), r.inject_pos, r.inject_seq,
              r.inject_tokens);
    kv.commit(block_slots, pos.data(), seq.data());
    try {
        run_propose(r, inj_slots, block_slots);
    } catch (...) {
        kv.release(std::vector<int32_t>(inj_slots.begin(), inj_slots.begin() + r.n_inject));
        kv.release(block_slots);
        n_seqs = 0;
        throw;
    }
    kv.release(block_slots);
}

// Uniforms in (0, 1) from a 64-bit generator: 53 random bits and half a step (never 0 or 1).
static float open_uniform(std::mt19937_64 & rng) {
    return (float) (((double) (rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0));
}

// Per slot, block-major: its block's sampler and a uniform from the block's own seeded stream.
dspark_sampler_rows dspark_draft_context::sampler_rows(const dspark_propose_request & r) const {
    dspark_sampler_rows rows;
    for (int32_t b = 0; b < r.n_seqs; ++b) {
        const dspark_sampler_params & sp = r.samplers[b];
        std::mt19937_64 rng(r.seeds[b]);
        for (int j = 0; j < r.n_draft; ++j) {
            rows.add(sp, sp.greedy() ? 0.5f : open_uniform(rng));
        }
    }
    return rows;
}

void dspark_draft_context::run_propose(const dspark_propose_request & r, const std::vector<int32_t> & inj_slots,
                                       const std::vector<int32_t> & slots) {
    const int B = block_len(r.n_draft);
    const int n_tok = B * r.n_seqs;
    const int n_kv = (int) kv.n_kv();

    const int n_rows = (int) inj_slots.size();  // the real context rows, then padding
    draft_graph_key key;
    key.n_rows = n_rows;
    key.n_seqs = r.n_seqs;
    key.block_len = B;
    key.n_kv = n_kv;
    key.logits = r.want_logits || r.keep_logits;
    const dspark_sampler_rows rows = r.sample ? sampler_rows(r) : dspark_sampler_rows();
    if (r.sample) {
        key.sampler = rows.shape(hp().n_vocab_draft);
    }
    key.markov_top_k = r.markov_top_k;
    ggml_cgraph * gf = graph_for(graph, key, [&](const dspark_graph & g) {
        // the context rows are written to the cache before the block reads it (graph order)
        cached_inj = key.n_rows > 0 ? build_dflash_inject(g, *model.draft, kv, key.n_rows) : dflash_inject_graph();
        dflash_pick pick;
        pick.sampler = key.sampler;
        pick.markov_top_k = key.markov_top_k;
        cached_io = build_dflash_block(g, *model.draft, kv, vocab_maps, key.n_seqs, key.block_len, key.n_kv, flash_attn,
                                       key.logits, pick);
    });
    const dflash_inject_graph & inj = cached_inj;
    const dflash_block_graph & io = cached_io;
    if (n_rows > 0) {
        const int32_t width = hp().feature_width();
        std::vector<float> feat((size_t) n_rows * width, 0.0f);
        std::copy(r.inject_features, r.inject_features + (size_t) r.n_inject * width, feat.begin());
        std::vector<int32_t> ipos(n_rows, 0);
        std::copy(r.inject_pos, r.inject_pos + r.n_inject, ipos.begin());
        dspark_set_input(inj.feat, feat.data(), feat.size() * sizeof(float));
        dspark_set_input(inj.pos, ipos.data(), sizeof(int32_t) * n_rows);
        std::vector<int64_t> iidx(inj_slots.begin(), inj_slots.end());
        dspark_set_input(inj.kv_idx, iidx.data(), sizeof(int64_t) * n_rows);
    }

    std::vector<int32_t> tok(n_tok), pos(n_tok), seq(n_tok);
    for (int32_t b = 0; b < r.n_seqs; ++b) {
        for (int i = 0; i < B; ++i) {
            tok[b * B + i] = i == 0 ? r.anchors[b] : hp().mask_token_id;
            pos[b * B + i] = r.pos0[b] + i;
            seq[b * B + i] = r.seq_ids[b];
        }
    }
    dspark_set_input(io.tokens, tok.data(), sizeof(int32_t) * n_tok);
    dspark_set_input(io.pos, pos.data(), sizeof(int32_t) * n_tok);
    std::vector<int64_t> idx(slots.begin(), slots.end());
    dspark_set_input(io.kv_idx, idx.data(), sizeof(int64_t) * n_tok);
    std::vector<ggml_fp16_t> mask((size_t) n_kv * n_tok);
    dspark_kv_mask_params mp;
    mp.causal = hp().causal;
    kv.fill_mask(mask.data(), n_kv, n_tok, pos.data(), seq.data(), mp);
    dspark_set_input(io.mask, mask.data(), mask.size() * sizeof(ggml_fp16_t));
    if (io.mask_swa) {
        mp.n_swa = hp().n_swa;
        kv.fill_mask(mask.data(), n_kv, n_tok, pos.data(), seq.data(), mp);
        dspark_set_input(io.mask_swa, mask.data(), mask.size() * sizeof(ggml_fp16_t));
    }
    if (io.sampler) {
        std::vector<float> in;
        rows.inputs(key.sampler, hp().n_vocab_draft, in);
        dspark_set_input(io.sampler, in.data(), in.size() * sizeof(float));
    }

    compute.compute(gf);
    read_results(r, io);
}

// Per-slot outputs (one tensor per slot, [n_seqs] each; or one block-major tensor) as block-major [n_seqs][P].
template <typename T>
static void read_slots(const std::vector<ggml_tensor *> & outs, int n_seqs, int P, std::vector<T> & dst) {
    dst.assign((size_t) n_seqs * P, T());
    if (outs.size() == 1) {
        ggml_backend_tensor_get(outs[0], dst.data(), 0, sizeof(T) * dst.size());
        return;
    }
    std::vector<T> col(n_seqs);
    for (int j = 0; j < P; ++j) {
        ggml_backend_tensor_get(outs[j], col.data(), 0, sizeof(T) * n_seqs);
        for (int b = 0; b < n_seqs; ++b) {
            dst[(size_t) b * P + j] = col[b];
        }
    }
}

// Copy the proposal back, block-major [n_seqs][P].
void dspark_draft_context::read_results(const dspark_propose_request & r, const dflash_block_graph & io) {
    n_seqs = r.n_seqs;
    n_draft = r.n_draft;
    read_slots(io.tokens_out, n_seqs, n_draft, tokens);
    confidence.clear();
    if (!io.conf_out.empty()) {
        read_slots(io.conf_out, n_seqs, n_draft, confidence);
    }
    probs.clear();
    if (!io.prob_out.empty()) {
        read_slots(io.prob_out, n_seqs, n_draft, probs);
    }
    logits.clear();
    kept_logits = io.logits != nullptr;
    if (io.logits && r.want_logits) {
        logits.resize((size_t) ggml_nelements(io.logits));
        ggml_backend_tensor_get(io.logits, logits.data(), 0, logits.size() * sizeof(float));
    }
}

void dspark_draft_context::logits_row(int32_t block, int32_t slot, float * out) const {
    if (!kept_logits || !graph.valid(compute) || block < 0 || block >= n_seqs || slot < 0 || slot >= n_draft) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "draft logits of block %d slot %d are not available", block, slot);
    }
    dspark_rpc_check_alive(compute.devices);
    const size_t row = cached_io.logits->nb[1];
    ggml_backend_tensor_get(cached_io.logits, out, row * ((size_t) block * n_draft + slot), row);
}
