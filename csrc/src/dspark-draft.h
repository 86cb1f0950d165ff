// A draft context: the draft's own KV cache of injected target features, and the two operations
// of speculative drafting — inject features of committed target positions, and propose blocks.
#pragma once

#include "dspark-runtime.h"
#include "dspark-sampler.h"
#include "models/dflash-graph.h"

#include <random>
#include <vector>

// What a propose graph is built for (see the target's graph reuse): consecutive steps of one
// shape run the same graph.
struct draft_graph_key {
    int  n_rows = 0, n_seqs = 0, block_len = 0, n_kv = 0, markov_top_k = 0;
    bool logits = false;
    dspark_sampler_shape sampler;  // sampler.sample false: argmax

    bool operator==(const draft_graph_key & o) const {
        return n_rows == o.n_rows && n_seqs == o.n_seqs && block_len == o.block_len && n_kv == o.n_kv &&
               markov_top_k == o.markov_top_k && logits == o.logits && sampler == o.sampler;
    }
};

// What one propose call asks for.
struct dspark_propose_request {
    int32_t               n_seqs  = 0;
    const dspark_token  * anchors = nullptr;  // [n_seqs] last committed token of each sequence
    const dspark_pos    * pos0    = nullptr;  // [n_seqs] position of the anchor
    const dspark_seq_id * seq_ids = nullptr;  // [n_seqs]
    int32_t               n_draft = 0;        // tokens to propose per sequence (same for all)
    bool                  want_logits = false;  // copy every slot's logits back (`logits`)
    bool                  keep_logits = false;  // keep them on the backend only, for logits_row()
    bool                  sample = false;     // draw each block in-graph with its sampler (else argmax)
    int32_t               markov_top_k = 0;   // see dflash_pick
    // With sample, per block: its sampler (dspark-sampler.h's chain over the draft's logits;
    // temperature 0 = argmax) and the seed of its own stream of uniforms (one per slot), so a
    // block's draw depends on nothing else in the call. [n_seqs] each.
    const dspark_sampler_params * samplers = nullptr;
    const uint64_t *      seeds = nullptr;
    // Target features to inject first, in the same graph (the positions committed since the last
    // propose): rows [n_inject][width] at (inject_pos, inject_seq). They stay in the cache.
    int32_t               n_inject = 0;
    const float *         inject_features = nullptr;
    const dspark_pos *    inject_pos = nullptr;
    const dspark_seq_id * inject_seq = nullptr;
    const dspark_token *  inject_tokens = nullptr;  // the token of each row (prompt caching), or null
};

struct dspark_draft_context : dspark_runtime {

    // results of the last propose, block-major: [n_seqs][n_draft] (logits: [n_seqs][n_draft][V])
    int32_t               n_seqs  = 0;
    int32_t               n_draft = 0;
    std::vector<int32_t>  tokens;
    std::vector<float>    confidence;
    std::vector<float>    probs;       // when sampling: each token's probability under its draw's distribution
    std::vector<float>    logits;

    // One slot's full-vocabulary logits of the last propose (want_logits or keep_logits), read from
    // the backend; out has n_vocab floats. Throws if they are not there any more.
    void logits_row(int32_t block, int32_t slot, float * out) const;

    dspark_draft_context(dspark_model & draft, const dspark_context_params & params);  // throws
    ~dspark_draft_context();

    // Store target features [n_rows][width] as context cells at (pos, seq), of the target's tokens
    // `tokens` (null: not known; only cells whose tokens are known serve a cached prompt prefix).
    // Throws; unchanged on failure.
    void inject(const float * features, int32_t n_rows, int32_t width, const dspark_pos * pos, const dspark_seq_id * seq,
                const dspark_token * tokens = nullptr);
    // Decode one block per sequence; the draft cache is the same afterwards. Throws on bad input.
    void propose(const dspark_propose_request & req);

    const dflash_hparams & hp() const { return model.draft->hp; }
    int block_len(int n_draft) const { return n_draft + hp().first_pred_slot(); }

  private:
    ggml_context *        maps_ctx = nullptr;
    ggml_backend_buffer_t maps_buf = nullptr;
    dflash_vocab_maps     vocab_maps;  // of a reduced vocabulary, on the compute device
    void                  upload_vocab_maps();
    void validate_inject(const float * features, int32_t n_rows, int32_t width, const dspark_pos * pos,
                         const dspark_seq_id * seq, std::vector<int32_t> & last) const;
    void validate_propose(const dspark_propose_request & req, std::vector<int32_t> & last) const;
    void run_propose(const dspark_propose_request & req, const std::vector<int32_t> & inj_slots,
                     const std::vector<int32_t> & block_slots);
    void read_results(const dspark_propose_request & req, const dflash_block_graph & io);
    dspark_sampler_rows sampler_rows(const dspark_propose_request & req) const;
    dflash_inject_graph   cached_inj;  // of the graph in `graph`
    dflash_block_graph    cached_io;
    dspark_graph_cache<draft_graph_key> graph;
    bool                  kept_logits = false;  // the last propose's logits stay in cached_io
    void reserve_worst_case();
};
