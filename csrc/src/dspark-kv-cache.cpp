#include "dspark-kv-cache.h"

#include "dspark-impl.h"

#include <algorithm>
#include <cmath>

dspark_kv_cache::~dspark_kv_cache() {
    for (ggml_backend_buffer_t b : bufs) {
        ggml_backend_buffer_free(b);
    }
    for (ggml_context * c : ctxs) {
        ggml_free(c);
    }
}

void dspark_kv_cache::init(const std::vector<ggml_backend_buffer_type_t> & bufts, const std::vector<int64_t> & widths,
                           ggml_type type, uint32_t n_cells_, uint32_t n_seq_max_) {
    n_cells   = n_cells_;
    n_seq_max = n_seq_max_;
    cells.assign(n_cells, dspark_kv_cell());
    k.assign(widths.size(), nullptr);
    v.assign(widths.size(), nullptr);
    // one context (and one buffer) per buffer type: a layer's cache lives where the layer runs
    std::vector<ggml_backend_buffer_type_t> kinds;
    for (size_t il = 0; il < widths.size(); ++il) {
        if (widths[il] != 0 && std::find(kinds.begin(), kinds.end(), bufts[il]) == kinds.end()) {
            kinds.push_back(bufts[il]);
        }
    }
    for (ggml_backend_buffer_type_t buft : kinds) {
        ggml_init_params ip = { /*.mem_size =*/ (size_t) (2 * widths.size() + 1) * ggml_tensor_overhead(),
                                /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true };
        ggml_context * ctx = ggml_init(ip);
        ctxs.push_back(ctx);
        for (size_t il = 0; il < widths.size(); ++il) {
            if (widths[il] == 0 || bufts[il] != buft) {
                continue;
            }
            k[il] = ggml_new_tensor_2d(ctx, type, widths[il], n_cells);
            v[il] = ggml_new_tensor_2d(ctx, type, widths[il], n_cells);
            ggml_format_name(k[il], "cache_k_l%d", (int) il);
            ggml_format_name(v[il], "cache_v_l%d", (int) il);
        }
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (!buf) {
            dspark_throw(DSPARK_STATUS_OUT_OF_MEMORY, "not enough memory for a KV cache of %u cells on %s", n_cells,
                         ggml_backend_buft_name(buft));
        }
        bufs.push_back(buf);
        // Empty cells are masked out, but their memory is read by attention: keep it finite.
        ggml_backend_buffer_clear(buf, 0);
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_COMPUTE);
    }
}

bool dspark_kv_cache::find_slots(uint32_t n, std::vector<int32_t> & out, const int32_t * seq, const int32_t * pos) const {
    out.clear();
    if (n > n_cells - used) {
        return false;
    }
    auto owner = [&](uint32_t i) { return seq && pos && seq[i] >= 0 && seq[i] < DSPARK_MAX_SEQ ? seq[i] : -1; };
    // per sequence of the request, the first cell above its own (and above those chosen here)
    std::vector<uint32_t> above(DSPARK_MAX_SEQ, 0);
    std::bitset<DSPARK_MAX_SEQ> wanted;
    std::vector<int32_t> wanted_ids;  // the few sequences of the request: the scan below tests only them
    for (uint32_t i = 0; i < n; ++i) {
        if (owner(i) >= 0 && !wanted.test(owner(i))) {
            wanted.set(owner(i));
            wanted_ids.push_back(owner(i));
        }
    }
    for (uint32_t j = 0; !wanted_ids.empty() && j < extent; ++j) {  // no used cell lies beyond extent
        if (cells[j].pos >= 0 && (cells[j].seq & wanted).any()) {
            for (int32_t s : wanted_ids) {
                if (cells[j].seq.test(s)) {
                    above[s] = j + 1;
                }
            }
        }
    }
    std::vector<bool> taken(n_cells, false);
    auto usable = [&](uint32_t j) { return cells[j].pos < 0 && !taken[j]; };
    for (uint32_t i = 0; i < n; ++i) {
        const int32_t s = owner(i);
        int64_t pick = -1;
        if (s >= 0) {  // the aligned cell above the sequence's own
            const uint32_t r = (uint32_t) pos[i] % DSPARK_KV_ALIGN;
            uint32_t j = above[s] + (r + DSPARK_KV_ALIGN - above[s] % DSPARK_KV_ALIGN) % DSPARK_KV_ALIGN;
            for (; j < n_cells && pick < 0; j += DSPARK_KV_ALIGN) {
                pick = usable(j) ? (int64_t) j : -1;
            }
        }
        for (uint32_t j = 0; j < n_cells && pick < 0; ++j) {  // any free cell (lowest first)
            pick = usable(j) ? (int64_t) j : -1;
        }
        if (pick < 0) {
            return false;
        }
        taken[pick] = true;
        out.push_back((int32_t) pick);
        if (s >= 0) {
            above[s] = std::max(above[s], (uint32_t) pick + 1);
        }
    }
    return true;
}

void dspark_kv_cache::commit(const std::vector<int32_t> & slots, const int32_t * pos, const int32_t * seq,
                             const int32_t * token) {
    for (size_t i = 0; i < slots.size(); ++i) {
        dspark_kv_cell & c = cells[slots[i]];
        c.pos = pos[i];
        c.token = token ? token[i] : -1;
        c.seq.reset();
        c.seq.set(seq[i]);
        used++;
        extent = std::max(extent, (uint32_t) slots[i] + 1);
    }
}

void dspark_kv_cache::release(const std::vector<int32_t> & slots) {
    for (int32_t i : slots) {
        if (cells[i].pos >= 0) {
            cells[i] = dspark_kv_cell();
            used--;
        }
    }
    shrink_extent();
}

size_t dspark_kv_cache::nbytes() const {
    size_t n = 0;
    for (size_t il = 0; il < k.size(); ++il) {
        n += (k[il] ? ggml_nbytes(k[il]) : 0) + (v[il] ? ggml_nbytes(v[il]) : 0);
    }
    return n;
}

uint32_t dspark_kv_cache::n_kv() const {
    const uint32_t pad = 32;
    const uint32_t n = ((extent + pad - 1) / pad) * pad;
    return std::max<uint32_t>(1, std::min(n, n_cells));
}

// Whether a query at pos of seq may attend to cell c (the one rule of both mask layouts).
static bool visible(const dspark_kv_cell & c, int32_t pos, int32_t seq, const dspark_kv_mask_params & mp) {
    return c.pos >= 0 && c.seq.test(seq) && (!mp.causal || c.pos <= pos) && (mp.n_swa <= 0 || pos - c.pos < mp.n_swa);
}

template <typename T>
static void fill_mask_impl(const dspark_kv_cache & kv, T * out, uint32_t n_kv, int32_t n_tokens, const int32_t * pos,
                           const int32_t * seq, const dspark_kv_mask_params & mp, T zero, T neg_inf) {
    for (int32_t t = 0; t < n_tokens; ++t) {
        T * row = out + (size_t) t * n_kv;
        for (uint32_t j = 0; j < n_kv; ++j) {
            row[j] = visible(kv.cells[j], pos[t], seq[t], mp) ? zero : neg_inf;
        }
    }
}

void dspark_kv_cache::fill_mask(ggml_fp16_t * out, uint32_t n_kv_, int32_t n_tokens, const int32_t * pos,
                                const int32_t * seq, const dspark_kv_mask_params & mp) const {
    fill_mask_impl<ggml_fp16_t>(*this, out, n_kv_, n_tokens, pos, seq, mp, ggml_fp32_to_fp16(0.0f),
                                ggml_fp32_to_fp16(-INFINITY));
}

void dspark_kv_cache::fill_mask(float * out, uint32_t n_kv_, int32_t n_tokens, const int32_t * pos,
                                const int32_t * seq, const dspark_kv_mask_params & mp) const {
    fill_mask_impl<float>(*this, out, n_kv_, n_tokens, pos, seq, mp, 0.0f, -INFINITY);
}

size_t dspark_kv_seq_cells::longest() const {
    size_t n = 0;
    for (const std::vector<int32_t> & c : cells) {
        n = std::max(n, c.size());
    }
    return n;
}

dspark_kv_seq_cells dspark_kv_cache::seq_cells(int32_t n_tokens, const int32_t * seq) const {
    dspark_kv_seq_cells sc;
    for (int32_t t = 0; t < n_tokens; ++t) {
        const auto it = std::find(sc.seqs.begin(), sc.seqs.end(), seq[t]);
        sc.slot.push_back((int32_t) (it - sc.seqs.begin()));
        if (it == sc.seqs.end()) {
            sc.seqs.push_back(seq[t]);
        }
    }
    sc.cells.resize(sc.seqs.size());
    for (size_t s = 0; s < sc.seqs.size(); ++s) {
        std::vector<int32_t> & list = sc.cells[s];
        for (uint32_t j = 0; j < extent; ++j) {
            if (cells[j].pos >= 0 && cells[j].seq.test(sc.seqs[s])) {
                list.push_back((int32_t) j);
            }
        }
        std::sort(list.begin(), list.end(), [&](int32_t a, int32_t b) { return cells[a].pos < cells[b].pos; });
    }
    return sc;
}

void dspark_kv_cache::fill_in_order_cells(const dspark_kv_seq_cells & sc, uint32_t n, int32_t * out) {
    for (size_t s = 0; s < sc.cells.size(); ++s) {
        const std::vector<int32_t> & list = sc.cells[s];
        for (uint32_t i = 0; i < n; ++i) {
            out[s * n + i] = i < list.size() ? list[i] : list[0];
        }
    }
}

void dspark_kv_cache::fill_in_order_mask(const dspark_kv_seq_cells & sc, uint32_t n, int32_t n_tokens,
                                         const int32_t * pos, const dspark_kv_mask_params & mp, float * out) const {
    for (int32_t t = 0; t < n_tokens; ++t) {
        const int32_t s = sc.slot[t];
        const std::vector<int32_t> & list = sc.cells[s];
        for (uint32_t i = 0; i < n; ++i) {
            const bool ok = i < list.size() && visible(cells[list[i]], pos[t], sc.seqs[s], mp);
            out[(size_t) t * n + i] = ok ? 0.0f : -INFINITY;
        }
    }
}

static bool in_range(int32_t p, int32_t p0, int32_t p1) {
    return p >= p0 && (p1 < 0 || p < p1);
}

void dspark_kv_cache::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
    for (dspark_kv_cell & c : cells) {
        if (c.pos >= 0 && (seq < 0 || c.seq.test(seq)) && in_range(c.pos, p0, p1)) {
            if (seq < 0) {
                c.seq.reset();
            } else {
                c.seq.reset(seq);
            }
            if (c.seq.none()) {
                c = dspark_kv_cell();
                used--;
            }
        }
    }
    shrink_extent();
}

void dspark_kv_cache::seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    if (src == dst) {
        return;
    }
    for (dspark_kv_cell & c : cells) {
        if (c.pos >= 0 && c.seq.test(src) && in_range(c.pos, p0, p1)) {
            c.seq.set(dst);
        }
    }
}

void dspark_kv_cache::seq_keep(int32_t seq) {
    for (dspark_kv_cell & c : cells) {
        if (c.pos >= 0 && !c.seq.test(seq)) {
            c = dspark_kv_cell();
            used--;
        } else if (c.pos >= 0) {
            c.seq.reset();
            c.seq.set(seq);
        }
    }
    shrink_extent();
}

void dspark_kv_cache::clear() {
    cells.assign(n_cells, dspark_kv_cell());
    used = 0;
    extent = 0;
}

int32_t dspark_kv_cache::seq_pos_max(int32_t seq) const {
    int32_t m = -1;
    for (uint32_t i = 0; i < extent; ++i) {
        if (cells[i].pos > m && cells[i].seq.test(seq)) {
            m = cells[i].pos;
        }
    }
    return m;
}

int32_t dspark_kv_cache::seq_prefix(int32_t seq, const int32_t * tokens, int32_t n) const {
    if (seq < 0 || seq >= DSPARK_MAX_SEQ || n <= 0) {
        return 0;
    }
    std::vector<uint8_t> held(n, 0);  // position p holds tokens[p]
    for (uint32_t i = 0; i < extent; ++i) {
        const dspark_kv_cell & c = cells[i];
        if (c.pos >= 0 && c.pos < n && c.seq.test(seq) && c.token >= 0 && c.token == tokens[c.pos]) {
            held[c.pos] = 1;
        }
    }
    int32_t k = 0;
    while (k < n && held[k]) {
        ++k;
    }
    return k;
}

bool dspark_kv_cache::seq_can_keep(int32_t seq, int32_t k) const {
    if (k % DSPARK_KV_ALIGN == 0) {
        return true;  // the continuation starts a block of its own
    }
    int64_t last = -1;  // the cell of position k - 1
    for (uint32_t i = 0; i < extent && last < 0; ++i) {
        last = cells[i].pos == k - 1 && cells[i].seq.test(seq) ? (int64_t) i : -1;
    }
    if (last < 0 || last % DSPARK_KV_ALIGN != (k - 1) % DSPARK_KV_ALIGN) {
        return false;
    }
    // the rest of its block must be free once the sequence's positions k.. are removed
    for (int64_t i = last + 1; i < (last / DSPARK_KV_ALIGN + 1) * DSPARK_KV_ALIGN && i < (int64_t) n_cells; ++i) {
        const dspark_kv_cell & c = cells[i];
        if (c.pos >= 0 && !(c.pos >= k && c.seq.test(seq) && c.seq.count() == 1)) {
            return false;
        }
    }
    return true;
}

int32_t dspark_kv_cache::seq_pos_min(int32_t seq) const {
    int32_t m = -1;
    for (uint32_t i = 0; i < extent; ++i) {
        if (cells[i].pos >= 0 && cells[i].seq.test(seq) && (m < 0 || cells[i].pos < m)) {
            m = cells[i].pos;
        }
    }
    return m;
}

void dspark_kv_cache::shrink_extent() {
    while (extent > 0 && cells[extent - 1].pos < 0) {
        extent--;
    }
}
