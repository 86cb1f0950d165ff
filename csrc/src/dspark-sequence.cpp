#include "dspark-sequence.h"

#include "dspark-impl.h"

#include <algorithm>

dspark_seq_state::dspark_seq_state(int32_t seq_id, const dspark_request & r, int32_t n_vocab, uint32_t n_ctx, int n_draft)
    : id(seq_id) {
    if (!r.prompt || r.n_prompt < 1) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "the prompt needs at least one token");
    }
    for (int32_t i = 0; i < r.n_prompt; ++i) {
        if (r.prompt[i] < 0 || r.prompt[i] >= n_vocab) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "prompt token %d at index %d is outside the vocabulary (0 .. %d)",
                         r.prompt[i], i, n_vocab - 1);
        }
    }
    if ((uint32_t) r.n_prompt >= n_ctx) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "a prompt of %d tokens does not fit in n_ctx (%u)", r.n_prompt, n_ctx);
    }
    if (r.n_stop < 0 || (r.n_stop > 0 && (!r.stop_tokens || !r.stop_lens))) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "stop sequences: need stop_tokens and stop_lens");
    }
    sp = r.sampling ? dspark_sampler_from(*r.sampling) : dspark_sampler_params();
    const uint32_t seed = r.sampling && r.sampling->seed != DSPARK_DEFAULT_SEED ? r.sampling->seed : std::random_device()();
    rng = dspark_rng(seed);
    aux.seed(((uint64_t) seed << 1) | 1u);
    max_tokens = r.max_tokens;
    for (int32_t i = 0, off = 0; i < r.n_stop; off += r.stop_lens[i++]) {
        if (r.stop_lens[i] < 1) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "stop sequence %d is empty", i);
        }
        stops.emplace_back(r.stop_tokens + off, r.stop_tokens + off + r.stop_lens[i]);
    }
    dspark_adjuster::check(r, n_vocab);
    if (dspark_adjuster::wanted(r)) {
        adjust = std::make_shared<dspark_adjuster>(r, n_vocab, n_draft + 1);
    }
    logprobs = r.logprobs;
    want_prompt_logprobs = r.prompt_logprobs;
    new_logprobs.top = prompt_logprobs.top = r.top_logprobs;
    stats = dspark_spec_stats();
    stats.n_prompt = r.n_prompt;
    acc = dspark_acceptance(n_draft);
}

bool dspark_seq_state::emit(dspark_token t, bool from_draft, const std::vector<dspark_token> & eog) {
    new_tokens.push_back(t);
    new_from_draft.push_back(from_draft);
    stats.n_generated++;
    tail.push_back(t);
    if (tail.size() > 64) {
        tail.erase(tail.begin());
    }
    if (std::find(eog.begin(), eog.end(), t) != eog.end()) {
        status = DSPARK_SEQ_EOG;
        return true;
    }
    for (const auto & stop : stops) {
        if (tail.size() >= stop.size() && std::equal(stop.begin(), stop.end(), tail.end() - stop.size())) {
            status = DSPARK_SEQ_STOP;
            return true;
        }
    }
    if (max_tokens > 0 && stats.n_generated >= max_tokens) {
        status = DSPARK_SEQ_MAX_TOKENS;
        return true;
    }
    return false;
}

void dspark_stats_count_block(dspark_spec_stats & st, int k, int accepted) {
    st.n_steps++;
    st.n_drafted += k;
    st.n_accepted += accepted;
    for (int j = 0; j < k && j < DSPARK_STATS_MAX_POS; ++j) {
        st.drafted_at[j]++;
        st.accepted_at[j] += j < accepted;
    }
}
