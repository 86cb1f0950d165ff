// The speculative decoding engine: ties a target context and (optionally) a draft context, and
// runs steps over a batch of sequences — draft a block per sequence from its last committed token,
// verify all blocks with the target in one batch, accept per sequence the longest matching prefix
// plus one target token, roll back rejected cells, and inject the features of the committed
// positions into the draft. Output is lossless: greedy equals target-only greedy; sampled output
// has the target's distribution.
//
// The engine is the step loop; its parts live with what they are about: a sequence's request,
// limits and counters (dspark-sequence.h), the acceptance rules (dspark-acceptance.h), the block
// length schedules with their cost calibration and the confidence cut (dspark-block-schedule.h,
// dspark-cost-curve.h), the sampler (dspark-sampler.h), a request's adjustment of the logits —
// logit bias, penalties, a constraint's masks, one row per verify row (dspark-adjust.h) — and
// the logprobs of committed tokens (dspark-logprobs.h). A sequence with logprobs or a repeat
// penalty samples its verify batch on the host (its rows' logits are read back); its other
// adjustments are additive and go into an in-graph sampler as an input; the others pay nothing.
#pragma once

#include "dspark.h"
#include "dspark-acceptance.h"
#include "dspark-block-schedule.h"
#include "dspark-context.h"
#include "dspark-draft.h"
#include "dspark-sampler.h"
#include "dspark-sequence.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

using dspark_clock = std::chrono::steady_clock;
using clock_t_point = dspark_clock::time_point;

// Milliseconds since t0 (the engine's timings).
inline double dspark_ms_since(clock_t_point t0) {
    return std::chrono::duration<double, std::milli>(dspark_clock::now() - t0).count();
}

// Draft tokens per step for n_max (0 = the most the draft's block layout allows; larger is clamped).
int32_t dspark_clamp_n_draft(const dflash_hparams & draft, int32_t n_max);
// Throws INVALID_ARGUMENT for settings no engine accepts (the rules that need no model).
void dspark_spec_params_check(const dspark_spec_params & params);

struct dspark_engine {
    dspark_context &       tgt;
    dspark_draft_context * dft = nullptr;
    dspark_spec_params     params;
    int32_t                n_draft = 0;   // block tokens proposed per drafting sequence (n_max clamped)
    std::vector<dspark_token> eog;
    std::map<int32_t, dspark_seq_state> seqs;
    dspark_block_schedule  blocks;        // costs and acceptance (adaptive and confidence schedules)
    clock_t_point          last_step_end{};
    double                 last_step_ms = 0.0;
    dspark_spec_stats      total;
    dspark_abort_request   abort;         // the stop request both contexts' computations read

    dspark_engine(dspark_context & target, dspark_draft_context * draft, const dspark_spec_params & params);

    void add(int32_t seq_id, const dspark_request & req);  // prefill and the first token (validates req)
    // Prompt caching: how many leading prompt tokens seq_id's cells hold in both caches (at most
    // n_prompt - 1: the last one is always decoded, for the first token's logits).
    int32_t cached_prefix(int32_t seq_id, const dspark_token * prompt, int32_t n_prompt) const;
    const dspark_seq_state & seq(int32_t seq_id) const;     // throws for an unknown sequence
    int32_t status(int32_t seq_id) const;                   // DSPARK_SEQ_IDLE for an unknown one
    int32_t step();                                         // returns the number of active sequences
    // Up to max_steps steps, ending early after a step in which a sequence finished, when none is
    // active, or when a stop was requested; the tokens of all of them accumulate. Returns the
    // number of steps run. A failing step throws; the tokens of the steps before it stay readable.
    int32_t run(int32_t max_steps);
    void remove(int32_t seq_id);
    void detach(int32_t seq_id);  // forget the sequence, leave its cells (for a later add's reuse_prefix)

  private:
    void    check_seq_id(int32_t seq_id) const;
    int32_t prefill(dspark_seq_state & s, const dspark_request & req, int32_t from);  // the last row's index
    dspark_token first_token(dspark_seq_state & s, const float * logits);
    std::string failed_commit;  // a constraint's commit failure in this step (thrown at its end)
    void    clear_new_tokens();
    int32_t step_once();  // one step, adding to each sequence's new tokens; returns the active count
    struct plan : dspark_verify_block {  // one sequence's part of a step
        dspark_seq_state * s = nullptr;
    };
    bool costed() const { return params.schedule != DSPARK_SCHEDULE_STATIC; }
    int  choose_block(const std::vector<plan> & plans);
    struct drafted {
        int  n_seqs = 0;      // sequences that drafted
        int  block = 0;       // the block length the draft ran
        bool steady = false;  // it injected no more than a step's rows (no catching up)
    };
    drafted draft_blocks(std::vector<plan> & plans, int k_greedy);
    void constrain_drafts(std::vector<plan> & plans);
    void verify(std::vector<plan> & plans);
    double verify_chunk(std::vector<plan> & plans, size_t begin, size_t end);
    bool   in_graph_sampling(const std::vector<plan> & plans, size_t begin, size_t end) const;
    void   adjust_rows(const std::vector<plan> & plans, size_t begin, size_t end, dspark_sampler_rows & rows) const;
    void commit(plan & p, const std::vector<dspark_token> & out, int n_drafted_accepted);
    int    draft_budget(const dspark_seq_state & s) const;
};
