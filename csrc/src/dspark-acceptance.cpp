#include "dspark-acceptance.h"

#include <algorithm>

// Old blocks fade: acceptance changes along a text (boilerplate, then prose), and a schedule that
// follows the last few dozen steps reacts within a request of a few hundred tokens.
static constexpr double kKeep = 0.95;
// The prior counts as this many blocks: a new sequence starts at the engine's rate and moves to
// its own within a handful of steps.
static constexpr double kPriorWeight = 4.0;
// With no evidence at all a position is accepted with this chance (so the first steps draft, and
// measure, long blocks); it counts as kGuessWeight tests in the pooled conditional, and the pooled
// conditional as kPooledWeight tests of each position: a position must fail several times more
// often than the others before lengths beyond it look worse (it is tested only while they are
// drafted).
static constexpr double kGuess = 0.8;
static constexpr double kGuessWeight = 2.0;
static constexpr double kPooledWeight = 4.0;

dspark_acceptance::dspark_acceptance(int n_pos) : tested(n_pos, 0.0), accepted(n_pos, 0.0) {}

void dspark_acceptance::observe(int k, int n_acc) {
    k = std::min(k, n_pos());
    // positions 0 .. n_acc were tested (the first rejected one included), the first n_acc kept
    for (int j = 0; j < k && j <= n_acc; ++j) {
        tested[j] = kKeep * tested[j] + 1.0;
        accepted[j] = kKeep * accepted[j] + (j < n_acc ? 1.0 : 0.0);
    }
}

double dspark_acceptance::pooled() const {
    double t = 0.0, a = 0.0;
    for (int i = 0; i < n_pos(); ++i) {
        t += tested[i];
        a += accepted[i];
    }
    return (a + kGuessWeight * kGuess) / (t + kGuessWeight);
}

double dspark_acceptance::conditional(int i, const dspark_acceptance * prior) const {
    const double p = prior ? prior->conditional(i, nullptr) : pooled();
    const double w = prior ? kPriorWeight : kPooledWeight;
    return (accepted[i] + w * p) / (tested[i] + w);
}

double dspark_acceptance::survival(int j, const dspark_acceptance * prior) const {
    if (j < 0 || j >= n_pos()) {
        return 0.0;
    }
    double s = 1.0;
    for (int i = 0; i <= j; ++i) {
        s *= conditional(i, prior);
    }
    return s;
}
