#include "dspark-sampler.h"

#include "dspark-impl.h"

#include "dspark-graph.h"
#include "dspark-backend.h"
#include "dspark-compute.h"

#include <algorithm>
#include <cmath>
#include <numeric>

int32_t dspark_argmax(const float * logits, int n_vocab) {
    int32_t best = 0;
    for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

// Candidates in the order the graph uses: top-k or all tokens sorted by logit (descending), or
// vocabulary order when nothing filters.
static void candidates(const float * logits, int n_vocab, const dspark_sampler_params & p, std::vector<int32_t> & ids) {
    ids.resize(n_vocab);
    std::iota(ids.begin(), ids.end(), 0);
    if (!p.sorts(n_vocab)) {
        return;
    }
    auto by_logit = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    if (p.top_k > 0 && p.top_k < n_vocab) {
        std::partial_sort(ids.begin(), ids.begin() + p.top_k, ids.end(), by_logit);
        ids.resize(p.top_k);
    } else {
        std::sort(ids.begin(), ids.end(), by_logit);
    }
}

// Masked logits of the candidates: top_p and min_p turn dropped candidates into -1e30.
static void filtered_values(const float * logits, const std::vector<int32_t> & ids, const dspark_sampler_params & p,
                            bool sorted, std::vector<float> & vals) {
    vals.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        vals[i] = logits[ids[i]];
    }
    if (!sorted || (p.top_p >= 1.0f && p.min_p <= 0.0f)) {
        return;
    }
    std::vector<float> probs = vals;
    dspark_softmax(probs, 1.0f);
    float cum = 0.0f;
    for (size_t i = 0; i < vals.size(); ++i) {
        cum += probs[i];
        float keep = 1.0f;
        if (p.top_p < 1.0f && !(p.top_p - (cum - probs[i]) > 0.0f)) {  // mass before i must be < top_p
            keep = 0.0f;
        }
        if (p.min_p > 0.0f && !(probs[i] - p.min_p * probs[0] > 0.0f)) {
            keep = 0.0f;
        }
        vals[i] = vals[i] * keep + (keep - 1.0f) * 1e30f;
    }
}

void dspark_sampler_distribution(const float * logits, int n_vocab, const dspark_sampler_params & p, dspark_distribution & out) {
    out.ids.clear();
    out.probs.clear();
    if (p.greedy()) {
        out.ids.push_back(dspark_argmax(logits, n_vocab));
        out.probs.push_back(1.0f);
        return;
    }
    std::vector<int32_t> ids;
    std::vector<float> vals;
    candidates(logits, n_vocab, p, ids);
    filtered_values(logits, ids, p, p.sorts(n_vocab), vals);
    dspark_softmax(vals, 1.0f / p.temperature);
    out.ids = std::move(ids);
    out.probs = std::move(vals);
}

int32_t dspark_sample_host(const float * logits, int n_vocab, const dspark_sampler_params & p, float u) {
    if (p.greedy()) {
        return dspark_argmax(logits, n_vocab);
    }
    dspark_distribution d;
    dspark_sampler_distribution(logits, n_vocab, p, d);
    const int n = (int) d.ids.size();
    float cum = 0.0f;
    int above = 0;  // candidates whose cumulative probability exceeds u
    for (int i = 0; i < n; ++i) {
        cum += d.probs[i];
        above += cum - u > 0.0f ? 1 : 0;
    }
    above = std::min(std::max(above, 1), n);
    return d.ids[n - above];
}

// ---- in-graph ---------------------------------------------------------------------------------

// The chain's probability of token `probe` (numbers, [1, r]) in each column, from the candidates'
// probabilities probs [n, r] and their ids (I32 [n, r]; null: vocabulary order).
static ggml_tensor * probe_probability(ggml_context * ctx, ggml_tensor * probs, ggml_tensor * ids, ggml_tensor * probe,
                                       int64_t n_vocab) {
    const int64_t r = probs->ne[1];
    if (!ids) {
        return dspark_gather_cols(ctx, probs, ggml_cast(ctx, probe, GGML_TYPE_I32));
    }
    // candidate ids as numbers (a gather from 0, 1, ...), compared with the probe
    ggml_tensor * number = ggml_reshape_2d(ctx, ggml_arange(ctx, 0.0f, (float) n_vocab, 1.0f), 1, n_vocab);
    ggml_tensor * cand = ggml_get_rows(ctx, number, ggml_reshape_1d(ctx, ggml_cont(ctx, ids), ggml_nelements(ids)));
    cand = ggml_reshape_2d(ctx, cand, ids->ne[0], r);
    ggml_tensor * other = ggml_step(ctx, ggml_abs(ctx, ggml_sub(ctx, cand, probe)));  // 1 where not the probe
    return ggml_sum_rows(ctx, ggml_sub(ctx, probs, ggml_mul(ctx, probs, other)));
}

ggml_tensor * dspark_build_sampler(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * u, const dspark_sampler_params & p,
                                   ggml_tensor * probe, ggml_tensor ** probe_prob) {
    const int64_t V = logits->ne[0], r = logits->ne[1];
    if (p.greedy()) {
        ggml_tensor * best = ggml_argmax(ctx, logits);  // [r]
        if (probe) {  // probability 1 for the argmax, 0 for anything else
            ggml_tensor * number = ggml_reshape_2d(ctx, ggml_arange(ctx, 0.0f, (float) V, 1.0f), 1, V);
            ggml_tensor * diff = ggml_sub(ctx, ggml_get_rows(ctx, number, best), probe);
            *probe_prob = ggml_scale_bias(ctx, ggml_step(ctx, ggml_abs(ctx, diff)), -1.0f, 1.0f);
        }
        return best;
    }
    ggml_tensor * vals = logits;  // candidate logits [n, r]
    ggml_tensor * ids = nullptr;  // candidate token ids I32 [n, r]; null = vocabulary order
    if (p.sorts((int) V)) {
        if (p.top_k > 0 && p.top_k < V) {
            ids = ggml_top_k(ctx, logits, p.top_k);  // unordered
            vals = dspark_gather_cols(ctx, logits, ids);
        }
        ggml_tensor * order = ggml_argsort(ctx, vals, GGML_SORT_ORDER_DESC);
        vals = dspark_gather_cols(ctx, vals, order);
        ids = ids ? dspark_gather_cols(ctx, ids, order) : order;
        if (p.top_p < 1.0f || p.min_p > 0.0f) {
            ggml_tensor * probs = ggml_soft_max(ctx, vals);
            ggml_tensor * keep = nullptr;
            if (p.top_p < 1.0f) {
                ggml_tensor * before = ggml_sub(ctx, ggml_cumsum(ctx, probs), probs);  // mass before each candidate
                keep = ggml_step(ctx, ggml_scale_bias(ctx, before, -1.0f, p.top_p));
            }
            if (p.min_p > 0.0f) {
                ggml_tensor * pmax = ggml_cont(ctx, ggml_view_2d(ctx, probs, 1, r, probs->nb[1], 0));  // sorted: first is the max
                ggml_tensor * k2 = ggml_step(ctx, ggml_sub(ctx, probs, ggml_scale(ctx, pmax, p.min_p)));
                keep = keep ? ggml_mul(ctx, keep, k2) : k2;
            }
            // kept: the logit; dropped: -1e30
            vals = ggml_add(ctx, ggml_mul(ctx, vals, keep), ggml_scale_bias(ctx, keep, 1e30f, -1e30f));
        }
    }
    const int64_t n = vals->ne[0];
    ggml_tensor * probs = ggml_soft_max_ext(ctx, vals, nullptr, 1.0f / p.temperature, 0.0f);
    if (probe) {
        *probe_prob = probe_probability(ctx, probs, ids, probe, V);
    }
    ggml_tensor * above = ggml_sum_rows(ctx, ggml_step(ctx, ggml_sub(ctx, ggml_cumsum(ctx, probs), u)));  // [1, r]
    above = ggml_clamp(ctx, above, 1.0f, (float) n);
    ggml_tensor * idx = ggml_cast(ctx, ggml_scale_bias(ctx, above, -1.0f, (float) n), GGML_TYPE_I32);  // [1, r]
    if (!ids) {
        return ggml_reshape_1d(ctx, idx, r);
    }
    return ggml_reshape_1d(ctx, dspark_gather_cols(ctx, ids, idx), r);
}

void dspark_sample_rows_in_graph(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                 const dspark_sampler_params & sp, dspark_token * out) {
    dspark_compute c;
    c.init(dspark_device_cpu(), 1, 256);
    ggml_context * ctx = c.begin();
    ggml_cgraph * gf = c.new_graph(ctx);
    ggml_tensor * x = dspark_graph_input(ctx, GGML_TYPE_F32, n_vocab, n_rows, "logits");
    ggml_tensor * uu = dspark_graph_input(ctx, GGML_TYPE_F32, 1, n_rows, "u");
    ggml_tensor * ids = dspark_build_sampler(ctx, x, uu, sp);
    ggml_set_output(ids);
    ggml_build_forward_expand(gf, ids);
    c.alloc(gf);
    dspark_set_input(x, logits, sizeof(float) * (size_t) n_rows * n_vocab);
    dspark_set_input(uu, u, sizeof(float) * n_rows);
    c.compute(gf);
    ggml_backend_tensor_get(ids, out, 0, sizeof(int32_t) * n_rows);
}


size_t dspark_sampler_graph_size() {
    static const size_t n = [] {
        // counted on a real build of the chain, so it follows any change to it
        const size_t slots = 256;
        ggml_init_params ip = { /*.mem_size =*/ slots * ggml_tensor_overhead(), nullptr, /*.no_alloc =*/ true };
        ggml_context * ctx = ggml_init(ip);
        ggml_tensor * logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2);
        ggml_tensor * u = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, 2);
        ggml_tensor * probe = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, 2);
        ggml_tensor * probe_prob = nullptr;
        dspark_sampler_params p;
        p.temperature = 1.0f;
        p.top_k = 4;
        p.top_p = 0.9f;
        p.min_p = 0.1f;
        dspark_build_sampler(ctx, ggml_view_2d(ctx, logits, 8, 2, logits->nb[1], 0), ggml_view_2d(ctx, u, 1, 2, u->nb[1], 0), p,
                             ggml_view_2d(ctx, probe, 1, 2, probe->nb[1], 0), &probe_prob);
        size_t count = 0;
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
            count++;
        }
        ggml_free(ctx);
        return count - 3;  // the logits, uniforms and probes exist once per graph, not per sampler
    }();
    return n;
}

dspark_sampler_params dspark_sampler_from(const dspark_sampling_params & p) {
    // inf is refused like NaN (1/inf scales every logit to 0), and so is a negative temperature
    if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampling: temperature must be a finite number >= 0, got %g",
                     (double) p.temperature);
    }
    if (p.top_k < 0) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampling: top_k must be >= 0, got %d", p.top_k);
    }
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampling: top_p must be in (0, 1], got %g", (double) p.top_p);
    }
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampling: min_p must be in [0, 1], got %g", (double) p.min_p);
    }
    dspark_sampler_params s;
    s.temperature = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    return s;
}

// ---- random stream ------------------------------------------------------------------------------

uint64_t dspark_mix_seed(uint64_t seed, uint64_t stream) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float draw(std::mt19937 & g) {
    return (float) std::uniform_real_distribution<double>(0.0, 1.0)(g);
}

std::vector<float> dspark_rng::peek(int n) const {
    std::mt19937 g = committed;
    std::vector<float> out(n);
    for (float & x : out) {
        x = draw(g);
    }
    return out;
}

void dspark_rng::advance(int n) {
    for (int i = 0; i < n; ++i) {
        draw(committed);
    }
}

float dspark_rng::next() {
    return draw(committed);
}
