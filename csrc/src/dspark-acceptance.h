// Acceptance: the rules that decide which drafted tokens a verified block keeps (greedy chain and
// speculative rejection sampling, dspark_acceptor), and the running acceptance by draft position
// that schedules plan with (dspark_acceptance).
//
// Running acceptance by draft position: how likely a block's first j + 1 tokens all survive the
// verify, for one sequence (its own recent steps, pulled towards the engine-wide rate while it has
// few) — what an adaptive schedule expects a draft of a given length to be worth.
//
// It is kept as conditionals: the chance that position i is accepted once every position before it
// was, and a survival is their product. A position rarely tested leans on the pooled conditional
// of all positions (constant-hazard extrapolation), so one unlucky block cannot write off every
// length beyond it, and lengths never drafted are valued from the positions that were.
#pragma once

#include "dspark.h"
#include "dspark-sampler.h"

#include <random>
#include <vector>

struct dspark_context;
struct dspark_draft_context;

// ---- the rules ------------------------------------------------------------------------------------

// One sequence's block in a verify batch, as the acceptance rules read it.
struct dspark_verify_block {
    std::vector<dspark_token> draft;   // tokens verified after the anchor
    std::vector<float>        conf;    // their confidences (drafts with a confidence head)
    std::vector<float>        q;       // [k] q of each drafted token (probabilistic drafting)
    int   draft_block = -1;            // its block in the last propose (to read a q row lazily)
    float bonus_u     = -1.0f;         // the bonus token's uniform, once drawn (rejection sampling)
    int   row         = 0;             // first row in the verify batch
    const float * adjust = nullptr;    // [k + 1][n_vocab] the rows' adjustments (dspark-adjust.h), or null
    bool  cut_banned  = false;         // a constraint cut the draft before a token it bans (slot k)

    // Drafted by sampling (q known): accepted by rejection sampling, else by the greedy chain.
    bool rejection_sampled() const { return !q.empty() || cut_banned; }
    // The uniform of the bonus token, drawn first (so the host and the in-graph paths consume the
    // sequence's stream alike: bonus, then one per tested draft token, then one for a residual).
    float bonus_uniform(std::mt19937_64 & aux);
};

// The tokens a verified block emits: the accepted drafts, then one token of the target's own. It
// reads the verify batch's outputs (logits on the host, or tokens and probabilities sampled in
// the graph) and, on a rejection, the draft's logits of the rejected slot.
struct dspark_acceptor {
    const dspark_context &       tgt;
    const dspark_draft_context * dft;

    // Sample the target row by row and keep the drafts it agrees with (llama.cpp's rule). Greedy
    // rows are argmax; sampled rows use the sequence's committed stream, one draw per row.
    std::vector<dspark_token> greedy_chain(const dspark_verify_block & b, const dspark_sampler_params & sp,
                                           const dspark_rng & rng) const;
    // Speculative rejection sampling, one draft token at a time: accept x with probability
    // min(1, p(x) / q(x)); at the first rejection emit a sample of the residual max(p - q, 0);
    // after k acceptances, the bonus token sampled from p.
    std::vector<dspark_token> rejection(dspark_verify_block & b, const dspark_sampler_params & sp, std::mt19937_64 & aux) const;

  private:
    void target_p_row(int row, const dspark_sampler_params & sp, std::vector<float> & p, const float * adjust) const;
    dspark_token residual(const std::vector<float> & p, const std::vector<float> & q, double u) const;
    void draft_q_row(int block, int slot, float temperature, std::vector<float> & q) const;
};

// ---- running acceptance -----------------------------------------------------------------------------

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
