#include "dspark-compute.h"

#include "dspark-mul-mat-id-check.h"

#include <algorithm>

#include "dspark-backend.h"
#include "dspark-attention.h"
#include "dspark-impl.h"
#include "dspark-rpc.h"

dspark_compute::~dspark_compute() {
    for (dspark_abort_request * r : requests) {
        r->forget(this);
    }
    if (ctx) {
        ggml_free(ctx);
    }
    if (sched) {
        ggml_backend_sched_free(sched);
    }
    for (ggml_backend_t b : backends_also) {
        ggml_backend_free(b);
    }
    if (backend_cpu && backend_cpu != backend) {
        ggml_backend_free(backend_cpu);
    }
    if (backend) {
        ggml_backend_free(backend);
    }
}

void dspark_compute::init(ggml_backend_dev_t dev, int n_threads, size_t max_nodes_,
                          const std::vector<ggml_backend_dev_t> & also) {
    max_nodes = max_nodes_;
    backend = dspark_backend_init(dev);
    backend_cpu = dspark_device_is_cpu(dev) ? backend : dspark_backend_init(dspark_device_cpu());
    // The model's device first (the scheduler prefers earlier backends), the CPU last (its fallback).
    std::vector<ggml_backend_t> backends;
    if (backend != backend_cpu) {
        backends.push_back(backend);
    }
    for (ggml_backend_dev_t d : also) {
        if (d && d != dev && !dspark_device_is_cpu(d)) {
            backends_also.push_back(dspark_backend_init(d));
            backends.push_back(backends_also.back());
        }
    }
    backends.push_back(backend_cpu);
    for (ggml_backend_t b : backends) {
        devices.push_back(ggml_backend_get_device(b));
    }
    set_threads(n_threads);

    sched = ggml_backend_sched_new(backends.data(), nullptr, (int) backends.size(), max_nodes, false, true);
    if (!sched) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "failed to create the backend scheduler");
    }
    checking_ids = dspark_mul_mat_id_check_on(dspark_device_rules_of(dev), id_rules);
    install_observer();
    meta.resize(ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false));
}

void dspark_compute::set_threads(int n_threads) {
    dspark_backend_set_threads(backend_cpu, n_threads);
    if (backend != backend_cpu) {
        dspark_backend_set_threads(backend, n_threads);
    }
    for (ggml_backend_t b : backends_also) {
        dspark_backend_set_threads(b, n_threads);
    }
}

// ggml's reference kernels are needed for its flash attention, which picks kernels by batch shape;
// our CPU attention node is batch-invariant itself, and ggml's other kernels compute a row alike
// in any batch, so with the node in the build the fast kernels stay.
void dspark_compute::set_batch_invariant(bool on) {
    dspark_backend_set_reference_kernels(backend_cpu, on && !dspark_attention_cpu_available());
}

bool dspark_compute::abort_trampoline(void * self) {
    const dspark_compute * c = (const dspark_compute *) self;
    if (!c->abortable) {
        return false;
    }
    return (c->abort_flag && c->abort_flag->load(std::memory_order_relaxed)) || (c->abort_fn && c->abort_fn(c->abort_data));
}

void dspark_compute::set_abort(dspark_abort_fn fn, void * data) {
    abort_fn = fn;
    abort_data = data;
    install_abort();
}

void dspark_compute::set_abort_flag(const std::atomic<bool> * flag) {
    abort_flag = flag;
    install_abort();
}

void dspark_compute::install_abort() {
    const bool any = abort_fn || abort_flag;
    std::vector<ggml_backend_t> all = backends_also;
    all.push_back(backend);
    all.push_back(backend_cpu);
    for (ggml_backend_t b : all) {
        ggml_backend_dev_t dev = ggml_backend_get_device(b);
        ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
        auto set = reg ? (ggml_backend_set_abort_callback_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_abort_callback")
                       : nullptr;
        if (set) {
            set(b, any ? abort_trampoline : nullptr, any ? this : nullptr);
        }
    }
}

ggml_context * dspark_compute::begin() {
    generation++;
    if (ctx) {
        ggml_free(ctx);
    }
    ggml_init_params p = { /*.mem_size =*/ meta.size(), /*.mem_buffer =*/ meta.data(), /*.no_alloc =*/ true };
    ctx = ggml_init(p);
    return ctx;
}

ggml_cgraph * dspark_compute::new_graph(ggml_context * c) const {
    return ggml_new_graph_custom(c, max_nodes, false);
}

void dspark_compute::reserve(ggml_cgraph * gf) {
    dspark_rpc_check_alive(devices);
    if (!ggml_backend_sched_reserve(sched, gf)) {
        dspark_throw(DSPARK_STATUS_OUT_OF_MEMORY, "not enough memory to reserve the compute buffers");
    }
}

void dspark_compute::alloc(ggml_cgraph * gf) {
    dspark_rpc_check_alive(devices);
    ggml_backend_sched_reset(sched);
    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        dspark_throw(DSPARK_STATUS_OUT_OF_MEMORY, "failed to allocate the compute graph");
    }
}

// The eval callback: waits for every node when sync_nodes (sync_every_node), and under
// DSPARK_CHECK_MUL_MAT_ID checks each mul_mat_id's ids as the node runs (they may be overwritten later).
bool dspark_compute::observe_node(ggml_tensor * t, bool ask, void * self) {
    dspark_compute * c = (dspark_compute *) self;
    if (ask) {
        return c->sync_nodes || (c->checking_ids && t->op == GGML_OP_MUL_MAT_ID);
    }
    if (c->sync_nodes || c->checking_ids) {
        ggml_backend_synchronize(c->backend);
    }
    if (c->checking_ids && t->op == GGML_OP_MUL_MAT_ID && c->id_violation.empty()) {
        std::vector<int32_t> ids(ggml_nbytes(t->src[2]) / sizeof(int32_t));
        ggml_backend_tensor_get(t->src[2], ids.data(), 0, ggml_nbytes(t->src[2]));
        c->id_violation = dspark_mul_mat_id_violation(t, ids.data(), c->id_rules);
    }
    return true;
}

void dspark_compute::install_observer() {
    const bool observe = sync_nodes || checking_ids;
    ggml_backend_sched_set_eval_callback(sched, observe ? observe_node : nullptr, observe ? this : nullptr);
}

void dspark_compute::compute(ggml_cgraph * gf) {
    dspark_rpc_check_alive(devices);
    id_violation.clear();
    const ggml_status st = ggml_backend_sched_graph_compute(sched, gf);
    if (!id_violation.empty()) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "%s", id_violation.c_str());
    }
    if (st == GGML_STATUS_ABORTED) {
        dspark_throw(DSPARK_STATUS_ABORTED, "computation aborted");
    }
    if (st != GGML_STATUS_SUCCESS) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "graph computation failed (%s)", ggml_status_to_string(st));
    }
}

bool dspark_compute::device_supports(const ggml_tensor * op) const {
    return ggml_backend_supports_op(backend, op);
}

dspark_abort_request::~dspark_abort_request() {
    for (dspark_compute * c : linked) {
        c->set_abort_flag(nullptr);
        c->requests.erase(std::remove(c->requests.begin(), c->requests.end(), this), c->requests.end());
    }
}

void dspark_abort_request::link(dspark_compute * c) {
    c->set_abort_flag(&requested);
    linked.push_back(c);
    c->requests.push_back(this);
}

void dspark_abort_request::forget(dspark_compute * c) {
    linked.erase(std::remove(linked.begin(), linked.end(), c), linked.end());
}

// Observing every node makes the scheduler submit the graph one node at a time, and the callback
// waits for each before the next is submitted.
void dspark_compute::sync_every_node() {
    sync_nodes = true;
    install_observer();
}
