// Where graphs run: the model's device backend (plus the CPU backend for anything the device
// cannot do), one backend scheduler whose buffers are reserved once for the worst-case graph, and
// the host memory graphs are described in. Per step only the graph description is rebuilt; no
// compute buffer is reallocated unless a graph outgrows the reservation.
#pragma once

#include "dspark-backend.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <atomic>
#include <string>
#include <vector>

typedef bool (*dspark_abort_fn)(void * data);

struct dspark_abort_request;

struct dspark_compute {
    ggml_backend_t              backend     = nullptr;  // the model's device
    ggml_backend_t              backend_cpu = nullptr;  // same as backend on CPU-only runs
    std::vector<ggml_backend_t> backends_also;          // of init's `also` devices
    std::vector<ggml_backend_dev_t> devices;            // of every backend the scheduler has
    ggml_backend_sched_t        sched       = nullptr;
    size_t                      max_nodes   = 0;

    dspark_compute() = default;
    ~dspark_compute();
    dspark_compute(const dspark_compute &) = delete;
    dspark_compute & operator=(const dspark_compute &) = delete;

    // `also`: other devices holding tensors the graphs read (a draft's borrowed target weights);
    // the scheduler gets a backend for each so those reads work wherever the models live.
    void init(ggml_backend_dev_t dev, int n_threads, size_t max_nodes, const std::vector<ggml_backend_dev_t> & also = {});
    void set_threads(int n_threads);
    // Kernels whose per-row results do not depend on the batch (the CPU's reference ones; the
    // graphs that run on the CPU backend, including a GPU run's fallback nodes).
    void set_batch_invariant(bool on);
    void set_abort(dspark_abort_fn fn, void * data);
    // A stop flag read at every graph node like the abort callback, but without calling out: what
    // a host language sets from any thread or signal handler (null: none).
    void set_abort_flag(const std::atomic<bool> * flag);
    // While false, the abort callback is not consulted (a step's commit phase must not stop halfway).
    bool abortable = true;
    // The stop requests linked to this compute: each side unlinks itself from the other when it
    // goes, so an engine and its contexts may be freed in any order (a garbage collector's).
    std::vector<dspark_abort_request *> requests;

    // Start describing a new graph (invalidates tensors of the previous one).
    ggml_context * begin();
    // Counts begin() calls: a graph kept for reuse is valid while this has not changed.
    uint64_t generation = 0;
    ggml_cgraph *  new_graph(ggml_context * ctx) const;

    // Size the compute buffers for this (worst-case) graph.
    void reserve(ggml_cgraph * gf);
    // Allocate the graph's tensors; inputs can be set afterwards.
    void alloc(ggml_cgraph * gf);
    // Run it; throws DSPARK_STATUS_ABORTED if the abort callback fired.
    void compute(ggml_cgraph * gf);

    bool device_supports(const ggml_tensor * op) const;

    // Run graphs one node at a time, waiting for each: a workaround for backends that race
    // (see dspark_draft_context), at the cost of one submission per node.
    void sync_every_node();

  private:
    std::vector<uint8_t> meta;
    ggml_context *       ctx = nullptr;
    dspark_abort_fn      abort_fn   = nullptr;
    void *               abort_data = nullptr;
    const std::atomic<bool> * abort_flag = nullptr;
    bool                 sync_nodes   = false;  // sync_every_node
    bool                 checking_ids = false;  // DSPARK_CHECK_MUL_MAT_ID (read at init), by id_rules
    dspark_device_rules  id_rules = dspark_device_rules::cpu;
    std::string          id_violation;          // the first broken mul_mat_id rule of the last compute
    static bool          abort_trampoline(void * self);
    static bool          observe_node(ggml_tensor * t, bool ask, void * self);
    void                 install_observer();  // the eval callback, when sync_nodes or checking_ids
    void                 install_abort();
};

// A stop request shared by the computes linked to it, unlinked when it goes (an engine owns one).
struct dspark_abort_request {
    std::atomic<bool> requested{false};

    dspark_abort_request() = default;
    ~dspark_abort_request();
    dspark_abort_request(const dspark_abort_request &) = delete;
    dspark_abort_request & operator=(const dspark_abort_request &) = delete;

    void link(dspark_compute * c);
    void forget(dspark_compute * c);  // c is going away

  private:
    std::vector<dspark_compute *> linked;
};
