#include "dspark-acceptance.h"

#include <algorithm>
#include <cmath>

// Old blocks fade: acceptance changes along a text (boilerplate, then prose), and a schedule that
// follows the last few dozen steps reacts within a request of a few hundred tokens.
static constexpr double kKeep = 0.95;
// The prior counts as this many blocks: a new sequence starts at the engine's rate and moves to
// its own within a handful of steps.
static constexpr double kPriorWeight = 4.0;
// With no evidence at all a position survives with this chance per token (so the first steps
// draft, and measure, long blocks).
static constexpr double kGuess = 0.8;

dspark_acceptance::dspark_acceptance(int n_pos) : drafted(n_pos, 0.0), accepted(n_pos, 0.0) {}

void dspark_acceptance::observe(int k, int n_acc) {
    k = std::min(k, n_pos());
    for (int j = 0; j < k; ++j) {
        drafted[j] = kKeep * drafted[j] + 1.0;
        accepted[j] = kKeep * accepted[j] + (j < n_acc ? 1.0 : 0.0);
    }
}

double dspark_acceptance::survival(int j, const dspark_acceptance * prior) const {
    if (j < 0 || j >= n_pos()) {
        return 0.0;
    }
    const double p = prior ? prior->survival(j, nullptr) : std::pow(kGuess, j + 1);
    const double w = prior ? kPriorWeight : 1.0;
    return (accepted[j] + w * p) / (drafted[j] + w);
}
