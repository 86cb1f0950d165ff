#include "dspark-engine.h"

#include "dspark-impl.h"

#include <algorithm>

int32_t dspark_clamp_n_draft(const dflash_hparams & dh, int32_t n_max) {
    // what the layout can propose: block_size (anchor-first DSpark) or block_size - 1; 0 = all of it
    return n_max > 0 ? std::min(n_max, dh.max_draft()) : dh.max_draft();
}

const dspark_seq_state & dspark_engine::seq(int32_t seq_id) const {
    auto it = seqs.find(seq_id);
    if (it == seqs.end()) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence %d is not known to the engine", seq_id);
    }
    return it->second;
}

int32_t dspark_engine::status(int32_t seq_id) const {
    auto it = seqs.find(seq_id);
    return it == seqs.end() ? DSPARK_SEQ_IDLE : it->second.status;
}

// ---- setup --------------------------------------------------------------------------------------

void dspark_spec_params_check(const dspark_spec_params & params) {
    const std::pair<const char *, int32_t> counts[] = {
        {"n_max", params.n_max}, {"n_min", params.n_min}, {"markov_top_k", params.markov_top_k}};
    for (const auto & [name, value] : counts) {
        if (value < 0) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "%s must be >= 0, got %d", name, value);
        }
    }
    if (!(params.p_min >= 0.0f && params.p_min <= 1.0f)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "p_min must be in [0, 1], got %g", (double) params.p_min);
    }
    if (params.draft_mode != DSPARK_DRAFT_GREEDY_CHAIN && params.draft_mode != DSPARK_DRAFT_PROBABILISTIC) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "unknown draft mode %d", params.draft_mode);
    }
    if (params.backend_sampling < DSPARK_BACKEND_SAMPLING_AUTO || params.backend_sampling > DSPARK_BACKEND_SAMPLING_ON) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "backend_sampling must be -1 (auto), 0 (off) or 1 (on), got %d",
                     params.backend_sampling);
    }
    if (params.schedule < DSPARK_SCHEDULE_STATIC || params.schedule > DSPARK_SCHEDULE_ADAPTIVE) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "unknown verify schedule %d", params.schedule);
    }
}

dspark_engine::dspark_engine(dspark_context & target, dspark_draft_context * draft, const dspark_spec_params & p)
    : tgt(target), dft(draft), params(p) {
    abort.link(&tgt.compute);
    if (dft) {
        abort.link(&dft->compute);
    }
    total = dspark_spec_stats();
    dspark_spec_params_check(params);
    if (!dft) {
        tgt.set_capture({});
        return;
    }
    const dflash_hparams & dh = dft->hp();
    if (dh.n_vocab != tgt.hp().n_vocab) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the draft's vocabulary (%d) differs from the target's (%d)", dh.n_vocab, tgt.hp().n_vocab);
    }
    if (dh.n_embd != tgt.hp().n_embd) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the draft's hidden size (%d) differs from the target's (%d)", dh.n_embd, tgt.hp().n_embd);
    }
    n_draft = dspark_clamp_n_draft(dh, params.n_max);
    if (params.n_max > dh.max_draft()) {
        DSPARK_LOG_WARN("n_max %d clamped to %d: the draft's block_size is %d (%s)", params.n_max, n_draft, dh.block_size,
                        dh.first_pred_slot() == 0 ? "anchor-first" : "anchor + masks");
    }
    // a context too small for a whole block (n_batch = min(n_batch, n_ctx)) verifies shorter ones,
    // so that it still generates (and refuses a long prompt as too long, not as a batch problem)
    if ((uint32_t) n_draft + 1 > tgt.params.n_batch) {
        DSPARK_LOG_WARN("n_max %d clamped to %u: the target context's n_batch is %u", n_draft, tgt.params.n_batch - 1,
                        tgt.params.n_batch);
        n_draft = (int32_t) tgt.params.n_batch - 1;
    }
    params.n_min = std::min(params.n_min, n_draft);
    if (params.p_min > 0.0f && dh.markov != markov_head::none && !dh.has_confidence) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "this DSpark draft has no confidence head: set p_min = 0");
    }
    if (params.schedule == DSPARK_SCHEDULE_CONFIDENCE && !dh.has_confidence) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "confidence-scheduled verification needs a draft with a confidence head");
    }
    const uint32_t need = tgt.params.n_seq_max * (uint32_t) (n_draft + 1);
    if (tgt.params.n_batch < (uint32_t) n_draft + 1 || tgt.n_outputs_max < std::min(need, tgt.params.n_batch)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the target context must take a verify batch: n_batch >= %d per sequence "
                     "and outputs for every row (n_outputs_max_per_seq 0 or >= %d)", n_draft + 1, n_draft + 1);
    }
    if (tgt.params.n_outputs_max_per_seq && tgt.params.n_outputs_max_per_seq < (uint32_t) n_draft + 1) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "n_outputs_max_per_seq (%u) is below the verify block (%d)",
                     tgt.params.n_outputs_max_per_seq, n_draft + 1);
    }
    if (dft->params.n_seq_max < tgt.params.n_seq_max) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the draft context takes %u sequences, the target %u", dft->params.n_seq_max,
                     tgt.params.n_seq_max);
    }
    tgt.set_capture(dh.target_layers);
    if (costed()) {
        blocks.calibrate(tgt, *dft, n_draft, params.markov_top_k);
    }
}

// ---- one step -------------------------------------------------------------------------------------

void dspark_engine::clear_new_tokens() {
    for (auto & kv : seqs) {
        kv.second.new_tokens.clear();
        kv.second.new_from_draft.clear();
        kv.second.new_logprobs.clear();
    }
}

int32_t dspark_engine::step() {
    clear_new_tokens();
    return step_once();
}

// The loop a host language would otherwise run around step(), kept here so that a generation
// without per-step work on the host (no streaming, no stop strings) makes no call out per step.
int32_t dspark_engine::run(int32_t max_steps) {
    if (max_steps < 1) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "max_steps must be >= 1, got %d", max_steps);
    }
    clear_new_tokens();
    int32_t n = 0;
    int32_t active = 0;
    for (auto & kv : seqs) {
        active += kv.second.status == DSPARK_SEQ_ACTIVE;
    }
    while (n < max_steps && active > 0 && !abort.requested.load(std::memory_order_relaxed)) {
        const int32_t before = active;
        active = step_once();
        n++;
        if (active < before) {
            break;  // the host may hand the free slot to a waiting request
        }
    }
    return n;
}

int32_t dspark_engine::step_once() {
    failed_commit.clear();  // (a step that threw earlier left nothing to report here)
    std::vector<plan> plans;
    for (auto & kv : seqs) {
        dspark_seq_state & s = kv.second;
        if (s.status == DSPARK_SEQ_ACTIVE) {
            if ((uint32_t) s.n_past >= tgt.params.n_ctx) {
                s.status = DSPARK_SEQ_CTX_FULL;
                continue;
            }
            plan p;
            p.s = &s;
            plans.push_back(p);
        }
    }
    if (plans.empty()) {
        return 0;
    }
    const auto t0 = dspark_clock::now();
    if (costed() && last_step_ms > 0.0) {
        blocks.observe_gap(std::chrono::duration<double, std::milli>(t0 - last_step_end).count(), last_step_ms);
    }
    const int k = dft && n_draft > 0 ? (costed() ? choose_block(plans) : n_draft) : 0;
    const uint64_t draft_builds = dft ? dft->n_graphs_built : 0;
    const drafted d = dft && n_draft > 0 ? draft_blocks(plans, k) : drafted();
    const double t_draft = dspark_ms_since(t0);
    if (costed() && d.n_seqs > 0 && d.steady && dft->n_graphs_built == draft_builds) {
        // what the next steps at this length cost: not a catch-up (the features of steps without a
        // draft) nor a graph build (a change of shape), both paid once
        blocks.draft[d.block].observe(d.n_seqs, t_draft, blocks.now());
    }
    constrain_drafts(plans);
    verify(plans);  // accounts its own time
    total.t_draft_ms += t_draft;
    for (plan & p : plans) {
        p.s->stats.t_draft_ms += t_draft / plans.size();
    }
    int32_t active = 0;
    for (auto & kv : seqs) {
        active += kv.second.status == DSPARK_SEQ_ACTIVE;
    }
    if (!failed_commit.empty()) {  // the step committed; a constraint's commit callback failed
        std::string msg;
        msg.swap(failed_commit);
        dspark_throw(DSPARK_STATUS_INTERNAL, "%s", msg.c_str());
    }
    last_step_end = dspark_clock::now();
    last_step_ms = std::chrono::duration<double, std::milli>(last_step_end - t0).count();
    if (costed()) {
        blocks.observe_step(last_step_ms);
    }
    return active;
}

// The block length of this step (the adaptive and confidence schedules): what each sequence's
// recent acceptance makes worth drafting and verifying at the measured costs.
int dspark_engine::choose_block(const std::vector<plan> & plans) {
    std::vector<const dspark_acceptance *> acc;
    std::vector<int> budget;
    for (const plan & p : plans) {
        acc.push_back(&p.s->acc);
        budget.push_back(draft_budget(*p.s));
    }
    return blocks.choose(acc, budget, params.n_min);
}

// Draft up to k tokens (<= n_draft) for every greedy sequence with room for them, and n_draft for
// every sampled one: a sampled sequence's draws depend on its block length, which must not depend
// on its batch mates (a seeded request samples the same alone and in any batch). Returns how many
// sequences drafted, the length of the block the draft ran, and whether it had to catch up.
dspark_engine::drafted dspark_engine::draft_blocks(std::vector<plan> & plans, int k_greedy) {
    std::vector<int> budget(plans.size());
    int n_block = 0;
    std::vector<dspark_token> anchors;
    std::vector<dspark_pos> pos0;
    std::vector<dspark_seq_id> ids;
    std::vector<size_t> which;
    for (size_t i = 0; i < plans.size(); ++i) {
        budget[i] = std::min(plans[i].s->sp.greedy() ? k_greedy : n_draft, draft_budget(*plans[i].s));
        if (budget[i] >= std::max(1, params.n_min)) {
            n_block = std::max(n_block, plans[i].s->sp.greedy() ? k_greedy : n_draft);
            anchors.push_back(plans[i].s->anchor);
            pos0.push_back(plans[i].s->n_past);
            ids.push_back(plans[i].s->id);
            which.push_back(i);
        }
    }
    if (which.empty()) {
        return drafted();
    }
    // the drafting sequences' committed positions go into the draft cache in the same graph
    std::vector<float> inj_feat;
    std::vector<dspark_pos> inj_pos;
    std::vector<dspark_seq_id> inj_seq;
    std::vector<dspark_token> inj_tok;
    for (size_t i : which) {
        dspark_seq_state & s = *plans[i].s;
        inj_feat.insert(inj_feat.end(), s.pending_feat.begin(), s.pending_feat.end());
        inj_pos.insert(inj_pos.end(), s.pending_pos.begin(), s.pending_pos.end());
        inj_seq.insert(inj_seq.end(), s.pending_pos.size(), s.id);
        inj_tok.insert(inj_tok.end(), s.pending_tok.begin(), s.pending_tok.end());
    }
    const int32_t width = dft->hp().feature_width();
    size_t done = 0;
    while (inj_pos.size() - done > dft->params.n_batch) {  // more than one graph takes: inject ahead
        const int32_t m = (int32_t) dft->params.n_batch;
        dft->inject(inj_feat.data() + done * width, m, width, inj_pos.data() + done, inj_seq.data() + done,
                    inj_tok.data() + done);
        done += m;
    }
    // Probabilistic drafting: each sampled sequence drafts with its own sampler chain (its top-k /
    // top-p / min-p too: q then has the support of p) from noise of its own stream (a greedy one:
    // argmax), so its block does not depend on its neighbours.
    std::vector<dspark_sampler_params> samplers;
    std::vector<uint64_t> seeds;
    bool sampled = false;
    for (size_t i : which) {
        dspark_seq_state & s = *plans[i].s;
        const bool own = params.draft_mode == DSPARK_DRAFT_PROBABILISTIC && !s.sp.greedy();
        samplers.push_back(own ? s.sp : dspark_sampler_params());
        seeds.push_back(own ? s.aux() : 0);
        sampled = sampled || own;
    }
    dspark_propose_request r;
    r.n_inject = (int32_t) (inj_pos.size() - done);
    r.inject_features = inj_feat.data() + done * width;
    r.inject_pos = inj_pos.data() + done;
    r.inject_seq = inj_seq.data() + done;
    r.inject_tokens = inj_tok.data() + done;
    r.n_seqs = (int32_t) which.size();
    r.anchors = anchors.data();
    r.pos0 = pos0.data();
    r.seq_ids = ids.data();
    r.n_draft = n_block;  // every block has the same length; budgets cut afterwards
    r.keep_logits = sampled;  // read back one row only where a draft token is rejected
    r.sample = sampled;
    r.markov_top_k = params.markov_top_k;
    r.samplers = samplers.data();
    r.seeds = seeds.data();
    dft->propose(r);
    for (size_t i : which) {
        plans[i].s->pending_feat.clear();
        plans[i].s->pending_pos.clear();
        plans[i].s->pending_tok.clear();
    }
    for (size_t w = 0; w < which.size(); ++w) {
        plan & p = plans[which[w]];
        int k = budget[which[w]];
        const dspark_token * tok = dft->tokens.data() + w * n_block;
        const float * conf = dft->confidence.empty() ? nullptr : dft->confidence.data() + w * n_block;
        if (conf && params.p_min > 0.0f) {
            for (int j = 0; j < k; ++j) {
                if (conf[j] < params.p_min) {
                    k = j;
                    break;
                }
            }
        }
        if (k < params.n_min) {
            k = 0;
        }
        p.draft.assign(tok, tok + k);
        if (conf) {
            p.conf.assign(conf, conf + k);
        }
        if (!samplers[w].greedy()) {
            p.q.assign(dft->probs.begin() + (size_t) w * n_block, dft->probs.begin() + (size_t) w * n_block + k);
            p.draft_block = (int) w;
        }
    }
    if (params.schedule == DSPARK_SCHEDULE_CONFIDENCE) {
        // greedy blocks only: the cut weighs every sequence's positions against the others', and a
        // sampled sequence's draws must not depend on its batch mates (its rows verify regardless)
        std::vector<dspark_verify_block *> cut;
        int fixed_rows = 0;
        for (plan & p : plans) {
            if (p.s->sp.greedy()) {
                cut.push_back(&p);
            } else {
                fixed_rows += 1 + (int) p.draft.size();
            }
        }
        blocks.cut_by_confidence(cut, fixed_rows);
    }
    drafted d;
    d.n_seqs = (int) which.size();
    d.block = n_block;
    d.steady = inj_pos.size() <= which.size() * (size_t) (n_block + 1);
    return d;
}

// Constrained sequences: the grammar's masks for each block, and the block cut before the first
// drafted token the grammar rejects (such a token is never verified). A failing callback throws
// before the verify: nothing of the step is committed.
void dspark_engine::constrain_drafts(std::vector<plan> & plans) {
    for (plan & p : plans) {
        if (!p.s->adjust || !p.s->adjust->constrained()) {
            continue;
        }
        const int k = (int) p.draft.size();
        const int keep = p.s->adjust->ask_masks(p.draft.data(), k);
        if (keep < k) {
            p.cut_banned = p.rejection_sampled();  // sampled from q: slot `keep` emits the residual
            p.draft.resize(keep);
            p.conf.resize(std::min<size_t>(p.conf.size(), keep));
            p.q.resize(p.q.empty() ? 0 : keep);
        }
    }
}

// Verify every plan's block with the target, in as few decodes as n_batch allows: a step of many
// sequences can exceed one batch (n_seq_max x (n_draft + 1) > n_batch), so consecutive plans are
// grouped into chunks of at most n_batch rows. Only the first chunk's decode can be aborted: once
// a chunk has committed, the rest of the step runs to the end, so a step is all or nothing.
void dspark_engine::verify(std::vector<plan> & plans) {
    const size_t n_batch = tgt.params.n_batch;
    size_t n_rows = 0;
    for (const plan & p : plans) {
        n_rows += p.draft.size() + 1;
    }
    // all or nothing: a later chunk must not run out of cells after an earlier one committed
    if (n_rows > n_batch && n_rows > tgt.kv.n_cells - tgt.kv.n_used()) {
        dspark_throw(DSPARK_STATUS_CONTEXT_FULL, "the KV cache is full: %u of %u cells used, the verify batch needs %zu",
                     tgt.kv.n_used(), tgt.kv.n_cells, n_rows);
    }
    double t_verify = 0.0;
    struct restore_abort {
        dspark_compute & c;
        ~restore_abort() { c.abortable = true; }
    } restore{tgt.compute};
    for (size_t begin = 0; begin < plans.size();) {
        size_t end = begin, rows = 0;
        while (end < plans.size() && (end == begin || rows + plans[end].draft.size() + 1 <= n_batch)) {
            rows += plans[end++].draft.size() + 1;  // one block always fits (checked at setup)
        }
        tgt.compute.abortable = begin == 0;
        t_verify += verify_chunk(plans, begin, end);
        begin = end;
    }
    for (plan & p : plans) {
        p.s->stats.t_verify_ms += t_verify / plans.size();
    }
}

// Decode plans [begin, end) in one target batch, then accept and commit each of them.
double dspark_engine::verify_chunk(std::vector<plan> & plans, size_t begin, size_t end) {
    auto t0 = dspark_clock::now();
    std::vector<dspark_token> tok;
    std::vector<dspark_pos> pos;
    std::vector<dspark_seq_id> seq;
    dspark_sampler_rows rows;  // in-graph sampling: one row per verify row
    const bool backend = in_graph_sampling(plans, begin, end);
    for (size_t i = begin; i < end; ++i) {
        plan & p = plans[i];
        p.row = (int) tok.size();
        const int k = (int) p.draft.size();
        tok.push_back(p.s->anchor);
        tok.insert(tok.end(), p.draft.begin(), p.draft.end());
        for (int j = 0; j <= k; ++j) {
            pos.push_back(p.s->n_past + j);
            seq.push_back(p.s->id);
        }
        if (!backend) {
            continue;
        }
        if (p.s->adjust) {  // additive only here (needs_logits() sends the chunk to the host)
            p.adjust = p.s->adjust->fill(nullptr, p.draft.data(), k);
        }
        if (p.rejection_sampled()) {
            // p of each draft token in the graph; the last row samples the bonus token
            rows.probing = true;
            for (int j = 0; j < k; ++j) {
                rows.add(p.s->sp, 0.5f, (float) p.draft[j]);
            }
            rows.add(p.s->sp, p.bonus_uniform(p.s->aux));
        } else {
            const std::vector<float> u = p.s->rng.peek(k + 1);
            for (int j = 0; j <= k; ++j) {
                rows.add(p.s->sp, u[j]);
            }
        }
    }
    if (backend) {
        adjust_rows(plans, begin, end, rows);
    }
    std::vector<int8_t> out(tok.size(), 1);
    const uint64_t builds = tgt.n_graphs_built;
    dspark_batch b = {(int32_t) tok.size(), tok.data(), pos.data(), seq.data(), out.data()};
    tgt.decode(b, backend ? &rows : nullptr);
    const double t_verify = dspark_ms_since(t0);
    total.t_verify_ms += t_verify;
    if (costed() && tgt.n_graphs_built == builds) {  // a graph build is paid once per shape
        blocks.verify.observe((int) tok.size(), t_verify, blocks.now());
    }

    t0 = dspark_clock::now();
    // From here on the step commits: it must not be stopped halfway.
    struct no_abort {
        dspark_compute * c;
        explicit no_abort(dspark_compute * c) : c(c) { if (c) c->abortable = false; }
        ~no_abort() { if (c) c->abortable = true; }
    } guard_draft(dft ? &dft->compute : nullptr);
    // accept per sequence; the features of committed positions wait for the next proposal
    const int width = dft ? dft->hp().feature_width() : 0;
    const dspark_acceptor acceptor{tgt, dft};
    const int V = tgt.hp().n_vocab;
    for (size_t i = begin; i < end; ++i) {
        plan & p = plans[i];
        if (p.s->adjust && !backend) {  // the adjusted rows the acceptance rules read (host sampling)
            p.adjust = p.s->adjust->fill(tgt.logits.data() + (size_t) p.row * V, p.draft.data(), (int) p.draft.size());
        }
        const bool rejection = p.rejection_sampled();
        std::vector<dspark_token> emitted = rejection ? acceptor.rejection(p, p.s->sp, p.s->aux)
                                                      : acceptor.greedy_chain(p, p.s->sp, p.s->rng);
        if (!rejection && !p.s->sp.greedy()) {
            p.s->rng.advance((int) emitted.size());  // one committed draw per emitted token
        }
        const int accepted = (int) emitted.size() - 1;  // the last token is always the target's own
        const int n_past = p.s->n_past;
        commit(p, emitted, accepted);
        if (dft && p.s->status == DSPARK_SEQ_ACTIVE) {
            const int keep = p.s->n_past - n_past;  // the anchor and the accepted drafts
            const float * rows = tgt.captured.data() + (size_t) p.row * width;
            p.s->pending_feat.insert(p.s->pending_feat.end(), rows, rows + (size_t) keep * width);
            for (int j = 0; j < keep; ++j) {
                p.s->pending_pos.push_back(n_past + j);
                p.s->pending_tok.push_back(tok[p.row + j]);  // the anchor, then the accepted drafts
            }
        }
    }
    total.t_host_ms += dspark_ms_since(t0);
    return t_verify;
}

// Emit tokens (stopping early on an end condition), update stats, and trim the target cache to
// the anchor plus the accepted drafts; the last emitted token becomes the next anchor.
void dspark_engine::commit(plan & p, const std::vector<dspark_token> & emitted, int accepted) {
    dspark_seq_state & s = *p.s;
    const int k = (int) p.draft.size();
    dspark_stats_count_block(s.stats, k, accepted);
    dspark_stats_count_block(total, k, accepted);
    if (k > 0) {
        s.acc.observe(k, accepted);
        blocks.accept.observe(k, accepted);
    }
    const int n_past0 = s.n_past;
    const int V = tgt.hp().n_vocab;
    int n_emitted = 0;
    for (size_t j = 0; j < emitted.size(); ++j) {
        total.n_generated++;
        n_emitted++;
        if (s.logprobs) {  // host-sampled: the block's logits rows are here
            s.new_logprobs.add(tgt.logits.data() + (size_t) (p.row + j) * V, p.adjust ? p.adjust + j * V : nullptr, V, s.sp,
                               emitted[j]);
        }
        if (s.emit(emitted[j], j < (size_t) accepted, eog)) {
            break;
        }
    }
    if (s.adjust) {
        s.adjust->undo();
        p.adjust = nullptr;
        try {
            s.adjust->accept(emitted.data(), n_emitted);
        } catch (const std::exception & e) {  // finish the step (it committed), then fail it
            if (failed_commit.empty()) {
                failed_commit = e.what();
            }
        }
    }
    // keep the anchor and the accepted drafts in the target cache
    s.n_past = n_past0 + 1 + accepted;
    tgt.kv.seq_rm(s.id, s.n_past, -1);
    s.anchor = s.new_tokens.back();
    if (s.status == DSPARK_SEQ_ACTIVE && (uint32_t) s.n_past >= tgt.params.n_ctx) {
        s.status = DSPARK_SEQ_CTX_FULL;
    }
}
