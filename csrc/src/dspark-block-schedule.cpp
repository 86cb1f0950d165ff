#include "dspark-block-schedule.h"

#include "dspark-context.h"
#include "dspark-draft.h"
#include "dspark-impl.h"

#include <algorithm>
#include <chrono>

// Now and then the schedule runs another length once: that keeps the costs and the acceptance of
// the lengths around its best measured, so a change (a longer cache, other requests, another
// text) moves the choice. The tries cycle through the longest block, a shorter neighbour of the
// best, a longer one, and no draft (from no draft: a longer one). The longest block measures the
// acceptance of every position in one step, which neighbours alone never reach where the rate is
// not concave in the length: on a 0.6B model a 2-token verify costs twice a 1-token one and a
// 9-token one only 5 times, so no short block pays while long ones do, and a schedule stepping one token at a time from "no draft"
// stays there. The first step of a schedule is such a try; then the interval starts at
// kExploreMin steps and doubles, up to kExploreMax, while the best length stays the same. A try
// costs (no draft for a while means a draft cache to catch up, and a new length graphs to build):
// on a small model 4-8 ordinary steps, enough to lose 20 % of a 128-token request to three tries.
// So a try also waits until the steps since the last one took kExploreShare⁻¹ times what that one
// cost beyond an ordinary step.
static constexpr long kExploreMin = 16;
static constexpr long kExploreMax = 256;
static constexpr double kExploreShare = 0.05;
// A new length must promise this much more than the current one: a change of length rebuilds
// the target's and the draft's graphs, and a draft resumed after steps without one first injects
// what they committed; those enter the per-step costs only as a running average (extra_ms), not
// for the step that pays them, so near-ties would otherwise flip the length back and forth. A
// switch costs about a step and the new length holds for kExploreMin steps and more, so a few
// percent repay it; a wider margin keeps lengths that lose: a useless draft of one token costs a
// sixth of a step on SmolLM2-135M (Zen 4, 2 cores), under the 15 % this margin once was, so the
// schedule stepped down to one token and stayed there (0.90-0.95x of no draft).
static constexpr double kSwitchMargin = 0.05;
// Weight of a new gap in its running mean.
static constexpr double kNewGap = 0.25;
// Per step, the unmodeled time of the kind of step not run (with or without a draft) moves this
// much of the way to the other kind's: most of it is the host's, common to both, and a value
// measured once (a step that rebuilt graphs, a cold cache after other work) must not outlive the
// steps that would correct it. Without this a spike in the time of steps without a draft, seen
// just before the schedule chose to draft, stayed as long as it drafted and kept it drafting (a
// draft that is never accepted drafted 1-2 tokens a step for whole requests).
static constexpr double kOtherFade = 1.0 / 16;

void dspark_block_schedule::init(int n_max_) {
    n_max = n_max_;
    draft.resize(n_max + 1);
    accept = dspark_acceptance(n_max);
}

void dspark_block_schedule::observe_gap(double ms, double last_step_ms) {
    gap_ms = (1.0 - kNewGap) * gap_ms + kNewGap * std::max(0.0, std::min(ms, last_step_ms));
}

void dspark_block_schedule::observe_step(double ms) {
    if (chosen < 0) {
        return;
    }
    double & extra = extra_ms[chosen > 0];
    double & other = extra_ms[chosen == 0];
    extra = (1.0 - kNewGap) * extra + kNewGap * std::max(0.0, ms - chosen_ms);
    other += kOtherFade * (extra - other);
    if (explored) {
        explore_cost_ms = std::max(0.0, ms - plain_ms);
        since_explore_ms = 0.0;
    } else {
        plain_ms = plain_ms > 0.0 ? (1.0 - kNewGap) * plain_ms + kNewGap * ms : ms;
        since_explore_ms += ms;
    }
    chosen = -1;
}

double dspark_block_schedule::rate(const std::vector<const dspark_acceptance *> & seqs, const std::vector<int> & budget,
                                   int K) const {
    double tokens = 0.0;
    const double ms = modeled_ms(seqs, budget, K, &tokens) + extra_ms[K > 0];
    return tokens / ms;
}

// The curves' time of a step of length K (no gap, no unmodeled time) and its expected tokens.
double dspark_block_schedule::modeled_ms(const std::vector<const dspark_acceptance *> & seqs,
                                         const std::vector<int> & budget, int K, double * tokens_out) const {
    double tokens = 0.0;
    int rows = 0, drafting = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        const int k = std::min(K, budget[i]);
        double surv = 1.0;
        tokens += 1.0;
        for (int j = 0; j < k; ++j) {
            surv = std::min(surv, seqs[i]->survival(j, &accept));  // a longer prefix never survives more
            tokens += surv;
        }
        rows += 1 + k;
        drafting += k > 0;
    }
    double ms = gap_ms + verify.at(rows, now());
    if (K > 0 && drafting > 0) {
        ms += draft[K].at(drafting, now());
    }
    *tokens_out = tokens;
    return ms;
}

int dspark_block_schedule::choose(const std::vector<const dspark_acceptance *> & seqs, const std::vector<int> & budget,
                                  int n_min) {
    int best = 0;
    double best_rate = rate(seqs, budget, 0);
    for (int K = std::max(1, n_min); K <= n_max; ++K) {
        const double r = rate(seqs, budget, K);
        if (r > best_rate) {
            best = K;
            best_rate = r;
        }
    }
    if (last_best >= 0 && best != last_best && rate(seqs, budget, last_best) * (1.0 + kSwitchMargin) >= best_rate) {
        best = last_best;
    }
    if (best != last_best) {
        explore_every = kExploreMin;
        next_explore = std::min(next_explore, n_steps + explore_every);
        last_best = best;
    }
    explored = ++n_steps >= next_explore && since_explore_ms * kExploreShare >= explore_cost_ms;
    if (explored) {
        if (n_steps > 1) {
            explore_every = std::min(kExploreMax, explore_every * 2);
        }
        next_explore = n_steps + explore_every;
        best = explore(best, n_min);
    }
    double tokens;
    chosen = best;
    chosen_ms = modeled_ms(seqs, budget, best, &tokens) - gap_ms;
    return best;
}

// The length to try instead of `best` (see the top of the file); a neighbour that does not exist
// gives its place to the other one.
int dspark_block_schedule::explore(int best, int n_min) {
    const int lo = std::max(1, n_min);
    const int longer = best == 0 ? lo : best + 1;
    const int shorter = best <= lo ? 0 : best - 1;
    const int phase = explore_phase;
    explore_phase = (explore_phase + 1) % 4;
    if (phase == 0 && lo <= n_max) {  // even where it is the best: the first step must measure every position
        return n_max;
    }
    if (phase == 3 && best > 0) {  // no draft: its cost is measured again however long the best has drafted
        return 0;
    }
    const bool up = (phase == 2 && longer <= n_max) || best == 0;
    return up ? (longer <= n_max ? longer : best) : shorter;
}

// ---- calibration ----------------------------------------------------------------------------------

template <typename F>
static double time_ms(F && f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void dspark_block_schedule::calibrate(dspark_context & tgt, dspark_draft_context & dft, int n_max_, int markov_top_k) {
    const int B = n_max_ + 1;  // a verify block
    const int n_seq = (int) tgt.params.n_seq_max;
    const int max_b = (int) std::min<uint32_t>(tgt.params.n_batch, (uint32_t) (n_seq * B));
    if (tgt.kv.n_used() > 0 || dft.kv.n_used() > 0 || (uint32_t) max_b > tgt.params.n_ctx ||
        (uint32_t) (2 * n_max_ + 2) > dft.params.n_ctx) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the adaptive and confidence schedules calibrate on empty contexts "
                     "(create the engine before adding sequences)");
    }
    init(n_max_);

    // verify batches as steps lay them out: blocks of n_max + 1 rows, one sequence each
    std::vector<dspark_token> tok(max_b, 0);
    std::vector<dspark_pos> pos(max_b);
    std::vector<dspark_seq_id> seq(max_b);
    std::vector<int8_t> out(max_b, 1);
    for (int i = 0; i < max_b; ++i) {
        seq[i] = i / B;
        pos[i] = i % B;
    }
    verify.calibrate(max_b, [&](int b) {
        const dspark_batch batch = {b, tok.data(), pos.data(), seq.data(), out.data()};
        const double ms = time_ms([&] { tgt.decode(batch); });
        tgt.kv.seq_rm(-1, 0, -1);
        return ms;
    });

    // proposals of k tokens for m sequences, each after injecting k + 1 rows (what a step that
    // accepted everything injects: the graph shape steps run)
    const int width = dft.hp().feature_width();
    std::vector<dspark_seq_id> ids(n_seq);
    for (int s = 0; s < n_seq; ++s) {
        ids[s] = s;
    }
    const std::vector<dspark_token> anchors(n_seq, 0);
    for (int k = 1; k <= n_max_; ++k) {
        const std::vector<float> feat((size_t) n_seq * (k + 1) * width, 0.0f);
        const std::vector<dspark_pos> pos0(n_seq, k + 1);
        std::vector<dspark_pos> inj_pos;
        std::vector<dspark_seq_id> inj_seq;
        for (int s = 0; s < n_seq; ++s) {
            for (int j = 0; j <= k; ++j) {
                inj_pos.push_back(j);
                inj_seq.push_back(s);
            }
        }
        draft[k].calibrate(n_seq, [&](int m) {
            dspark_propose_request r;
            r.n_seqs = m;
            r.anchors = anchors.data();
            r.pos0 = pos0.data();
            r.seq_ids = ids.data();
            r.n_draft = k;
            r.markov_top_k = markov_top_k;
            r.n_inject = m * (k + 1);
            r.inject_features = feat.data();
            r.inject_pos = inj_pos.data();
            r.inject_seq = inj_seq.data();
            const double ms = time_ms([&] { dft.propose(r); });
            dft.kv.seq_rm(-1, 0, -1);
            return ms;
        });
    }
}

// ---- the confidence schedule ----------------------------------------------------------------------

// Order the drafted positions by their prefix survival probability (the product of confidences up
// to them) and verify the prefix of that order with the most expected emitted tokens per verify
// time. The whole order is scanned, not stopped at the first position that does not pay: verify
// time is not smooth in the batch size (kernels change with it), and a step up in cost can be
// followed by many positions that pay for it.
void dspark_block_schedule::cut_by_confidence(const std::vector<dspark_verify_block *> & blocks, int fixed_rows) const {
    const size_t n_seq = blocks.size();
    std::vector<std::vector<double>> surv(n_seq);
    for (size_t i = 0; i < n_seq; ++i) {
        double prod = 1.0;
        for (float c : blocks[i]->conf) {
            prod *= c;
            surv[i].push_back(prod);
        }
    }
    std::vector<size_t> n(n_seq, 0);
    double expected = (double) n_seq;  // every sequence emits at least the target's token
    int batch = (int) n_seq + fixed_rows;
    double best_rate = expected / verify.at(batch, now());
    std::vector<size_t> best_n = n;
    for (;;) {
        size_t best = n_seq;
        for (size_t i = 0; i < n_seq; ++i) {
            if (n[i] < surv[i].size() && (best == n_seq || surv[i][n[i]] > surv[best][n[best]])) {
                best = i;
            }
        }
        if (best == n_seq) {
            break;
        }
        expected += surv[best][n[best]];
        batch++;
        n[best]++;
        const double r = expected / verify.at(batch, now());
        if (r > best_rate) {
            best_rate = r;
            best_n = n;
        }
    }
    for (size_t i = 0; i < n_seq; ++i) {
        blocks[i]->draft.resize(best_n[i]);
        blocks[i]->conf.resize(best_n[i]);
    }
}
