// A KV cache of n_cells cells shared by up to n_seq_max sequences (one unified pool, as in
// llama.cpp). A cell holds one position's K and V for every layer and the set of sequences that
// own it; sequences sharing a prompt prefix share its cells (seq_cp copies no data). A cell also
// records the token it holds, when known: a later request reuses a sequence's cells (prompt
// caching) only as far as they hold exactly its prompt's tokens.
//
// Cell bookkeeping lives on the host; K and V live in backend tensors, one [n_embd_k, n_cells]
// (resp. v) matrix per layer, written with ggml_set_rows at the cells chosen for a batch.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <bitset>
#include <cstdint>
#include <vector>

constexpr int DSPARK_MAX_SEQ = 256;
constexpr int DSPARK_KV_ALIGN = 64;  // a multiple of every SIMD width and accumulator block of the kernels

struct dspark_kv_cell {
    int32_t                     pos = -1;  // -1: empty
    int32_t                     token = -1;  // the token whose K/V (or features) it holds; -1: not known
    std::bitset<DSPARK_MAX_SEQ> seq;
};

// How a batch may attend: causal (position <= own) or the whole sequence (draft blocks).
struct dspark_kv_mask_params {
    bool    causal = true;
    int32_t n_swa  = 0;  // > 0: also hide cells with pos_query - pos_key >= n_swa
};

// The sequences of a batch in the order attention meets them on a device (see
// dspark_graph::attention_in_order): slot s holds sequence seqs[s] and its cells in position order.
struct dspark_kv_seq_cells {
    std::vector<int32_t>              seqs;   // the sequence of each slot, in order of first appearance
    std::vector<int32_t>              slot;   // the slot of each token of the batch
    std::vector<std::vector<int32_t>> cells;  // per slot, the sequence's cells in position order

    size_t longest() const;
};

struct dspark_kv_cache;
struct dspark_kv;  // the C API's name for a dspark_kv_cache

struct dspark_kv_cache {
    uint32_t n_cells   = 0;
    uint32_t n_seq_max = 0;
    std::vector<dspark_kv_cell> cells;
    std::vector<ggml_tensor *>  k;  // per layer [width, n_cells], or null
    std::vector<ggml_tensor *>  v;  // per layer [width, n_cells], or null

    dspark_kv_cache() = default;
    ~dspark_kv_cache();
    dspark_kv_cache(const dspark_kv_cache &) = delete;
    dspark_kv_cache & operator=(const dspark_kv_cache &) = delete;

    // One K and one V matrix per layer of widths[il] values per cell, in memory of bufts[il] (the
    // layer's device); a width of 0 gives the layer no cache of its own (it attends to another
    // layer's, e.g. Gemma-4's shared-KV layers).
    void init(const std::vector<ggml_backend_buffer_type_t> & bufts, const std::vector<int64_t> & widths,
              ggml_type type, uint32_t n_cells, uint32_t n_seq_max);

    // Choose n free cells; false if there are not enough. Changes nothing. With seq and pos (per
    // cell wanted; seq -1 = any), the cell of position p of sequence s is one above s's existing
    // cells with index = p (mod DSPARK_KV_ALIGN): attention then meets a sequence's cells in
    // position order and at the same SIMD lanes as when it runs alone, so its results are the
    // same bit for bit whatever other sequences do. Only when no such cell is free is any taken.
    bool find_slots(uint32_t n, std::vector<int32_t> & out, const int32_t * seq = nullptr,
                    const int32_t * pos = nullptr) const;
    // Mark the chosen cells as holding (pos[i], seq[i]) of token[i] (null: tokens not known);
    // release() empties them again.
    void commit(const std::vector<int32_t> & slots, const int32_t * pos, const int32_t * seq,
                const int32_t * token = nullptr);
    void release(const std::vector<int32_t> & slots);

    // Number of leading cells attention has to look at (last used cell + 1, padded).
    uint32_t n_kv() const;

    // Write the attention mask [n_kv, n_tokens] (0 / -inf) for tokens at pos[i] in seq[i].
    void fill_mask(ggml_fp16_t * out, uint32_t n_kv, int32_t n_tokens, const int32_t * pos,
                   const int32_t * seq, const dspark_kv_mask_params & mp) const;
    void fill_mask(float * out, uint32_t n_kv, int32_t n_tokens, const int32_t * pos,
                   const int32_t * seq, const dspark_kv_mask_params & mp) const;

    // The sequences of tokens seq[0 .. n_tokens) and their cells (the batch's own included).
    dspark_kv_seq_cells seq_cells(int32_t n_tokens, const int32_t * seq) const;
    // For attention in sequence order: out [n, slots] lists each slot's cells, padded with its
    // first cell (n >= sc.longest()).
    static void fill_in_order_cells(const dspark_kv_seq_cells & sc, uint32_t n, int32_t * out);
    // out [n, n_tokens]: 0 where token t may attend to cell i of its slot, -inf elsewhere (padding too).
    void fill_in_order_mask(const dspark_kv_seq_cells & sc, uint32_t n, int32_t n_tokens, const int32_t * pos,
                            const dspark_kv_mask_params & mp, float * out) const;

    // Sequence operations: host bookkeeping only, no graph runs. p1 < 0 means "to the end".
    void    seq_rm(int32_t seq, int32_t p0, int32_t p1);
    void    seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1);
    void    seq_keep(int32_t seq);
    void    clear();
    int32_t seq_pos_max(int32_t seq) const;  // -1 if empty
    int32_t seq_pos_min(int32_t seq) const;  // -1 if empty
    // Prompt caching: k such that seq's cells hold tokens[0 .. k) at positions 0 .. k-1 (k <= n).
    // A cell whose token is not known matches nothing.
    int32_t seq_prefix(int32_t seq, const int32_t * tokens, int32_t n) const;
    // Whether seq can keep positions 0 .. k-1 and continue at k in the same block of cells: the
    // rest of that block is free once its positions k.. are removed (no other sequence's cells
    // there, shared ones included). Else the continuation would split the block of
    // DSPARK_KV_ALIGN positions across cells, and attention would accumulate it in another order
    // than when the sequence is recomputed. True when k starts a block.
    bool seq_can_keep(int32_t seq, int32_t k) const;
    uint32_t n_used() const { return used; }
    size_t   nbytes() const;  // K and V of every layer

  private:
    std::vector<ggml_context *>        ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
    uint32_t              used = 0;     // non-empty cells
    uint32_t              extent = 0;   // last non-empty cell + 1 (an upper bound, kept tight)
    void shrink_extent();
};
