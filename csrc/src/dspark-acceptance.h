// Running acceptance by draft position: how likely a block's first j + 1 tokens all survive the
// verify, for one sequence (its own recent steps, pulled towards the engine-wide rate while it has
// few) — what an adaptive schedule expects a draft of a given length to be worth.
//
// It is kept as conditionals: the chance that position i is accepted once every position before it
// was, and a survival is their product. A position rarely tested leans on the pooled conditional
// of all positions (constant-hazard extrapolation), so one unlucky block cannot write off every
// length beyond it, and lengths never drafted are valued from the positions that were.
#pragma once

#include <vector>

struct dspark_acceptance {
    explicit dspark_acceptance(int n_pos = 0);
    // One verified block: k tokens drafted, the first `accepted` of them accepted.
    void observe(int k, int accepted);
    // P(positions 0 .. j all accepted), own evidence blended with `prior` (another estimate, e.g.
    // the engine-wide one; nullptr: the pooled conditional of this estimate's own positions).
    double survival(int j, const dspark_acceptance * prior) const;
    int n_pos() const { return (int) tested.size(); }

  private:
    double conditional(int i, const dspark_acceptance * prior) const;
    double pooled() const;

    std::vector<double> tested, accepted;  // decayed counts by position: blocks that reached it, and kept it
};
