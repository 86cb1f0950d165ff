#include "dspark-engine.h"

#include "dspark-impl.h"

#include <algorithm>
#include <cmath>

using clock_type = std::chrono::steady_clock;

static double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}


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

dspark_engine::dspark_engine(dspark_context & target, dspark_draft_context * draft, const dspark_spec_params & p)
    : tgt(target), dft(draft), params(p) {
    abort.link(&tgt.compute);
    if (dft) {
        abort.link(&dft->compute);
    }
    total = dspark_spec_stats();
    if (params.n_min < 0 || params.n_max < 0 || params.markov_top_k < 0 || !(params.p_min >= 0.0f && params.p_min <= 1.0f)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "n_max, n_min and markov_top_k must be >= 0 and p_min in [0, 1]");
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
        calibrate_costs();
    }
}

// Sizes to calibrate at up to n: every one to 4, then about 1.5x apart, and n itself; the curve
// joins them by straight lines.
static std::vector<int> calibration_sizes(int n) {
    std::vector<int> sizes;
    for (int x = 1; x < n; x = x < 4 ? x + 1 : (x * 3 + 1) / 2) {
        sizes.push_back(x);
    }
    sizes.push_back(n);
    return sizes;
}

static double median_of_3(double t[3]) {
    std::sort(t, t + 3);
    return t[1];
}

// The cost curves' shapes, timed on the empty caches: the target's verify at a few batch sizes,
// and the draft's proposal of each block length at a few sequence counts. What steps measure
// later overrides and rescales them (the caches grow; other work shares the machine).
void dspark_engine::calibrate_costs() {
    const int max_b = (int) std::min<uint32_t>(tgt.params.n_batch, tgt.params.n_seq_max * (uint32_t) (n_draft + 1));
    if (tgt.kv.n_used() > 0 || dft->kv.n_used() > 0 || (uint32_t) max_b > tgt.params.n_ctx ||
        (uint32_t) (2 * n_draft + 2) > dft->params.n_ctx) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the adaptive and confidence schedules calibrate on empty contexts "
                     "(create the engine before adding sequences)");
    }
    blocks.init(n_draft);
    calibrate_verify(calibration_sizes(max_b));
    const std::vector<int> seqs = calibration_sizes((int) tgt.params.n_seq_max);
    for (int k = 1; k <= n_draft; ++k) {
        calibrate_draft(k, seqs);
    }
}

// Verify batches as steps lay them out: blocks of n_draft + 1 rows, one sequence each.
void dspark_engine::calibrate_verify(const std::vector<int> & sizes) {
    const int max_b = sizes.back();
    std::vector<dspark_token> tok(max_b, 0);
    std::vector<dspark_pos> pos(max_b);
    std::vector<dspark_seq_id> seq(max_b, 0);
    std::vector<int8_t> out(max_b, 1);
    for (int i = 0; i < max_b; ++i) {
        seq[i] = i / (n_draft + 1);
        pos[i] = i % (n_draft + 1);
    }
    std::vector<double> ms;
    for (int b : sizes) {
        double t[3];
        for (double & ti : t) {
            dspark_batch batch = {b, tok.data(), pos.data(), seq.data(), out.data()};
            const auto t0 = clock_type::now();
            tgt.decode(batch);
            ti = ms_since(t0);
            tgt.kv.seq_rm(-1, 0, -1);
        }
        ms.push_back(median_of_3(t));
    }
    blocks.verify.init(max_b, sizes, ms);
}

// Proposals of k tokens for n sequences, each after injecting k + 1 rows (what a step that
// accepted everything injects: the graph shape steps run).
void dspark_engine::calibrate_draft(int k, const std::vector<int> & seqs) {
    const int n = seqs.back(), width = dft->hp().feature_width();
    std::vector<float> feat((size_t) n * (k + 1) * width, 0.0f);
    std::vector<dspark_pos> inj_pos, pos0(n, k + 1);
    std::vector<dspark_seq_id> inj_seq, ids(n);
    std::vector<dspark_token> anchors(n, 0);
    for (int s = 0; s < n; ++s) {
        ids[s] = s;
        for (int j = 0; j <= k; ++j) {
            inj_pos.push_back(j);
            inj_seq.push_back(s);
        }
    }
    std::vector<double> ms;
    for (int m : seqs) {
        double t[3];
        for (double & ti : t) {
            dspark_propose_request r;
            r.n_seqs = m;
            r.anchors = anchors.data();
            r.pos0 = pos0.data();
            r.seq_ids = ids.data();
            r.n_draft = k;
            r.markov_top_k = params.markov_top_k;
            r.n_inject = m * (k + 1);
            r.inject_features = feat.data();
            r.inject_pos = inj_pos.data();
            r.inject_seq = inj_seq.data();
            const auto t0 = clock_type::now();
            dft->propose(r);
            ti = ms_since(t0);
            dft->kv.seq_rm(-1, 0, -1);
        }
        ms.push_back(median_of_3(t));
    }
    blocks.draft[k].init(n, seqs, ms);
}

// ---- sequences ------------------------------------------------------------------------------------

void dspark_engine::add(int32_t seq_id, const dspark_request & r) {
    if (seq_id < 0 || (uint32_t) seq_id >= tgt.params.n_seq_max) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence id %d: must be 0 .. %u", seq_id, tgt.params.n_seq_max - 1);
    }
    auto it = seqs.find(seq_id);
    if (it != seqs.end() && it->second.status == DSPARK_SEQ_ACTIVE) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sequence %d is still active; remove it first", seq_id);
    }
    if (!r.prompt || r.n_prompt < 1) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the prompt needs at least one token");
    }
    for (int32_t i = 0; i < r.n_prompt; ++i) {
        if (r.prompt[i] < 0 || r.prompt[i] >= tgt.hp().n_vocab) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "prompt token %d at index %d is outside the vocabulary (0 .. %d)",
                         r.prompt[i], i, tgt.hp().n_vocab - 1);
        }
    }
    if ((uint32_t) r.n_prompt >= tgt.params.n_ctx) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "a prompt of %d tokens does not fit in n_ctx (%u)", r.n_prompt, tgt.params.n_ctx);
    }
    if (r.n_stop < 0 || (r.n_stop > 0 && (!r.stop_tokens || !r.stop_lens))) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "stop sequences: need stop_tokens and stop_lens");
    }
    dspark_seq_state s;
    s.id = seq_id;
    s.sp = r.sampling ? dspark_sampler_from(*r.sampling) : dspark_sampler_params();
    const uint32_t seed = r.sampling && r.sampling->seed != DSPARK_DEFAULT_SEED ? r.sampling->seed : std::random_device()();
    s.rng = dspark_rng(seed);
    s.aux.seed(((uint64_t) seed << 1) | 1u);
    s.max_tokens = r.max_tokens;
    for (int32_t i = 0, off = 0; i < r.n_stop; off += r.stop_lens[i++]) {
        if (r.stop_lens[i] < 1) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "stop sequence %d is empty", i);
        }
        s.stops.emplace_back(r.stop_tokens + off, r.stop_tokens + off + r.stop_lens[i]);
    }
    s.stats = dspark_spec_stats();
    s.stats.n_prompt = r.n_prompt;
    s.acc = dspark_acceptance(n_draft);

    // the caches must hold nothing of this sequence
    tgt.kv.seq_rm(seq_id, 0, -1);
    if (dft) {
        dft->kv.seq_rm(seq_id, 0, -1);
    }
    const auto t0 = clock_type::now();
    try {
        for (int32_t off = 0; off < r.n_prompt; off += (int32_t) tgt.params.n_batch) {
            const int32_t n = std::min<int32_t>((int32_t) tgt.params.n_batch, r.n_prompt - off);
            std::vector<dspark_pos> pos(n);
            std::vector<dspark_seq_id> seq(n, seq_id);
            std::vector<int8_t> out(n, 0);
            for (int32_t i = 0; i < n; ++i) {
                pos[i] = off + i;
            }
            out[n - 1] = off + n == r.n_prompt;
            dspark_batch b = {n, r.prompt + off, pos.data(), seq.data(), out.data()};
            tgt.decode(b);
            if (dft) {
                for (int32_t c = 0; c < n; c += (int32_t) dft->params.n_batch) {
                    const int32_t m = std::min<int32_t>((int32_t) dft->params.n_batch, n - c);
                    const int32_t width = dft->hp().feature_width();
                    dft->inject(tgt.captured.data() + (size_t) c * width, m, width, pos.data() + c, seq.data() + c);
                }
            }
        }
    } catch (...) {
        tgt.kv.seq_rm(seq_id, 0, -1);
        if (dft) {
            dft->kv.seq_rm(seq_id, 0, -1);
        }
        throw;
    }
    s.n_past = r.n_prompt;
    s.status = DSPARK_SEQ_ACTIVE;
    const dspark_token first = dspark_sample_host(tgt.logits.data(), tgt.hp().n_vocab, s.sp, s.sp.greedy() ? 0.0f : s.rng.next());
    s.stats.t_prefill_ms = ms_since(t0);
    s.new_tokens.clear();
    s.new_from_draft.clear();
    s.anchor = first;
    s.new_tokens.push_back(first);
    s.new_from_draft.push_back(0);
    s.stats.n_generated = 1;
    s.tail.assign(1, first);
    seqs[seq_id] = s;
    dspark_seq_state & st = seqs[seq_id];
    if (finished_by(st, first)) {
        st.new_tokens.resize(1);
    }
    total.n_prompt += r.n_prompt;
    total.n_generated += 1;
    total.t_prefill_ms += st.stats.t_prefill_ms;
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

// Does token t end the sequence (end of generation, max_tokens, a stop sequence)? Sets the status.
bool dspark_engine::finished_by(dspark_seq_state & s, dspark_token t) {
    if (std::find(eog.begin(), eog.end(), t) != eog.end()) {
        s.status = DSPARK_SEQ_EOG;
        return true;
    }
    for (const auto & stop : s.stops) {
        if (s.tail.size() >= stop.size() && std::equal(stop.begin(), stop.end(), s.tail.end() - stop.size())) {
            s.status = DSPARK_SEQ_STOP;
            return true;
        }
    }
    if (s.max_tokens > 0 && s.stats.n_generated >= s.max_tokens) {
        s.status = DSPARK_SEQ_MAX_TOKENS;
        return true;
    }
    return false;
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

// ---- one step -------------------------------------------------------------------------------------

void dspark_engine::clear_new_tokens() {
    for (auto & kv : seqs) {
        kv.second.new_tokens.clear();
        kv.second.new_from_draft.clear();
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
    const auto t0 = clock_type::now();
    if (costed() && last_step_ms > 0.0) {
        blocks.observe_gap(std::chrono::duration<double, std::milli>(t0 - last_step_end).count(), last_step_ms);
    }
    const int k = dft && n_draft > 0 ? (costed() ? choose_block(plans) : n_draft) : 0;
    const uint64_t draft_builds = dft ? dft->n_graphs_built : 0;
    const drafted d = dft && n_draft > 0 ? draft_blocks(plans, k) : drafted();
    const double t_draft = ms_since(t0);
    if (costed() && d.n_seqs > 0 && d.steady && dft->n_graphs_built == draft_builds) {
        // what the next steps at this length cost: not a catch-up (the features of steps without a
        // draft) nor a graph build (a change of shape), both paid once
        blocks.draft[d.block].observe(d.n_seqs, t_draft, blocks.now());
    }
    verify(plans);  // accounts its own time
    total.t_draft_ms += t_draft;
    for (plan & p : plans) {
        p.s->stats.t_draft_ms += t_draft / plans.size();
    }
    int32_t active = 0;
    for (auto & kv : seqs) {
        active += kv.second.status == DSPARK_SEQ_ACTIVE;
    }
    last_step_end = clock_type::now();
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
    for (size_t i : which) {
        dspark_seq_state & s = *plans[i].s;
        inj_feat.insert(inj_feat.end(), s.pending_feat.begin(), s.pending_feat.end());
        inj_pos.insert(inj_pos.end(), s.pending_pos.begin(), s.pending_pos.end());
        inj_seq.insert(inj_seq.end(), s.pending_pos.size(), s.id);
    }
    const int32_t width = dft->hp().feature_width();
    size_t done = 0;
    while (inj_pos.size() - done > dft->params.n_batch) {  // more than one graph takes: inject ahead
        const int32_t m = (int32_t) dft->params.n_batch;
        dft->inject(inj_feat.data() + done * width, m, width, inj_pos.data() + done, inj_seq.data() + done);
        done += m;
    }
    // Probabilistic drafting: each sampled sequence drafts at its own temperature from noise of its
    // own stream (a greedy one at 0: argmax), so its block does not depend on its neighbours.
    // Its top-k / top-p / min-p filter the draft's logits too: q then has the support of p.
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
    }

    const int V = dft->hp().n_vocab;
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
        schedule_by_confidence(plans);
    }
    drafted d;
    d.n_seqs = (int) which.size();
    d.block = n_block;
    d.steady = inj_pos.size() <= which.size() * (size_t) (n_block + 1);
    return d;
}

// DSpark's hardware-aware prefix scheduler: order the drafted positions by their prefix survival
// probability (the product of confidences up to them) and verify the prefix of that order with
// the most expected emitted tokens per verify time. The whole order is scanned, not stopped at the
// first position that does not pay: verify time is not smooth in the batch size (kernels change
// with it), and a step up in cost can be followed by many positions that pay for it.
void dspark_engine::schedule_by_confidence(std::vector<plan> & plans) const {
    std::vector<std::vector<double>> surv(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) {
        double prod = 1.0;
        for (float c : plans[i].conf) {
            prod *= c;
            surv[i].push_back(prod);
        }
    }
    std::vector<size_t> n(plans.size(), 0);
    double expected = (double) plans.size();  // every sequence emits at least the target's token
    int batch = (int) plans.size();
    double best_rate = expected / blocks.verify.at(batch, blocks.now());
    std::vector<size_t> best_n = n;
    for (;;) {
        size_t best = plans.size();
        for (size_t i = 0; i < plans.size(); ++i) {
            if (n[i] < surv[i].size() && (best == plans.size() || surv[i][n[i]] > surv[best][n[best]])) {
                best = i;
            }
        }
        if (best == plans.size()) {
            break;
        }
        expected += surv[best][n[best]];
        batch++;
        n[best]++;
        const double r = expected / blocks.verify.at(batch, blocks.now());
        if (r > best_rate) {
            best_rate = r;
            best_n = n;
        }
    }
    for (size_t i = 0; i < plans.size(); ++i) {
        plans[i].draft.resize(best_n[i]);
        plans[i].conf.resize(best_n[i]);
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

// Sample this verify batch inside the target's graph? AUTO does where every sequence is greedy:
// the graph's argmax saves reading the logits back, while its filters and sorts for temperature
// sampling cost more than the host's (bench/bench_spec.py --sampling host backend).
bool dspark_engine::in_graph_sampling(const std::vector<plan> & plans, size_t begin, size_t end) const {
    if (params.backend_sampling != DSPARK_BACKEND_SAMPLING_AUTO) {
        return params.backend_sampling == DSPARK_BACKEND_SAMPLING_ON;
    }
    for (size_t i = begin; i < end; ++i) {
        if (!plans[i].s->sp.greedy()) {
            return false;
        }
    }
    return true;
}

// Decode plans [begin, end) in one target batch, then accept and commit each of them.
double dspark_engine::verify_chunk(std::vector<plan> & plans, size_t begin, size_t end) {
    auto t0 = clock_type::now();
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
        if (rejection_sampled(p)) {
            // p of each draft token in the graph; the last row samples the bonus token
            rows.probing = true;
            for (int j = 0; j < k; ++j) {
                rows.add(p.s->sp, 0.5f, (float) p.draft[j]);
            }
            p.bonus_u = bonus_uniform(p);
            rows.add(p.s->sp, p.bonus_u);
        } else {
            const std::vector<float> u = p.s->rng.peek(k + 1);
            for (int j = 0; j <= k; ++j) {
                rows.add(p.s->sp, u[j]);
            }
        }
    }
    std::vector<int8_t> out(tok.size(), 1);
    const uint64_t builds = tgt.n_graphs_built;
    dspark_batch b = {(int32_t) tok.size(), tok.data(), pos.data(), seq.data(), out.data()};
    tgt.decode(b, backend ? &rows : nullptr);
    const double t_verify = ms_since(t0);
    total.t_verify_ms += t_verify;
    if (costed() && tgt.n_graphs_built == builds) {  // a graph build is paid once per shape
        blocks.verify.observe((int) tok.size(), t_verify, blocks.now());
    }

    t0 = clock_type::now();
    // From here on the step commits: it must not be stopped halfway.
    struct no_abort {
        dspark_compute * c;
        explicit no_abort(dspark_compute * c) : c(c) { if (c) c->abortable = false; }
        ~no_abort() { if (c) c->abortable = true; }
    } guard_draft(dft ? &dft->compute : nullptr);
    // accept per sequence; the features of committed positions wait for the next proposal
    const int width = dft ? dft->hp().feature_width() : 0;
    for (size_t i = begin; i < end; ++i) {
        plan & p = plans[i];
        const bool rejection = rejection_sampled(p);
        std::vector<dspark_token> emitted = rejection ? accept_rejection(p) : accept_greedy_chain(p);
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
            }
        }
    }
    total.t_host_ms += ms_since(t0);
    return t_verify;
}

// Sample the target row by row and keep the drafts it agrees with (llama.cpp's rule). Greedy rows
// are argmax; sampled rows use the sequence's committed stream, one draw per row.
std::vector<dspark_token> dspark_engine::accept_greedy_chain(plan & p) const {
    const int k = (int) p.draft.size();
    const int V = tgt.hp().n_vocab;
    const std::vector<float> u = p.s->sp.greedy() ? std::vector<float>(k + 1, 0.0f) : p.s->rng.peek(k + 1);
    std::vector<dspark_token> out;
    for (int j = 0; j <= k; ++j) {
        const dspark_token t = tgt.has_sampled ? tgt.sampled[p.row + j]
                                               : dspark_sample_host(tgt.logits.data() + (size_t) (p.row + j) * V, V, p.s->sp, u[j]);
        out.push_back(t);
        if (j == k || t != p.draft[j]) {
            break;
        }
    }
    return out;
}

// q of draft slot j of block b at temperature T over the target vocabulary, from its (filtered,
// Markov-biased) logits: softmax(l / T), 0 where the logits are -inf (unreachable ids).
void dspark_engine::draft_q_row(int b, int j, float T, std::vector<float> & q) const {
    q.resize(dft->hp().n_vocab);
    dft->logits_row(b, j, q.data());
    dspark_softmax(q, 1.0f / T);
}

// Speculative rejection sampling: accept draft token x with probability min(1, p(x)/q(x)); on a
// rejection emit a sample of the residual max(p - q, 0); after k acceptances, a sample of p.
bool dspark_engine::rejection_sampled(const plan & p) const {
    return params.draft_mode == DSPARK_DRAFT_PROBABILISTIC && !p.s->sp.greedy() && !p.q.empty();
}

// The uniform of a block's bonus token (drawn first, so the host and the in-graph paths consume the
// sequence's stream alike: bonus, then one per tested draft token, then one for a residual).
float dspark_engine::bonus_uniform(plan & p) {
    if (p.bonus_u < 0.0f) {
        p.bonus_u = (float) std::uniform_real_distribution<double>(0.0, 1.0)(p.s->aux);
    }
    return p.bonus_u;
}

// The target's sampling distribution of verify row `row` over the vocabulary (read back first
// when the verify ran in-graph).
void dspark_engine::target_p_row(int row, const dspark_sampler_params & sp, std::vector<float> & pd) const {
    const int V = tgt.hp().n_vocab;
    std::vector<float> kept;
    const float * logits = tgt.logits.data() + (size_t) row * V;
    if (tgt.has_sampled) {
        kept.resize(V);
        tgt.logits_row(row, kept.data());
        logits = kept.data();
    }
    dspark_distribution dist;
    dspark_sampler_distribution(logits, V, sp, dist);
    if (!sp.sorts(V)) {  // every token a candidate, in vocabulary order: the probabilities are the row
        pd.swap(dist.probs);
        return;
    }
    pd.assign(V, 0.0f);
    for (size_t c = 0; c < dist.ids.size(); ++c) {
        pd[dist.ids[c]] = dist.probs[c];
    }
}

// Speculative rejection sampling, one draft token at a time: accept x with probability
// min(1, p(x) / q(x)) (q came with the draw; p from the verify graph, or from the logits on the
// host); at the first rejection emit a sample of the residual max(p - q, 0) (the only place whole
// rows are needed: one of p and one of q); after k acceptances, the bonus token sampled from p.
std::vector<dspark_token> dspark_engine::accept_rejection(plan & p) {
    const int k = (int) p.draft.size();
    const int V = tgt.hp().n_vocab;
    const float T = p.s->sp.temperature;
    std::uniform_real_distribution<double> unif(0.0, 1.0);
    const float u_bonus = bonus_uniform(p);
    std::vector<dspark_token> out;
    std::vector<float> pd, q;
    for (int j = 0; j < k; ++j) {
        const dspark_token x = p.draft[j];
        float px;
        if (tgt.has_sampled) {
            px = tgt.probed[p.row + j];
        } else {
            target_p_row(p.row + j, p.s->sp, pd);
            px = pd[x];
        }
        if (unif(p.s->aux) * p.q[j] < px) {
            out.push_back(x);
            continue;
        }
        if (tgt.has_sampled) {
            target_p_row(p.row + j, p.s->sp, pd);
        }
        draft_q_row(p.draft_block, j, T, q);
        double wsum = 0.0;
        for (int v = 0; v < V; ++v) {
            wsum += std::max(0.0f, pd[v] - q[v]);
        }
        const double u = unif(p.s->aux) * wsum;
        double cum = 0.0;
        dspark_token t = x;
        if (wsum > 0.0) {
            for (int v = 0; v < V; ++v) {
                cum += std::max(0.0f, pd[v] - q[v]);
                if (u < cum) {
                    t = v;
                    break;
                }
            }
        } else {  // p == q up to rounding (a rejection then has probability ~0): p's top token
            t = (dspark_token) (std::max_element(pd.begin(), pd.end()) - pd.begin());
        }
        out.push_back(t);
        return out;
    }
    // all drafts accepted: the bonus token, a draw of p at the last row
    if (tgt.has_sampled) {
        out.push_back(tgt.sampled[p.row + k]);
    } else {
        out.push_back(dspark_sample_host(tgt.logits.data() + (size_t) (p.row + k) * V, V, p.s->sp, u_bonus));
    }
    return out;
}

// Emit tokens (stopping early on an end condition), update stats, and trim the target cache to
// the anchor plus the accepted drafts; the last emitted token becomes the next anchor.
void dspark_engine::commit(plan & p, const std::vector<dspark_token> & emitted, int accepted) {
    dspark_seq_state & s = *p.s;
    const int k = (int) p.draft.size();
    s.stats.n_steps++;
    total.n_steps++;
    s.stats.n_drafted += k;
    total.n_drafted += k;
    for (int j = 0; j < k && j < DSPARK_STATS_MAX_POS; ++j) {
        s.stats.drafted_at[j]++;
        total.drafted_at[j]++;
        if (j < accepted) {
            s.stats.accepted_at[j]++;
            total.accepted_at[j]++;
        }
    }
    s.stats.n_accepted += accepted;
    total.n_accepted += accepted;
    if (k > 0) {
        s.acc.observe(k, accepted);
        blocks.accept.observe(k, accepted);
    }
    const int n_past0 = s.n_past;
    for (size_t j = 0; j < emitted.size(); ++j) {
        s.new_tokens.push_back(emitted[j]);
        s.new_from_draft.push_back(j < (size_t) accepted);
        s.stats.n_generated++;
        total.n_generated++;
        s.tail.push_back(emitted[j]);
        if (s.tail.size() > 64) {
            s.tail.erase(s.tail.begin());
        }
        if (finished_by(s, emitted[j])) {
            break;
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
