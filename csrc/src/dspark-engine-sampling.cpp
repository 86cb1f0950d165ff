// How a verify batch is sampled: in the target's graph (the sampler of dspark-sampler.h, with
// each row's adjustment as an input) or on the host after reading the logits back.
#include "dspark-engine.h"

// Sample this verify batch inside the target's graph? AUTO does where every sequence is greedy:
// the graph's argmax saves reading the logits back, while its filters and sorts for temperature
// sampling cost more than the host's (bench/bench_spec.py --sampling host backend).
bool dspark_engine::in_graph_sampling(const std::vector<plan> & plans, size_t begin, size_t end) const {
    for (size_t i = begin; i < end; ++i) {
        if (plans[i].s->needs_logits()) {
            return false;  // its adjustments and logprobs are the host's (any backend setting)
        }
    }
    if (params.backend_sampling != DSPARK_BACKEND_SAMPLING_AUTO) {
        return params.backend_sampling == DSPARK_BACKEND_SAMPLING_ON;
    }
    for (size_t i = begin; i < end; ++i) {
        if (!plans[i].s->sp.greedy()) {
            return false;
        }
    }
    return true;
}

// The in-graph sampler's adjustment input of a chunk: every row's, zero for sequences without one
// (only when some sequence of the chunk has one: the others' batches keep their graphs).
void dspark_engine::adjust_rows(const std::vector<plan> & plans, size_t begin, size_t end, dspark_sampler_rows & rows) const {
    bool any = false;
    for (size_t i = begin; i < end; ++i) {
        any = any || plans[i].adjust;
    }
    if (!any) {
        return;
    }
    const size_t V = (size_t) tgt.hp().n_vocab;
    rows.adjust.assign(rows.size() * V, 0.0f);
    for (size_t i = begin; i < end; ++i) {
        const plan & p = plans[i];
        if (p.adjust) {
            std::copy(p.adjust, p.adjust + (p.draft.size() + 1) * V, rows.adjust.begin() + (size_t) p.row * V);
        }
    }
}
