// Running acceptance by draft position: how likely a block's first j + 1 tokens all survive the
// verify, for one sequence (its own recent steps, pulled towards the engine-wide rate while it has
// few) — what an adaptive schedule expects a draft of a given length to be worth.
#pragma once

#include <vector>

struct dspark_acceptance {
    explicit dspark_acceptance(int n_pos = 0);
    // One verified block: k tokens drafted, the first `accepted` of them accepted.
    void observe(int k, int accepted);
    // P(positions 0 .. j all accepted), own evidence blended with `prior` (another estimate, e.g.
    // the engine-wide one; nullptr: an optimistic guess that makes untried lengths worth a try).
    double survival(int j, const dspark_acceptance * prior) const;
    int n_pos() const { return (int) drafted.size(); }

  private:
    std::vector<double> drafted, accepted;  // decayed counts by position
};
