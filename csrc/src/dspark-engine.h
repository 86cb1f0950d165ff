// The speculative decoding engine: ties a target context and (optionally) a draft context, and
// runs steps over a batch of sequences — draft a block per sequence from its last committed token,
// verify all blocks with the target in one batch, accept per sequence the longest matching prefix
// plus one target token, roll back rejected cells, and inject the features of the committed
// positions into the draft. Output is lossless: greedy equals target-only greedy; sampled output
// has the target's distribution.
#pragma once

#include "dspark.h"
#include "dspark-acceptance.h"
#include "dspark-block-schedule.h"
#include "dspark-context.h"
#include "dspark-draft.h"
#include "dspark-sampler.h"

#include <chrono>
#include <map>
#include <random>
#include <vector>

using clock_t_point = std::chrono::steady_clock::time_point;

struct dspark_seq_state {
    int32_t               id = 0;
    int32_t               status = DSPARK_SEQ_IDLE;
    dspark_sampler_params sp;
    dspark_rng            rng;       // the committed stream of target sampling
    std::mt19937_64       aux;       // acceptance tests and draft noise (probabilistic drafting)
    int32_t               n_past = 0;  // target (and draft) cells [0, n_past) hold committed tokens
    dspark_token          anchor = 0;  // the last committed token, not yet in the caches
    int32_t               max_tokens = 0;
    std::vector<std::vector<dspark_token>> stops;
    std::vector<dspark_token> tail;    // recent output, for stop sequences
    std::vector<float>        pending_feat;     // target features of committed positions not yet in the
    std::vector<dspark_pos>   pending_pos;      // draft cache: injected with the next proposal
    std::vector<dspark_token> new_tokens;       // committed by the last add / step
    std::vector<uint8_t>      new_from_draft;
    dspark_acceptance         acc;              // its recent acceptance by position (adaptive schedules)
    dspark_spec_stats     stats;
};

// Draft tokens per step for n_max (0 = the most the draft's block layout allows; larger is clamped).
int32_t dspark_clamp_n_draft(const dflash_hparams & draft, int32_t n_max);

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
    const dspark_seq_state & seq(int32_t seq_id) const;     // throws for an unknown sequence
    int32_t status(int32_t seq_id) const;                   // DSPARK_SEQ_IDLE for an unknown one
    int32_t step();                                         // returns the number of active sequences
    // Up to max_steps steps, ending early after a step in which a sequence finished, when none is
    // active, or when a stop was requested; the tokens of all of them accumulate. Returns the
    // number of steps run. A failing step throws; the tokens of the steps before it stay readable.
    int32_t run(int32_t max_steps);
    void remove(int32_t seq_id);

  private:
    void    clear_new_tokens();
    int32_t step_once();  // one step, adding to each sequence's new tokens; returns the active count
    struct plan {  // one sequence's part of a step
        dspark_seq_state * s;
        std::vector<dspark_token> draft;     // tokens to verify after the anchor
        std::vector<float>        conf;
        std::vector<float>        q;         // [k] q of each drafted token (probabilistic drafting)
        int draft_block = -1;                // its block in the last propose (to read a q row lazily)
        float bonus_u = -1.0f;               // the bonus token's uniform, once drawn (rejection sampling)
        int row = 0;                         // first row in the verify batch
    };
    bool costed() const { return params.schedule != DSPARK_SCHEDULE_STATIC; }
    int  choose_block(const std::vector<plan> & plans);
    struct drafted {
        int  n_seqs = 0;      // sequences that drafted
        int  block = 0;       // the block length the draft ran
        bool steady = false;  // it injected no more than a step's rows (no catching up)
    };
    drafted draft_blocks(std::vector<plan> & plans, int k_greedy);
    void schedule_by_confidence(std::vector<plan> & plans) const;
    void verify(std::vector<plan> & plans);
    double verify_chunk(std::vector<plan> & plans, size_t begin, size_t end);
    bool   in_graph_sampling(const std::vector<plan> & plans, size_t begin, size_t end) const;
    std::vector<dspark_token> accept_greedy_chain(plan & p) const;
    std::vector<dspark_token> accept_rejection(plan & p);
    void draft_q_row(int block, int slot, float temperature, std::vector<float> & q) const;
    void target_p_row(int row, const dspark_sampler_params & sp, std::vector<float> & pd) const;
    bool rejection_sampled(const plan & p) const;
    float bonus_uniform(plan & p);
    void commit(plan & p, const std::vector<dspark_token> & out, int n_drafted_accepted);
    bool finished_by(dspark_seq_state & s, dspark_token t);
    void calibrate_costs();
    void calibrate_verify(const std::vector<int> & sizes);
    void calibrate_draft(int k, const std::vector<int> & seqs);
    int    draft_budget(const dspark_seq_state & s) const;
};
