// Token sampling, the same chain on the host and inside a ggml graph:
//
//   temperature <= 0 : argmax
//   otherwise        : candidates = top_k by logit (sorted), or all tokens sorted when top_p / min_p
//                      filter, else all tokens in vocabulary order;
//                      top_p keeps a candidate while the probability mass before it is < top_p,
//                      min_p keeps it while p > min_p · p_max (both on softmax at temperature 1);
//                      then softmax(logits / temperature) over the kept candidates, cumulative sum c,
//                      and the token is candidate n - clamp(#{c > u}, 1, n) for a uniform draw u.
//
// The clamp makes a draw above the final cumulative sum (rounding) pick the last candidate.
// Uniform draws come from a per-sequence mt19937 as doubles cast to float; a speculative step draws
// them from a copy of the committed generator and commits one draw per emitted token, so rows
// that get rejected do not shift the stream.
#pragma once

#include "dspark.h"

#include "ggml.h"

#include <cstdint>
#include <random>
#include <vector>

struct dspark_sampler_params {
    float   temperature = 0.0f;
    int32_t top_k       = 0;
    float   top_p       = 1.0f;
    float   min_p       = 0.0f;

    bool greedy() const { return !(temperature > 0.0f); }
    bool sorts(int n_vocab) const { return (top_k > 0 && top_k < n_vocab) || top_p < 1.0f || min_p > 0.0f; }
};

// The sampling distribution of one row: candidate ids and their probabilities (sum 1).
struct dspark_distribution {
    std::vector<int32_t> ids;
    std::vector<float>   probs;
};

// The public sampling parameters as the sampler's, each bad value refused by name (throws
// INVALID_ARGUMENT): the one place these rules live (the C API, the engine and Python ask it).
dspark_sampler_params dspark_sampler_from(const dspark_sampling_params & p);

// softmax(x · scale) in place, in float like ggml (-inf entries get probability 0)
void    dspark_softmax(std::vector<float> & x, float scale);
void    dspark_sampler_distribution(const float * logits, int n_vocab, const dspark_sampler_params & p, dspark_distribution & out);
int32_t dspark_sample_host(const float * logits, int n_vocab, const dspark_sampler_params & p, float u);
int32_t dspark_argmax(const float * logits, int n_vocab);

// In-graph: sample each column of logits [V, r] with the uniforms u [1, r]; returns I32 [r]. With
// `probe` (token ids as numbers, F32 [1, r]) also the chain's probability of each column's probe
// token, F32 [1, r], in *probe_prob (0 for a token the filters drop; 1/0 for greedy chains).
ggml_tensor * dspark_build_sampler(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * u, const dspark_sampler_params & p,
                                   ggml_tensor * probe = nullptr, ggml_tensor ** probe_prob = nullptr);

// The in-graph sampler run on given rows [n_rows][n_vocab] with uniforms u, on the CPU backend
// (what dspark_sample_rows(in_graph) offers for testing it against the host sampler).
void dspark_sample_rows_in_graph(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                 const dspark_sampler_params & sp, dspark_token * out);

// Graph tensors one in-graph sampler (the worst case: top-k, top-p and min-p all on) adds, with the
// two views that select its rows: what a graph's node budget must reserve per sampled sequence.
size_t dspark_sampler_graph_size();

// A seed for stream `stream` of a seeded family (splitmix64 of both): distinct, well-spread seeds
// for different streams of one seed.
uint64_t dspark_mix_seed(uint64_t seed, uint64_t stream);

// A sequence's random stream (committed state + a scratch copy for one speculative step).
struct dspark_rng {
    std::mt19937 committed;
    explicit dspark_rng(uint32_t seed = 0) : committed(seed) {}
    // the next n draws from the committed state, without advancing it
    std::vector<float> peek(int n) const;
    void               advance(int n);
    float              next();  // draw and commit one
};
