// One sequence of the engine: what its request asked for (sampler, random streams, limits, stop
// sequences), where it stands in the caches, what its last step committed, and its counters.
#pragma once

#include "dspark.h"
#include "dspark-acceptance.h"
#include "dspark-adjust.h"
#include "dspark-logprobs.h"
#include "dspark-sampler.h"

#include <memory>
#include <random>
#include <vector>

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
    std::vector<dspark_token> pending_tok;      // (and their tokens, which the draft's cells record)
    std::vector<dspark_token> new_tokens;       // committed by the last add / step
    std::vector<uint8_t>      new_from_draft;
    bool                      logprobs = false;  // record new_logprobs (the request asked for them)
    bool                      want_prompt_logprobs = false;
    std::shared_ptr<dspark_adjuster> adjust;    // bias / penalties / constraint; null: none asked for
    dspark_logprobs           new_logprobs;     // of new_tokens
    dspark_logprobs           prompt_logprobs;  // of prompt tokens 1 .. n-1 (prompt_logprobs requests)
    dspark_acceptance         acc;              // its recent acceptance by position (adaptive schedules)
    dspark_spec_stats         stats;

    dspark_seq_state() = default;
    // The sequence of a request: its sampler, seeds, limits and stop sequences, the request checked
    // against the target's vocabulary and context (throws INVALID_ARGUMENT naming the bad value).
    dspark_seq_state(int32_t id, const dspark_request & r, int32_t n_vocab, uint32_t n_ctx, int n_draft);

    // Does this sequence sample on the host (its logits are needed: logprobs, a repeat penalty)?
    // Its other adjustments are additive, and go into an in-graph sampler as an input.
    bool needs_logits() const { return logprobs || (adjust && adjust->needs_logits()); }

    // Emit token t (a draft's or the target's own); returns whether it ends the sequence (an
    // end-of-generation token, max_tokens, a stop sequence), and then sets the status.
    bool emit(dspark_token t, bool from_draft, const std::vector<dspark_token> & eog);
};

// Count a verified block of k drafted tokens, the first `accepted` of them accepted.
void dspark_stats_count_block(dspark_spec_stats & st, int k, int accepted);
