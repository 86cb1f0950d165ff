#include "dspark-logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

void dspark_logprobs::add(const float * logits, const float * adjust, int n_vocab, const dspark_sampler_params & sp,
                          dspark_token token) {
    dspark_sampler_params p = sp;
    if (p.greedy()) {  // a point mass tells nothing: report the model's softmax at temperature 1
        p = dspark_sampler_params();
        p.temperature = 1.0f;
    }
    dspark_distribution d;
    dspark_sampler_distribution(logits, n_vocab, p, d, adjust);
    add_distribution(d, n_vocab, !p.sorts(n_vocab), token);
}

void dspark_logprobs::add_raw(const float * logits, int n_vocab, dspark_token token) {
    dspark_sampler_params p;
    p.temperature = 1.0f;
    dspark_distribution d;
    dspark_sampler_distribution(logits, n_vocab, p, d);
    add_distribution(d, n_vocab, true, token);
}

// `dense`: d.probs is indexed by token id (no filter: every token a candidate, in vocabulary order).
void dspark_logprobs::add_distribution(const dspark_distribution & d, int n_vocab, bool dense, dspark_token token) {
    const float ninf = -std::numeric_limits<float>::infinity();
    float pt = 0.0f;
    if (dense) {
        pt = token >= 0 && token < n_vocab && (size_t) token < d.probs.size() ? d.probs[token] : 0.0f;
    } else {
        for (size_t c = 0; c < d.ids.size(); ++c) {
            if (d.ids[c] == token) {
                pt = d.probs[c];
                break;
            }
        }
    }
    logprob.push_back(pt > 0.0f ? std::log(pt) : ninf);
    if (top <= 0) {
        return;
    }
    // the top entries: descending probability, ties by id
    const size_t n = d.probs.size();
    std::vector<int32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    auto id_of = [&](int32_t c) { return dense ? c : d.ids[c]; };
    const size_t m = std::min(n, (size_t) top);
    std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), [&](int32_t a, int32_t b) {
        return d.probs[a] != d.probs[b] ? d.probs[a] > d.probs[b] : id_of(a) < id_of(b);
    });
    for (int j = 0; j < top; ++j) {  // fewer candidates than top (a filtered row): pad with -inf, id -1
        const bool have = (size_t) j < m && d.probs[idx[j]] > 0.0f;
        top_ids.push_back(have ? id_of(idx[j]) : -1);
        top_logprobs.push_back(have ? std::log(d.probs[idx[j]]) : ninf);
    }
}
