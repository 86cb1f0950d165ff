// Logprobs of committed tokens: each token's log probability in the distribution it was drawn
// from, and the most probable tokens of that distribution (OpenAI's logprobs / top_logprobs).
//
// The distribution is the sampler chain's over the row's adjusted logits (dspark-adjust.h): for a
// sampled request the filtered, tempered one; for a greedy request (whose "distribution" is a point
// mass) the softmax at temperature 1 of the adjusted logits. Verify rows equal decode rows bit for
// bit, so the values do not depend on the draft.
#pragma once

#include "dspark.h"
#include "dspark-sampler.h"

#include <vector>

// The logprob entries of a run of tokens: logprob[n], and top ids / logprobs [n][top].
struct dspark_logprobs {
    int32_t                   top = 0;
    std::vector<float>        logprob;
    std::vector<dspark_token> top_ids;
    std::vector<float>        top_logprobs;

    size_t size() const { return logprob.size(); }
    void   clear() {
        logprob.clear();
        top_ids.clear();
        top_logprobs.clear();
    }
    // Append the entry of `token` drawn from row `logits` [n_vocab] (+ `adjust`, may be null)
    // under sampler `sp`.
    void add(const float * logits, const float * adjust, int n_vocab, const dspark_sampler_params & sp, dspark_token token);
    // Append the entry of `token` under the plain softmax of `logits` (prompt logprobs).
    void add_raw(const float * logits, int n_vocab, dspark_token token);

  private:
    void add_distribution(const dspark_distribution & d, int n_vocab, bool dense, dspark_token token);
};
