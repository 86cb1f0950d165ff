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

// ---- the chain ----------------------------------------------------------------------------------
//
// Written once against an evaluator E that either computes on the host, one row at a time (E::row
// a vector of floats, E::num a float), or builds ggml ops for a batch of rows (both a tensor: [n, r]
// per candidate, [1, r] per row, every parameter an input). Each step below is the same arithmetic
// in both: comparisons are `(a - b) > 0` (ggml_step), a selection between integer-valued numbers
// is `a - relu(a - b)`, a dropped candidate is the value plus -1e30. A new filter is a new term
// here (and its input in dspark_sampler_row_inputs); the host and the graph both get it.

// The value of the last candidate the filters keep, from the row's candidates sorted descending:
// each filter keeps a prefix, the threshold is the value at the end of the shortest one.
template <class E>
static typename E::num sampler_threshold(E & e, const typename E::row & sorted) {
    typename E::num last = e.add(e.in(DSPARK_SAMPLER_TOP_K), -1.0f);  // top-k: the k-th best
    if (e.uses_probs()) {
        // top-p and min-p on the softmax at temperature 1 of what top-k keeps
        const typename E::row p1 = e.softmax(e.drop_below(sorted, e.at(sorted, last), nullptr), e.one());
        const typename E::row before = e.sub(e.cumsum(p1), p1);  // the mass before each candidate
        last = e.min(last, e.add(e.count_below(before, e.in(DSPARK_SAMPLER_TOP_P)), -1.0f));
        last = e.min(last, e.add(e.count_above(p1, e.mul(e.in(DSPARK_SAMPLER_MIN_P), e.first(p1))), -1.0f));
    }
    return e.at(sorted, last);
}

template <class E>
static void sampler_chain(E & e) {
    const typename E::row x = e.logits();  // plus the row's adjustment
    if (!e.samples()) {
        e.finish_greedy(x);
        return;
    }
    typename E::cands c = e.candidates(x);  // sorted (the rows that filter) or in vocabulary order
    typename E::num n_dropped{};
    if (e.filters()) {
        const typename E::num thr = sampler_threshold(e, c.sorted);
        c.vals = e.drop_below(c.vals, thr, &n_dropped);
        e.filtered(x, thr);
    }
    const typename E::row p = e.softmax(c.vals, e.in(DSPARK_SAMPLER_INV_TEMP));
    const typename E::row cum = e.cumsum(p);
    // the first candidate whose cumulative probability reaches u times the total; a u > 1 takes
    // the last candidate the filters keep (not the window's last: it must not depend on the window)
    typename E::num idx = e.count_below(cum, e.mul(e.in(DSPARK_SAMPLER_U), e.last(cum)));
    if (e.filters()) {
        idx = e.min(idx, e.last_index_but(p, n_dropped));
    }
    e.finish(x, c, p, idx);
}

// ---- per-row inputs and shapes ------------------------------------------------------------------

void dspark_sampler_row_inputs(const dspark_sampler_params & p, const dspark_sampler_shape & shape, int n_vocab, float u,
                               float probe, float * out) {
    const int n = shape.window > 0 ? shape.window : n_vocab;  // candidates per row
    const bool greedy = p.greedy();
    out[DSPARK_SAMPLER_GREEDY]   = greedy ? 1.0f : 0.0f;
    out[DSPARK_SAMPLER_INV_TEMP] = greedy ? 1.0f : 1.0f / p.temperature;
    out[DSPARK_SAMPLER_TOP_K]    = (float) (!greedy && p.top_k > 0 && p.top_k < n ? p.top_k : n);
    out[DSPARK_SAMPLER_TOP_P]    = !greedy && p.top_p < 1.0f ? p.top_p : 2.0f;
    out[DSPARK_SAMPLER_MIN_P]    = !greedy && p.min_p > 0.0f ? p.min_p : -1.0f;
    out[DSPARK_SAMPLER_SORTED]   = !greedy && p.sorts(n_vocab) ? 1.0f : 0.0f;
    out[DSPARK_SAMPLER_U]        = u;
    out[DSPARK_SAMPLER_PROBE]    = probe;
}

dspark_sampler_shape dspark_sampler_rows::shape(int n_vocab) const {
    dspark_sampler_shape s;
    s.probe = probing;
    s.adjust = !adjust.empty();
    int k_max = 0;
    bool all_top_k = true;
    for (const dspark_sampler_params & p : params) {
        if (p.greedy()) {
            s.greedy = true;
            continue;
        }
        s.sample = true;
        s.probs = s.probs || p.top_p < 1.0f || p.min_p > 0.0f;
        if (!p.sorts(n_vocab)) {
            s.mixed = true;
            all_top_k = false;
            continue;
        }
        s.window = n_vocab;
        if (p.top_k > 0 && p.top_k < n_vocab) {
            k_max = std::max(k_max, p.top_k);
        } else {
            all_top_k = false;
        }
    }
    s.greedy = s.greedy && s.sample;
    s.mixed = s.mixed && s.window > 0;
    if (s.window > 0 && all_top_k) {
        // every sampled row has top-k: sort only the best k_max, rounded up to a power of two so
        // that batches with other k reuse the graph
        int w = 16;
        while (w < k_max) {
            w *= 2;
        }
        s.window = std::min(w, n_vocab);
    }
    return s;
}

void dspark_sampler_rows::inputs(const dspark_sampler_shape & s, int n_vocab, std::vector<float> & out) const {
    out.resize(size() * DSPARK_SAMPLER_N_INPUTS);
    for (size_t i = 0; i < size(); ++i) {
        dspark_sampler_row_inputs(params[i], s, n_vocab, u[i], probe[i], out.data() + i * DSPARK_SAMPLER_N_INPUTS);
    }
}

// ---- on the host ----------------------------------------------------------------------------------

namespace {

// ggml's clamp (NaN goes to hi), then an index.
int clamped(float x, int n) {
    float c = x < (float) (n - 1) ? x : (float) (n - 1);
    c = c > 0.0f ? c : 0.0f;
    return (int) c;
}

struct host_eval {
    using row = std::vector<float>;
    using num = float;
    struct cands {
        row sorted, vals;
        std::vector<int32_t> ids;  // empty: vocabulary order
    };

    const float *         x_;
    int                   V;
    const float *         adjust;
    dspark_sampler_params p;
    float                 inputs[DSPARK_SAMPLER_N_INPUTS];
    // results
    int32_t               token = 0;
    float                 prob  = 1.0f;
    dspark_distribution * dist  = nullptr;

    host_eval(const float * logits, int n_vocab, const dspark_sampler_params & sp, float u, const float * adj, dspark_distribution * d)
        : x_(logits), V(n_vocab), adjust(adj), p(sp), dist(d) {
        dspark_sampler_shape s;  // this row's own: its top-k alone is sorted
        s.sample = !p.greedy();
        s.window = s.sample && p.sorts(V) ? (p.top_k > 0 && p.top_k < V ? p.top_k : V) : 0;
        dspark_sampler_row_inputs(p, s, V, u, 0.0f, inputs);
    }

    num  in(int i) const { return inputs[i]; }
    num  one() const { return 1.0f; }
    bool samples() const { return !p.greedy(); }
    bool filters() const { return p.sorts(V); }
    bool uses_probs() const { return p.top_p < 1.0f || p.min_p > 0.0f; }

    row logits() const {
        row x(x_, x_ + V);
        if (adjust) {
            for (int i = 0; i < V; ++i) {
                x[i] += adjust[i];
            }
        }
        return x;
    }

    cands candidates(const row & x) const {
        cands c;
        if (!filters()) {
            c.vals = x;
            return c;
        }
        const int n = (int) in(DSPARK_SAMPLER_TOP_K);  // the window: top_k, or every token
        c.ids.resize(V);
        std::iota(c.ids.begin(), c.ids.end(), 0);
        auto by_value = [&x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
        if (n < V) {
            std::partial_sort(c.ids.begin(), c.ids.begin() + n, c.ids.end(), by_value);
            c.ids.resize(n);
        } else {
            std::sort(c.ids.begin(), c.ids.end(), by_value);
        }
        c.sorted.resize(n);
        for (int i = 0; i < n; ++i) {
            c.sorted[i] = x[c.ids[i]];
        }
        c.vals = c.sorted;
        return c;
    }

    num at(const row & v, num i) const { return v[clamped(i, (int) v.size())]; }
    num first(const row & v) const { return v.front(); }
    num last(const row & v) const { return v.back(); }
    num add(num a, float b) const { return a + b; }
    num mul(num a, num b) const { return a * b; }
    num min(num a, num b) const {  // of two integer-valued numbers, as the graph takes it
        const float d = a - b;
        return a - (d > 0.0f ? d : 0.0f);
    }
    row sub(row a, const row & b) const {
        for (size_t i = 0; i < a.size(); ++i) {
            a[i] -= b[i];
        }
        return a;
    }
    row cumsum(row v) const {  // in float, in order, as ggml
        for (size_t i = 1; i < v.size(); ++i) {
            v[i] = v[i - 1] + v[i];
        }
        return v;
    }
    row softmax(row v, num scale) const {
        dspark_softmax(v, scale);
        return v;
    }
    num count_below(const row & v, num t) const {  // #{v < t}
        int n = 0;
        for (float x : v) {
            n += (t - x) > 0.0f ? 1 : 0;
        }
        return (float) n;
    }
    num count_above(const row & v, num t) const {  // #{v > t}
        int n = 0;
        for (float x : v) {
            n += (x - t) > 0.0f ? 1 : 0;
        }
        return (float) n;
    }
    row drop_below(row v, num t, num * n_dropped) const {
        int n = 0;
        for (float & x : v) {
            if ((t - x) > 0.0f) {
                x += -1e30f;
                n++;
            }
        }
        if (n_dropped) {
            *n_dropped = (float) n;
        }
        return v;
    }
    num last_index_but(const row & v, num n) const { return (float) (v.size() - 1) - n; }
    void filtered(const row &, num) const {}

    void finish_greedy(const row & x) {
        token = dspark_argmax(x.data(), V);
        if (dist) {
            dist->ids.assign(1, token);
            dist->probs.assign(1, 1.0f);
        }
    }
    void finish(const row &, cands & c, const row & probs, num idx) {
        const int i = clamped(idx, (int) probs.size());
        token = c.ids.empty() ? i : c.ids[i];
        prob = probs[i];
        if (dist) {
            if (c.ids.empty()) {
                c.ids.resize(probs.size());
                std::iota(c.ids.begin(), c.ids.end(), 0);
            }
            dist->ids = std::move(c.ids);
            dist->probs = probs;
        }
    }
};

}  // namespace

void dspark_sampler_distribution(const float * logits, int n_vocab, const dspark_sampler_params & p, dspark_distribution & out,
                                 const float * adjust) {
    host_eval e(logits, n_vocab, p, 0.5f, adjust, &out);
    sampler_chain(e);
}

int32_t dspark_sample_host(const float * logits, int n_vocab, const dspark_sampler_params & p, float u, const float * adjust,
                           float * prob) {
    if (p.greedy() && !adjust) {
        if (prob) {
            *prob = 1.0f;
        }
        return dspark_argmax(logits, n_vocab);
    }
    host_eval e(logits, n_vocab, p, u, adjust, nullptr);
    sampler_chain(e);
    if (prob) {
        *prob = e.prob;
    }
    return e.token;
}

// ---- in a graph -----------------------------------------------------------------------------------

namespace {

struct graph_eval {
    using row = ggml_tensor *;
    using num = ggml_tensor *;
    struct cands {
        ggml_tensor * sorted = nullptr;  // [n, r] the window sorted (filtering shapes)
        ggml_tensor * vals   = nullptr;  // [n, r] what the draw runs over
        ggml_tensor * ids    = nullptr;  // I32 [n, r] their token ids; null: vocabulary order
    };

    ggml_context *               ctx;
    ggml_tensor *                logits_;
    const dspark_sampler_shape & shape;
    dspark_sampler_graph &       out;
    bool                         want_filtered;
    ggml_tensor *                rows_[DSPARK_SAMPLER_N_INPUTS] = {};
    ggml_tensor *                best = nullptr;  // F32 [1, r] each row's argmax, as a number

    int64_t V() const { return logits_->ne[0]; }
    int64_t R() const { return logits_->ne[1]; }

    num in(int i) {
        if (!rows_[i]) {
            ggml_tensor * v = ggml_view_2d(ctx, out.inputs, 1, R(), out.inputs->nb[1], i * ggml_element_size(out.inputs));
            rows_[i] = ggml_cont(ctx, v);  // [1, r]
        }
        return rows_[i];
    }
    num  one() const { return nullptr; }
    bool samples() const { return shape.sample; }
    bool filters() const { return shape.window > 0; }
    bool uses_probs() const { return shape.probs; }

    // token ids I32 [m, c] as numbers F32 [m, c] (a gather from 0, 1, ...)
    ggml_tensor * numbers(ggml_tensor * ids) {
        ggml_tensor * number = ggml_reshape_2d(ctx, ggml_arange(ctx, 0.0f, (float) V(), 1.0f), 1, V());
        ggml_tensor * f = ggml_get_rows(ctx, number, ggml_reshape_1d(ctx, ggml_cont(ctx, ids), ggml_nelements(ids)));
        return ggml_reshape_2d(ctx, f, ids->ne[0], ids->ne[1]);
    }

    row logits() {
        return out.adjust ? ggml_add(ctx, logits_, out.adjust) : logits_;
    }

    cands candidates(row x) {
        cands c;
        if (!filters()) {
            c.vals = x;
            return c;
        }
        ggml_tensor * vals = x;
        ggml_tensor * top = nullptr;  // the window's token ids, unordered
        if (shape.window < V()) {
            top = ggml_top_k(ctx, x, shape.window);
            vals = dspark_gather_cols(ctx, x, top);
        }
        ggml_tensor * order = ggml_argsort(ctx, vals, GGML_SORT_ORDER_DESC);
        c.sorted = dspark_gather_cols(ctx, vals, order);
        c.ids = top ? dspark_gather_cols(ctx, top, order) : order;
        c.vals = c.sorted;
        if (shape.mixed) {
            // rows that do not filter keep vocabulary order: ids = iota + sorted · (ids - iota)
            ggml_tensor * iota = ggml_reshape_2d(ctx, ggml_arange(ctx, 0.0f, (float) V(), 1.0f), V(), 1);
            ggml_tensor * ids = ggml_add(ctx, ggml_mul(ctx, ggml_sub(ctx, numbers(c.ids), iota), in(DSPARK_SAMPLER_SORTED)), iota);
            c.ids = ggml_cast(ctx, ids, GGML_TYPE_I32);
            c.vals = dspark_gather_cols(ctx, x, c.ids);
        }
        return c;
    }

    num at(row v, num i) {
        ggml_tensor * idx = ggml_cast(ctx, ggml_clamp(ctx, i, 0.0f, (float) (v->ne[0] - 1)), GGML_TYPE_I32);
        return dspark_gather_cols(ctx, v, idx);
    }
    num first(row v) { return ggml_cont(ctx, ggml_view_2d(ctx, v, 1, v->ne[1], v->nb[1], 0)); }
    num last(row v) { return ggml_cont(ctx, ggml_view_2d(ctx, v, 1, v->ne[1], v->nb[1], (v->ne[0] - 1) * ggml_element_size(v))); }
    num add(num a, float b) { return ggml_scale_bias(ctx, a, 1.0f, b); }
    num mul(num a, num b) { return ggml_mul(ctx, a, b); }
    num min(num a, num b) { return ggml_sub(ctx, a, ggml_relu(ctx, ggml_sub(ctx, a, b))); }
    row sub(row a, row b) { return ggml_sub(ctx, a, b); }
    row cumsum(row v) { return ggml_cumsum(ctx, v); }
    row softmax(row v, num scale) { return ggml_soft_max(ctx, scale ? ggml_mul(ctx, v, scale) : v); }
    // t - v as -(v - t) (the same float): ggml_sub broadcasts only its second operand
    row below(row v, num t) { return ggml_step(ctx, ggml_neg(ctx, ggml_sub(ctx, v, t))); }  // 1 where v < t
    num count_below(row v, num t) { return ggml_sum_rows(ctx, below(v, t)); }
    num count_above(row v, num t) { return ggml_sum_rows(ctx, ggml_step(ctx, ggml_sub(ctx, v, t))); }
    row drop_below(row v, num t, num * n_dropped) {
        ggml_tensor * drop = below(v, t);
        if (n_dropped) {
            *n_dropped = ggml_sum_rows(ctx, drop);
        }
        return ggml_add(ctx, v, ggml_scale(ctx, drop, -1e30f));
    }
    num last_index_but(row v, num n) { return ggml_scale_bias(ctx, n, -1.0f, (float) (v->ne[0] - 1)); }
    void filtered(row x, num thr) {
        if (want_filtered) {
            out.logits = drop_below(x, thr, nullptr);
        }
    }

    num argmax_number(row x) {
        if (!best) {
            ggml_tensor * number = ggml_reshape_2d(ctx, ggml_arange(ctx, 0.0f, (float) V(), 1.0f), 1, V());
            best = ggml_reshape_2d(ctx, ggml_get_rows(ctx, number, ggml_argmax(ctx, x)), 1, R());
        }
        return best;
    }
    // a · (1 - g) + b · g per row, g the greedy flag: exactly a or b
    num by_greedy(num a, num b) {
        ggml_tensor * g = in(DSPARK_SAMPLER_GREEDY);
        return ggml_add(ctx, ggml_mul(ctx, a, ggml_scale_bias(ctx, g, -1.0f, 1.0f)), ggml_mul(ctx, b, g));
    }
    num is_not(num a, num b) { return ggml_step(ctx, ggml_abs(ctx, ggml_sub(ctx, a, b))); }  // 1 where a != b

    void finish_greedy(row x) {
        out.tokens = ggml_argmax(ctx, x);  // [r]
        if (shape.probe) {  // probability 1 for the argmax, 0 for anything else
            out.probed = ggml_scale_bias(ctx, is_not(argmax_number(x), in(DSPARK_SAMPLER_PROBE)), -1.0f, 1.0f);
        }
        if (want_filtered) {
            out.logits = x;
        }
    }

    void finish(row x, const cands & c, row probs, num idx) {
        const int64_t n = probs->ne[0];
        ggml_tensor * i = ggml_cast(ctx, ggml_clamp(ctx, idx, 0.0f, (float) (n - 1)), GGML_TYPE_I32);  // [1, r]
        ggml_tensor * prob = dspark_gather_cols(ctx, probs, i);
        ggml_tensor * tok = c.ids ? dspark_gather_cols(ctx, c.ids, i) : i;  // I32 [1, r]
        if (shape.greedy) {
            tok = ggml_cast(ctx, by_greedy(numbers(tok), argmax_number(x)), GGML_TYPE_I32);
            prob = by_greedy(prob, ggml_scale_bias(ctx, in(DSPARK_SAMPLER_GREEDY), 0.0f, 1.0f));
        }
        out.tokens = ggml_reshape_1d(ctx, tok, R());
        out.prob = prob;
        if (shape.probe) {
            ggml_tensor * probe = in(DSPARK_SAMPLER_PROBE);
            ggml_tensor * pp;
            if (c.ids) {  // the probability of the candidate that is the probe
                ggml_tensor * other = is_not(numbers(c.ids), probe);
                pp = ggml_sum_rows(ctx, ggml_sub(ctx, probs, ggml_mul(ctx, probs, other)));
            } else {
                pp = dspark_gather_cols(ctx, probs, ggml_cast(ctx, probe, GGML_TYPE_I32));
            }
            if (shape.greedy) {
                pp = by_greedy(pp, ggml_scale_bias(ctx, is_not(argmax_number(x), probe), -1.0f, 1.0f));
            }
            out.probed = pp;
        }
        if (want_filtered && !out.logits) {
            out.logits = x;
        }
    }
};

}  // namespace

dspark_sampler_graph dspark_build_sampler(ggml_context * ctx, ggml_tensor * logits, const dspark_sampler_shape & shape,
                                          ggml_tensor * inputs, bool filtered_logits) {
    dspark_sampler_graph out;
    const int64_t V = logits->ne[0], r = logits->ne[1];
    out.inputs = inputs ? inputs : dspark_graph_input(ctx, GGML_TYPE_F32, DSPARK_SAMPLER_N_INPUTS, r, "inp_sampler");
    if (shape.adjust) {
        out.adjust = dspark_graph_input(ctx, GGML_TYPE_F32, V, r, "inp_sampler_adjust");
    }
    graph_eval e{ctx, logits, shape, out, filtered_logits};
    sampler_chain(e);
    return out;
}

void dspark_set_sampler_inputs(const dspark_sampler_graph & g, const dspark_sampler_rows & rows, const dspark_sampler_shape & shape,
                               int n_vocab, const float * adjust) {
    std::vector<float> in;
    rows.inputs(shape, n_vocab, in);
    dspark_set_input(g.inputs, in.data(), in.size() * sizeof(float));
    if (g.adjust) {
        dspark_set_input(g.adjust, adjust, sizeof(float) * rows.size() * (size_t) n_vocab);
    }
}

void dspark_sample_rows_in_graph(ggml_backend_dev_t dev, const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                 const dspark_sampler_params * sp, const float * adjust, dspark_token * out, float * prob) {
    dspark_sampler_rows rows;
    for (int32_t i = 0; i < n_rows; ++i) {
        rows.add(sp[i], u[i]);
    }
    dspark_sampler_shape shape = rows.shape(n_vocab);
    shape.adjust = adjust != nullptr;
    dspark_compute c;
    c.init(dev ? dev : dspark_device_cpu(), 1, 64 + dspark_sampler_graph_size());
    ggml_context * ctx = c.begin();
    ggml_cgraph * gf = c.new_graph(ctx);
    ggml_tensor * x = dspark_graph_input(ctx, GGML_TYPE_F32, n_vocab, n_rows, "logits");
    dspark_sampler_graph g = dspark_build_sampler(ctx, x, shape);
    ggml_set_output(g.tokens);
    ggml_build_forward_expand(gf, g.tokens);
    if (g.prob) {
        ggml_set_output(g.prob);
        ggml_build_forward_expand(gf, g.prob);
    }
    c.alloc(gf);
    dspark_set_input(x, logits, sizeof(float) * (size_t) n_rows * n_vocab);
    dspark_set_sampler_inputs(g, rows, shape, n_vocab, adjust);
    c.compute(gf);
    ggml_backend_tensor_get(g.tokens, out, 0, sizeof(int32_t) * n_rows);
    if (prob) {
        if (g.prob) {
            ggml_backend_tensor_get(g.prob, prob, 0, sizeof(float) * n_rows);
        } else {
            std::fill(prob, prob + n_rows, 1.0f);  // every row greedy
        }
    }
}

size_t dspark_sampler_graph_size() {
    static const size_t n = [] {
        // counted on real builds of the chain with every stage on, so it follows any change to it
        const size_t slots = 512;
        size_t most = 0;
        for (int window : {8, 4}) {  // every token sorted (with rows in vocabulary order), or a top-k window
            ggml_init_params ip = { /*.mem_size =*/ slots * ggml_tensor_overhead(), nullptr, /*.no_alloc =*/ true };
            ggml_context * ctx = ggml_init(ip);
            ggml_tensor * logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2);
            dspark_sampler_shape s;
            s.sample = s.greedy = s.probs = s.adjust = s.probe = true;
            s.window = window;
            s.mixed = window == 8;
            dspark_build_sampler(ctx, ggml_view_2d(ctx, logits, 8, 2, logits->nb[1], 0), s, nullptr, true);
            size_t count = 0;
            for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
                count++;
            }
            ggml_free(ctx);
            most = std::max(most, count - 1);  // the logits exist once per graph, not per sampler
        }
        return most;
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
