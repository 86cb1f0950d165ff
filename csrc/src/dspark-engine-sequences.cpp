// Sequences entering and leaving the engine: the id check, reuse of a cached prompt prefix, the
// prefill (target decode and draft feature injection), the first token, removal, and how many draft
// tokens a sequence can still use. The step itself is in dspark-engine.cpp.
#include "dspark-engine.h"

#include "dspark-impl.h"

#include <algorithm>

void dspark_engine::check_seq_id(int32_t seq_id) const {
    if (seq_id < 0 || (uint32_t) seq_id >= tgt.params.n_seq_max) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence id %d: must be 0 .. %u", seq_id, tgt.params.n_seq_max - 1);
    }
}

// The cells record their tokens (the draft's too), so a prefix is reused only where both caches
// hold exactly these tokens at these positions: whatever ran on the sequence id before (another
// engine over the same contexts, a target-only one that left the draft's cells behind) cannot
// make a stale cell count. Cells computed earlier equal recomputed ones bit for bit (rows are
// computed batch-invariantly, and a sequence's cells keep their order and lanes), so the output
// does not depend on the hit.
int32_t dspark_engine::cached_prefix(int32_t seq_id, const dspark_token * prompt, int32_t n_prompt) const {
    check_seq_id(seq_id);
    if (!prompt || n_prompt < 2) {
        return 0;
    }
    int32_t k = tgt.kv.seq_prefix(seq_id, prompt, n_prompt - 1);
    if (dft && k > 0) {
        k = std::min(k, dft->kv.seq_prefix(seq_id, prompt, k));  // features of the same tokens
    }
    if (!tgt.kv.seq_can_keep(seq_id, k) || (dft && !dft->kv.seq_can_keep(seq_id, k))) {
        k -= k % DSPARK_KV_ALIGN;  // keep whole blocks: the continuation starts a block of its own
    }
    return k;
}

void dspark_engine::add(int32_t seq_id, const dspark_request & r) {
    check_seq_id(seq_id);
    auto it = seqs.find(seq_id);
    if (it != seqs.end() && it->second.status == DSPARK_SEQ_ACTIVE) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence %d is still active; remove it first", seq_id);
    }
    dspark_seq_state s(seq_id, r, tgt.hp().n_vocab, tgt.params.n_ctx, n_draft);
    // prompt logprobs need the logits of every prompt row: no reuse
    const int32_t n_keep = r.reuse_prefix && !r.prompt_logprobs ? cached_prefix(seq_id, r.prompt, r.n_prompt) : 0;

    // the caches must hold nothing of this sequence but the reused prefix
    tgt.kv.seq_rm(seq_id, n_keep, -1);
    if (dft) {
        dft->kv.seq_rm(seq_id, n_keep, -1);
    }
    const auto t0 = dspark_clock::now();
    dspark_token first = 0;
    try {
        const int32_t last = prefill(s, r, n_keep);
        first = first_token(s, tgt.logits.data() + (size_t) last * tgt.hp().n_vocab);
    } catch (...) {
        tgt.kv.seq_rm(seq_id, 0, -1);
        if (dft) {
            dft->kv.seq_rm(seq_id, 0, -1);
        }
        throw;
    }
    s.n_past = r.n_prompt;
    s.status = DSPARK_SEQ_ACTIVE;
    s.stats.t_prefill_ms = dspark_ms_since(t0);
    s.stats.n_cached = n_keep;
    s.anchor = first;
    s.emit(first, false, eog);
    total.n_prompt += r.n_prompt;
    total.n_cached += n_keep;
    total.n_generated += 1;
    total.t_prefill_ms += s.stats.t_prefill_ms;
    seqs[seq_id] = std::move(s);
}

// The prefill's first token, from the last prompt row's logits: adjusted (the constraint's mask
// of the empty continuation), its logprob recorded, and committed to the adjuster (and so to the
// constraint; a failing callback throws).
dspark_token dspark_engine::first_token(dspark_seq_state & s, const float * logits) {
    const int V = tgt.hp().n_vocab;
    const float * adj = nullptr;
    if (s.adjust) {
        if (s.adjust->constrained()) {
            s.adjust->ask_masks(nullptr, 0);
        }
        adj = s.adjust->fill(logits, nullptr, 0);
    }
    const dspark_token first = dspark_sample_host(logits, V, s.sp, s.sp.greedy() ? 0.0f : s.rng.next(), adj);
    if (s.logprobs) {
        s.new_logprobs.add(logits, adj, V, s.sp, first);
    }
    if (s.adjust) {
        s.adjust->undo();
        s.adjust->accept(&first, 1);
    }
    return first;
}

// Decode prompt positions [from, n_prompt) into the target, n_batch at a time, and inject their
// features into the draft; the logits of the last position stay in the target context, at the
// row returned. A prompt_logprobs request outputs every row (chunks of at most n_outputs_max) and
// records each prompt token's logprob under the row before it.
int32_t dspark_engine::prefill(dspark_seq_state & s, const dspark_request & r, int32_t from) {
    const int32_t seq_id = s.id;
    const bool all = s.want_prompt_logprobs;
    const int32_t chunk = all ? (int32_t) std::min<uint32_t>(tgt.params.n_batch, tgt.n_outputs_max) : (int32_t) tgt.params.n_batch;
    const int V = tgt.hp().n_vocab;
    int32_t last = 0;
    for (int32_t off = from; off < r.n_prompt; off += chunk) {
        const int32_t n = std::min<int32_t>(chunk, r.n_prompt - off);
        std::vector<dspark_pos> pos(n);
        std::vector<dspark_seq_id> seq(n, seq_id);
        std::vector<int8_t> out(n, all ? 1 : 0);
        for (int32_t i = 0; i < n; ++i) {
            pos[i] = off + i;
        }
        out[n - 1] = all || off + n == r.n_prompt;
        dspark_batch b = {n, r.prompt + off, pos.data(), seq.data(), out.data()};
        tgt.decode(b);
        last = all ? n - 1 : 0;
        for (int32_t i = 0; all && i < n && off + i + 1 < r.n_prompt; ++i) {
            s.prompt_logprobs.add_raw(tgt.logits.data() + (size_t) i * V, V, r.prompt[off + i + 1]);
        }
        if (dft) {
            for (int32_t c = 0; c < n; c += (int32_t) dft->params.n_batch) {
                const int32_t m = std::min<int32_t>((int32_t) dft->params.n_batch, n - c);
                const int32_t width = dft->hp().feature_width();
                dft->inject(tgt.captured.data() + (size_t) c * width, m, width, pos.data() + c, seq.data() + c,
                            r.prompt + off + c);
            }
        }
    }
    return last;
}

void dspark_engine::remove(int32_t seq_id) {
    auto it = seqs.find(seq_id);
    if (it == seqs.end()) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence %d is not known to the engine", seq_id);
    }
    tgt.kv.seq_rm(seq_id, 0, -1);
    if (dft) {
        dft->kv.seq_rm(seq_id, 0, -1);
    }
    seqs.erase(it);
}

void dspark_engine::detach(int32_t seq_id) {
    seq(seq_id);  // throws for an unknown one
    seqs.erase(seq_id);
}

// How many draft tokens this sequence can still use: room for them plus the target's own token
// in max_tokens and in both contexts.
int dspark_engine::draft_budget(const dspark_seq_state & s) const {
    int k = n_draft;
    if (s.max_tokens > 0) {
        k = std::min(k, s.max_tokens - s.stats.n_generated - 1);
    }
    k = std::min(k, (int) tgt.params.n_ctx - s.n_past - 1);
    if (s.n_past + dft->block_len(n_draft) > (int) dft->params.n_ctx) {
        k = 0;  // the block would not fit the draft's context
    }
    return std::max(k, 0);
}
