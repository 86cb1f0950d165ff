#include "dspark-block-schedule.h"

#include <algorithm>

// Now and then the schedule runs a neighbour of its best length once: that keeps the costs and the
// acceptance of the lengths around it measured, so a change (a longer cache, other requests,
// another text) moves the choice. The interval starts at kExploreMin steps and doubles, up to
// kExploreMax, while the best length stays the same (a try costs: no draft for a while means a
// draft cache to catch up and graphs to rebuild).
static constexpr long kExploreMin = 16;
static constexpr long kExploreMax = 256;
// A new length must promise this much more than the current one: a change of length rebuilds
// the target's and the draft's graphs, and a draft resumed after steps without one first injects
// what they committed; neither is in the per-step costs (on a small model a rebuild costs about a
// step), so near-ties would otherwise flip the length back and forth.
static constexpr double kSwitchMargin = 0.15;
// Weight of a new gap in its running mean.
static constexpr double kNewGap = 0.25;

void dspark_block_schedule::init(int n_max_) {
    n_max = n_max_;
    draft.resize(n_max + 1);
    accept = dspark_acceptance(n_max);
}

void dspark_block_schedule::observe_gap(double ms, double last_step_ms) {
    gap_ms = (1.0 - kNewGap) * gap_ms + kNewGap * std::max(0.0, std::min(ms, last_step_ms));
}

double dspark_block_schedule::rate(const std::vector<const dspark_acceptance *> & seqs, const std::vector<int> & budget,
                                   int K) const {
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
    return tokens / ms;
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
    if (++n_steps >= next_explore) {
        explore_every = std::min(kExploreMax, explore_every * 2);
        next_explore = n_steps + explore_every;
        // alternately the next longer and the next shorter allowed length (the other where there is none)
        const int lo = std::max(1, n_min);
        const int longer = best == 0 ? lo : best + 1;
        const int shorter = best <= lo ? 0 : best - 1;
        const bool up = (explore_dir > 0 && longer <= n_max) || best == 0;
        explore_dir = -explore_dir;
        return up ? (longer <= n_max ? longer : best) : shorter;
    }
    return best;
}
