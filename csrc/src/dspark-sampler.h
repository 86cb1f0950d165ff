// Token sampling: one chain, defined once (dspark-sampler.cpp, sampler_chain) and run either on the
// host, one row of logits at a time, or as ggml ops inside a graph, a batch of rows at a time with
// every row's parameters as graph inputs (one graph serves any mix of samplers). Per row:
//
//   x = logits + adjustment          the row's additive adjustment, when given (logit bias,
//                                    penalties, a grammar's bans as -inf; computed on the host)
//   temperature <= 0 : argmax(x)
//   otherwise        : candidates = x sorted (descending) when the row filters (top_k, top_p or
//                      min_p on; only the top_k best when top_k is on), else x in vocabulary order;
//                      the filters set one threshold t, the largest of
//                        top_k: the k-th best value,
//                        top_p: the value of the last candidate whose mass before it (softmax at
//                               temperature 1 of what top_k keeps) is < top_p,
//                        min_p: the value of the last candidate with p > min_p · p_max (same softmax);
//                      candidates below t drop to -1e30 (ties with the last kept one stay);
//                      p = softmax(candidates / temperature), cumulative sum c, and the token is the
//                      first candidate whose c reaches u · c_last for the row's uniform u in (0, 1].
//
// u · c_last, not u: rounding never moves the draw past the last candidate of nonzero probability
// (a u > 1 lands on the last candidate the filters keep). Uniform draws come from a per-sequence
// mt19937 as doubles cast to float; a speculative step draws them from a copy of the committed
// generator and commits one draw per emitted token, so rows that get rejected do not shift the
// stream.
//
// Host and graph run the same definition; they differ only by float rounding (their softmax
// kernels), so a draw can differ only when u falls within rounding of a cumulative sum.
#pragma once

#include "dspark.h"

#include "ggml-backend.h"
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
int32_t dspark_argmax(const float * logits, int n_vocab);

// ---- on the host ---------------------------------------------------------------------------------

// The chain's distribution of one row (greedy: the argmax with probability 1); `adjust` [n_vocab]
// is added to the logits first (may be null).
void    dspark_sampler_distribution(const float * logits, int n_vocab, const dspark_sampler_params & p, dspark_distribution & out,
                                    const float * adjust = nullptr);
// The chain's token for one row at the uniform u (and in *prob its probability; 1 for greedy).
int32_t dspark_sample_host(const float * logits, int n_vocab, const dspark_sampler_params & p, float u,
                           const float * adjust = nullptr, float * prob = nullptr);

// ---- in a graph -----------------------------------------------------------------------------------

// What one in-graph sampler is built for: its structure follows the mix of its rows' samplers
// (which stages any row needs), never their values, which are inputs. A row whose sampler does
// not use a stage passes through it unchanged, bit for bit.
struct dspark_sampler_shape {
    bool    sample = false;  // some row samples; false: every row takes the argmax
    bool    greedy = false;  // greedy rows next to sampled ones (their argmax taken in)
    int32_t window = 0;      // 0: no row filters, candidates in vocabulary order; else each row's best
                             // `window` sorted (n_vocab when some row filters with top_p / min_p only)
    bool    mixed  = false;  // rows that do not filter next to rows that do: theirs stay in vocabulary order
    bool    probs  = false;  // some row filters with top_p or min_p (the softmax at temperature 1)
    bool    adjust = false;  // an additive adjustment per row (input [n_vocab, r])
    bool    probe  = false;  // the probability of a given token per row (rejection sampling)

    bool operator==(const dspark_sampler_shape & o) const {
        return sample == o.sample && greedy == o.greedy && window == o.window && mixed == o.mixed && probs == o.probs &&
               adjust == o.adjust && probe == o.probe;
    }
    bool operator!=(const dspark_sampler_shape & o) const { return !(*this == o); }
};

// The per-row inputs of the in-graph sampler, one column per row (F32 [DSPARK_SAMPLER_N_INPUTS, r]).
enum dspark_sampler_input {
    DSPARK_SAMPLER_GREEDY,    // 1: argmax
    DSPARK_SAMPLER_INV_TEMP,  // 1 / temperature (1 for greedy rows)
    DSPARK_SAMPLER_TOP_K,     // k; off: the window (keeps every candidate)
    DSPARK_SAMPLER_TOP_P,     // off: 2 (every mass before a candidate is below it)
    DSPARK_SAMPLER_MIN_P,     // off: -1 (every probability is above it)
    DSPARK_SAMPLER_SORTED,    // 1: candidates sorted, 0: vocabulary order (mixed shapes)
    DSPARK_SAMPLER_U,         // the row's uniform
    DSPARK_SAMPLER_PROBE,     // the probed token id, as a number
    DSPARK_SAMPLER_N_INPUTS,
};

// The rows of one in-graph sampler: each row's sampler, uniform, probe token and (for all rows or
// none) adjustment; from them the shape of the graph and the values of its inputs.
struct dspark_sampler_rows {
    std::vector<dspark_sampler_params> params;
    std::vector<float>                 u;
    std::vector<float>                 probe;   // token ids as numbers
    bool                               probing = false;
    std::vector<float>                 adjust;  // [size()][n_vocab] each row's adjustment; empty: none

    void add(const dspark_sampler_params & p, float ui, float probe_id = 0.0f) {
        params.push_back(p);
        u.push_back(ui);
        probe.push_back(probe_id);
    }
    size_t size() const { return params.size(); }
    dspark_sampler_shape shape(int n_vocab) const;
    // [size()][DSPARK_SAMPLER_N_INPUTS] input values for a sampler of this shape
    void inputs(const dspark_sampler_shape & shape, int n_vocab, std::vector<float> & out) const;
};

// One row's input values (a column of the inputs) for a sampler of this shape over n_vocab tokens.
void dspark_sampler_row_inputs(const dspark_sampler_params & p, const dspark_sampler_shape & shape, int n_vocab, float u,
                               float probe, float * out);

// What the in-graph sampler adds to a graph.
struct dspark_sampler_graph {
    ggml_tensor * inputs = nullptr;  // F32 [DSPARK_SAMPLER_N_INPUTS, r]
    ggml_tensor * adjust = nullptr;  // F32 [V, r] with shape.adjust
    ggml_tensor * tokens = nullptr;  // I32 [r] the picked tokens
    ggml_tensor * prob   = nullptr;  // F32 [1, r] each sampled row's pick's probability (sampled shapes)
    ggml_tensor * probed = nullptr;  // F32 [1, r] the probe token's probability (shape.probe)
    ggml_tensor * logits = nullptr;  // F32 [V, r] with filtered_logits: the logits after the adjustment
                                     // and the filters (dropped: -1e30), in vocabulary order
};

// The chain on the columns of logits [V, r]. `inputs` [DSPARK_SAMPLER_N_INPUTS, r] (null: a new
// graph input) lets a caller pass a view of a larger input.
dspark_sampler_graph dspark_build_sampler(ggml_context * ctx, ggml_tensor * logits, const dspark_sampler_shape & shape,
                                          ggml_tensor * inputs = nullptr, bool filtered_logits = false);

// Fill the inputs of a built sampler (adjust: [r][V] when the shape has one).
void dspark_set_sampler_inputs(const dspark_sampler_graph & g, const dspark_sampler_rows & rows, const dspark_sampler_shape & shape,
                               int n_vocab, const float * adjust = nullptr);

// The in-graph sampler run on given rows [n_rows][n_vocab] (one sampler per row, `adjust` [n_rows][n_vocab]
// or null), on a device (null: the CPU): what dspark_sample_rows_each offers to test it against the
// host chain. `prob` (may be null) gets each row's pick's probability.
void dspark_sample_rows_in_graph(ggml_backend_dev_t dev, const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                 const dspark_sampler_params * sp, const float * adjust, dspark_token * out, float * prob);

// Graph tensors one in-graph sampler adds at most (every stage on): what a graph's node budget
// must reserve for it.
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
