// A target context: the KV cache, compute resources and output buffers of one model, and the
// batch decode that validates, places, runs and reads back a batch.
#pragma once

#include "dspark.h"
#include "dspark-runtime.h"
#include "models/target-graph.h"

#include <vector>

struct dspark_context : dspark_runtime {
    uint32_t               n_outputs_max = 0;  // rows of the logits buffer

    std::vector<int32_t>   capture;            // layer ids whose inputs are captured
    std::vector<float>     logits;             // [n_outputs_max][n_vocab]
    std::vector<float>     captured;           // [n_batch][capture.size() * n_embd]
    int32_t                n_outputs  = 0;     // of the last decode
    int32_t                n_captured = 0;     // tokens captured by the last decode
    std::vector<int32_t>   sampled;            // [n_outputs] ids sampled in-graph by the last decode
    std::vector<float>     probed;             // [n_outputs] probe-token probabilities (with probes)
    bool                   has_sampled = false;

    dspark_context(dspark_model & model, const dspark_context_params & params);  // throws

    // Throws; the KV cache is unchanged on failure. With `sampling` (one row per output row: its
    // sampler, uniform and probe token), the output rows are sampled inside the graph and only the
    // ids (and the probes' probabilities) come back (`sampled`, `probed`); the logits buffer is left
    // as it was.
    void decode(const dspark_batch & batch, const dspark_sampler_rows * sampling = nullptr);
    // One output row's logits of the last in-graph-sampled decode with probes (kept on the backend,
    // not copied back); out has n_vocab floats.
    void logits_row(int32_t row, float * out) const;
    void set_capture(const std::vector<int32_t> & ids);

    const target_hparams & hp() const { return model.target->hp; }

  private:
    void validate(const dspark_batch & batch, int32_t & n_out) const;
    void run(const dspark_batch & batch, const std::vector<int32_t> & slots, int32_t n_out, const dspark_sampler_rows * sampling);
    void reserve_worst_case();
    // Whether batches may attend in sequence order (dspark_graph::attention_in_order): a cache on a
    // device, or DSPARK_DEVICE_RULES=cuda; and how its queries are laid out (by channels on CUDA).
    bool in_order_possible() const;
    bool in_order_by_channels() const;
    // How a batch whose sequences' cells are `order` attends in sequence order (cells 0: it does not,
    // too many query rows for it).
    target_in_order_shape in_order_shape(const dspark_kv_seq_cells & order) const;
    void set_in_order_inputs(const target_in_order & io, const dspark_kv_seq_cells & order, const dspark_batch & b) const;
    bool                                device_cache = false;  // some layer's KV cache is not in host memory
    bool                                host_cache = false;    // some layer's KV cache is in host memory
    dspark_device_rules                 rules = dspark_device_rules::cpu;  // of the model's device, read at creation
    target_graph                        cached_io;     // of the graph in `graph`
    dspark_graph_cache<target_graph_key> graph;
};

// Resolve defaults (0 / negative sentinels) and check ranges; throws INVALID_ARGUMENT.
dspark_context_params dspark_resolve_context_params(const dspark_context_params & p, int n_ctx_train);
ggml_type             dspark_kv_ggml_type(int32_t type_kv);
// The cache is read per head: a block-quantized type needs head_dim to be whole blocks. Throws.
void                  dspark_check_kv_type(ggml_type type, int head_dim);
