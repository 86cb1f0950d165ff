// What a target context and a draft context share: the model they run, their resolved parameters,
// their KV cache, where their graphs run, and the reuse of a graph across calls of one shape.
#pragma once

#include "dspark.h"
#include "dspark-compute.h"
#include "dspark-graph.h"
#include "dspark-kv-cache.h"
#include "dspark-model.h"

#include <cstdint>

// The last graph built for a key (a shape): valid while its compute has begun no other graph.
template <typename Key>
struct dspark_graph_cache {
    Key           key;
    ggml_cgraph * gf  = nullptr;
    uint64_t      gen = 0;  // compute.generation when it was built

    bool valid(const dspark_compute & c) const { return gf && gen == c.generation; }
    bool holds(const dspark_compute & c, const Key & k) const { return valid(c) && key == k; }
};

struct dspark_runtime {
    dspark_model &        model;
    dspark_context_params params;
    dspark_kv_cache       kv;
    dspark_compute        compute;
    bool                  flash_attn = true;
    bool                  pad_odd_columns = false;  // CPU: see dspark_graph
    uint64_t              n_graphs_built = 0, n_graphs_reused = 0;  // statistics of graph_for

    explicit dspark_runtime(dspark_model & m) : model(m) {}
    dspark_runtime(const dspark_runtime &) = delete;
    dspark_runtime & operator=(const dspark_runtime &) = delete;

  protected:
    // The graph for `key`: the cached one when it was built for an equal key, else a new one that
    // build(g) describes, allocated and cached. Only its inputs have to be set afterwards.
    template <typename Key, typename Build>
    ggml_cgraph * graph_for(dspark_graph_cache<Key> & cache, const Key & key, Build build) {
        if (cache.holds(compute, key)) {
            n_graphs_reused++;
            return cache.gf;
        }
        cache.gf = nullptr;  // until the new one is complete
        ggml_context * ctx = compute.begin();
        ggml_cgraph * gf = compute.new_graph(ctx);
        build(dspark_graph{ctx, gf, pad_odd_columns});
        compute.alloc(gf);
        cache.gf = gf;
        cache.key = key;
        cache.gen = compute.generation;
        n_graphs_built++;
        return gf;
    }
};
