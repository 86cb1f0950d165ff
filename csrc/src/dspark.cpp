// The C API: every exported function validates its arguments, runs the C++ core inside a
// try/catch, records failures as the thread's last error and returns a status or NULL.
#include "dspark.h"

#include "dspark-backend.h"
#include "dspark-context.h"
#include "dspark-draft.h"
#include "dspark-engine.h"
#include "dspark-quant.h"
#include "dspark-sampler.h"
#include "models/dflash.h"
#include "dspark-gguf.h"
#include "dspark-impl.h"
#include "dspark-model.h"
#include "dspark-rpc.h"
#include "dspark-cpu-isa.h"
#include "dspark-matmul.h"

#include <algorithm>
#include <iterator>

#include <cmath>
#include <cstring>
#include <strings.h>
#include <new>
#include <string>

// Run f(); translate exceptions into a status and the last-error message. The call runs where
// dspark_run_call says (a worker thread once RPC servers are in use, see dspark-rpc.h).
template <typename F>
static int32_t guard(F && f) {
    return dspark_run_call([&]() -> int32_t {
        try {
            dspark_clear_last_error();
            return f();
        } catch (const dspark_error & e) {
            dspark_set_last_error(e.what(), e.status);
            return e.status;
        } catch (const std::bad_alloc &) {
            dspark_set_last_error("out of memory", DSPARK_STATUS_OUT_OF_MEMORY);
            return DSPARK_STATUS_OUT_OF_MEMORY;
        } catch (const std::exception & e) {
            dspark_set_last_error(std::string("internal error: ") + e.what(), DSPARK_STATUS_INTERNAL);
            return DSPARK_STATUS_INTERNAL;
        } catch (...) {
            dspark_set_last_error("internal error", DSPARK_STATUS_INTERNAL);
            return DSPARK_STATUS_INTERNAL;
        }
    });
}

// guard for calls whose result is a count (>= 0): the count, or the (negative) status.
template <typename T, typename F>
static T guard_count(F && f) {
    T out = 0;
    const int32_t st = guard([&]() {
        out = f();
        return DSPARK_STATUS_OK;
    });
    return st < 0 ? st : out;
}

// Free an object: through guard (a free talks to the devices it used), but not at all once an RPC
// server it used was lost, since that would wait on the dead server; it is leaked instead.
// `devices` must come from the object itself, not from objects it points to.
template <typename T>
static void guarded_free(T * obj, const std::vector<ggml_backend_dev_t> & devices) {
    if (!obj || dspark_rpc_lost(devices)) {
        return;
    }
    guard([&]() {
        delete obj;
        return DSPARK_STATUS_OK;
    });
}

// The same for functions returning an object: nullptr on failure.
template <typename T, typename F>
static T * guard_ptr(F && f) {
    T * out = nullptr;
    guard([&]() {
        out = f();
        return DSPARK_STATUS_OK;
    });
    return out;
}

// ---- library ----------------------------------------------------------------------------------

const char * dspark_version(void) {
    return DSPARK_VERSION_STRING;
}

const char * dspark_status_str(int32_t status) {
    switch (status) {
        case DSPARK_STATUS_OK:               return "ok";
        case DSPARK_STATUS_INVALID_ARGUMENT: return "invalid argument";
        case DSPARK_STATUS_IO:               return "I/O error";
        case DSPARK_STATUS_BAD_FORMAT:       return "bad file format";
        case DSPARK_STATUS_UNSUPPORTED:      return "unsupported";
        case DSPARK_STATUS_OUT_OF_MEMORY:    return "out of memory";
        case DSPARK_STATUS_CONTEXT_FULL:     return "context full";
        case DSPARK_STATUS_ABORTED:          return "aborted";
        case DSPARK_STATUS_DEVICE_LOST:      return "device lost";
        case DSPARK_STATUS_INTERNAL:         return "internal error";
        default:                             return "unknown status";
    }
}

const char * dspark_last_error(void) {
    return dspark_get_last_error();
}

int32_t dspark_last_status(void) {
    return dspark_get_last_status();
}

int32_t dspark_backend_load_all(const char * dir) {
    return guard([&]() {
        dspark_backends_load(dir ? dir : "");
        return DSPARK_STATUS_OK;
    });
}

const char * dspark_system_info(void) {
    static std::string info;
    guard([&]() {
        info = dspark_backend_system_info();
        return DSPARK_STATUS_OK;
    });
    return info.c_str();
}

// ---- quantization ----------------------------------------------------------------------------

int64_t dspark_quant_size(const char * type, int64_t n_rows, int64_t n_per_row) {
    return guard_count<int64_t>([&]() { return dspark_quant_bytes(type, n_rows, n_per_row); });
}

int64_t dspark_quantize(const char * type, const float * src, void * dst, int64_t n_rows, int64_t n_per_row) {
    return guard_count<int64_t>([&]() { return dspark_quantize_rows(type, src, dst, n_rows, n_per_row); });
}

int32_t dspark_dequantize(const char * type, const void * src, size_t src_size, float * dst, int64_t n) {
    return guard([&]() {
        dspark_dequantize_values(type, src, src_size, dst, n);
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_cpu_matmul(const char * type, const void * w, size_t w_size, int64_t n_rows, int64_t n_per_row,
                          const float * x, int64_t n_cols, float * y, const char * route, int32_t n_threads,
                          char * route_out) {
    return guard([&]() {
        const std::string taken = dspark_matmul_cpu_run(type, w, w_size, n_rows, n_per_row, x, n_cols, y, route, n_threads);
        if (route_out) {
            snprintf(route_out, 16, "%s", taken.c_str());
        }
        return DSPARK_STATUS_OK;
    });
}

const char * dspark_cpu_isa(void) {
    return dspark_cpu_isa_name(dspark_cpu_isa_in_use());
}

// ---- devices -----------------------------------------------------------------------------------

int32_t dspark_device_count(void) {
    int32_t n = 0;
    guard([&]() {
        n = dspark_device_count_all();
        return DSPARK_STATUS_OK;
    });
    return n;
}

const char * dspark_device_name(int32_t index) {
    ggml_backend_dev_t dev = dspark_device_get(index);
    return dev ? ggml_backend_dev_name(dev) : nullptr;
}

const char * dspark_device_description(int32_t index) {
    ggml_backend_dev_t dev = dspark_device_get(index);
    return dev ? ggml_backend_dev_description(dev) : nullptr;
}

int32_t dspark_device_type(int32_t index) {
    ggml_backend_dev_t dev = dspark_device_get(index);
    if (!dev) {
        dspark_set_last_error(dspark_format("device index %d out of range", index));
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    if (dspark_device_is_rpc(dev)) {
        return DSPARK_DEVICE_TYPE_RPC;
    }
    switch (ggml_backend_dev_type(dev)) {
        case GGML_BACKEND_DEVICE_TYPE_CPU:  return DSPARK_DEVICE_TYPE_CPU;
        case GGML_BACKEND_DEVICE_TYPE_GPU:  return DSPARK_DEVICE_TYPE_GPU;
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return DSPARK_DEVICE_TYPE_IGPU;
        default:                            return DSPARK_DEVICE_TYPE_ACCEL;
    }
}

int32_t dspark_device_memory(int32_t index, size_t * free_bytes, size_t * total_bytes) {
    ggml_backend_dev_t dev = dspark_device_get(index);
    if (!dev) {
        dspark_set_last_error(dspark_format("device index %d out of range", index));
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        dspark_rpc_check_alive({dev});  // asking a lost server would wait for it
        size_t fr = 0, tot = 0;
        ggml_backend_dev_memory(dev, &fr, &tot);
        if (free_bytes) *free_bytes = fr;
        if (total_bytes) *total_bytes = tot;
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_rpc_add_server(const char * endpoint) {
    if (!endpoint) {
        dspark_set_last_error("dspark_rpc_add_server: endpoint is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard_count<int32_t>([&]() { return dspark_rpc_connect(std::string(endpoint)); });
}

int32_t dspark_rpc_serve(const char * endpoint, int32_t device, int32_t n_threads) {
    if (!endpoint || n_threads < 1 || n_threads > GGML_MAX_N_THREADS) {
        dspark_set_last_error("dspark_rpc_serve: need an endpoint and n_threads in 1 .. 512");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        std::vector<ggml_backend_dev_t> devs;
        if (device != -1) {
            devs.push_back(dspark_device_pick(device));
        }
        dspark_rpc_run_server(std::string(endpoint), devs, n_threads);
        return DSPARK_STATUS_OK;
    });
}

// ---- GGUF files ----------------------------------------------------------------------------------

struct dspark_gguf * dspark_gguf_open(const char * path) {
    if (!path) {
        dspark_set_last_error("dspark_gguf_open: path is NULL");
        return nullptr;
    }
    return guard_ptr<dspark_gguf>([&]() {
        dspark_backends_load();  // installs the ggml log hook that captures format errors
        return new dspark_gguf(path);
    });
}

void dspark_gguf_close(struct dspark_gguf * gguf) {
    delete gguf;
}

static bool kv_ok(const dspark_gguf * g, int64_t i) {
    if (!g) {
        dspark_set_last_error("gguf handle is NULL");
        return false;
    }
    if (i < 0 || i >= gguf_get_n_kv(g->gguf)) {
        dspark_set_last_error(dspark_format("%s: metadata index %lld out of range", g->path.c_str(), (long long) i));
        return false;
    }
    return true;
}

static bool tensor_ok(const dspark_gguf * g, int64_t i) {
    if (!g) {
        dspark_set_last_error("gguf handle is NULL");
        return false;
    }
    if (i < 0 || i >= g->n_tensors()) {
        dspark_set_last_error(dspark_format("%s: tensor index %lld out of range", g->path.c_str(), (long long) i));
        return false;
    }
    return true;
}

uint64_t dspark_gguf_file_size(const struct dspark_gguf * g) { return g ? g->file_size : 0; }
uint32_t dspark_gguf_version(const struct dspark_gguf * g) { return g ? gguf_get_version(g->gguf) : 0; }
int64_t  dspark_gguf_n_kv(const struct dspark_gguf * g) { return g ? gguf_get_n_kv(g->gguf) : 0; }

int64_t dspark_gguf_find_key(const struct dspark_gguf * g, const char * key) {
    return g && key ? gguf_find_key(g->gguf, key) : -1;
}

const char * dspark_gguf_key(const struct dspark_gguf * g, int64_t i) {
    return kv_ok(g, i) ? gguf_get_key(g->gguf, i) : nullptr;
}

int32_t dspark_gguf_kv_type(const struct dspark_gguf * g, int64_t i) {
    return kv_ok(g, i) ? (int32_t) gguf_get_kv_type(g->gguf, i) : DSPARK_STATUS_INVALID_ARGUMENT;
}

int32_t dspark_gguf_arr_type(const struct dspark_gguf * g, int64_t i) {
    if (!kv_ok(g, i)) return DSPARK_STATUS_INVALID_ARGUMENT;
    if (gguf_get_kv_type(g->gguf, i) != GGUF_TYPE_ARRAY) {
        dspark_set_last_error(dspark_format("%s: key '%s' is not an array", g->path.c_str(), gguf_get_key(g->gguf, i)));
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return (int32_t) gguf_get_arr_type(g->gguf, i);
}

int64_t dspark_gguf_arr_n(const struct dspark_gguf * g, int64_t i) {
    if (!kv_ok(g, i) || gguf_get_kv_type(g->gguf, i) != GGUF_TYPE_ARRAY) return -1;
    return (int64_t) gguf_get_arr_n(g->gguf, i);
}

int32_t dspark_gguf_get_int(const struct dspark_gguf * g, int64_t i, int64_t * out) {
    if (!kv_ok(g, i)) return DSPARK_STATUS_INVALID_ARGUMENT;
    return guard([&]() {
        *out = g->get_int(gguf_get_key(g->gguf, i));
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_gguf_get_float(const struct dspark_gguf * g, int64_t i, double * out) {
    if (!kv_ok(g, i)) return DSPARK_STATUS_INVALID_ARGUMENT;
    return guard([&]() {
        *out = g->get_float(gguf_get_key(g->gguf, i));
        return DSPARK_STATUS_OK;
    });
}

const char * dspark_gguf_get_str(const struct dspark_gguf * g, int64_t i) {
    if (!kv_ok(g, i)) return nullptr;
    if (gguf_get_kv_type(g->gguf, i) != GGUF_TYPE_STRING) {
        dspark_set_last_error(dspark_format("%s: key '%s' is not a string", g->path.c_str(), gguf_get_key(g->gguf, i)));
        return nullptr;
    }
    return gguf_get_val_str(g->gguf, i);
}

const void * dspark_gguf_get_arr_data(const struct dspark_gguf * g, int64_t i) {
    if (!kv_ok(g, i)) return nullptr;
    if (gguf_get_kv_type(g->gguf, i) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g->gguf, i) == GGUF_TYPE_STRING ||
        gguf_get_arr_type(g->gguf, i) == GGUF_TYPE_ARRAY) {
        dspark_set_last_error(dspark_format("%s: key '%s' is not a numeric array", g->path.c_str(), gguf_get_key(g->gguf, i)));
        return nullptr;
    }
    return gguf_get_arr_data(g->gguf, i);
}

const char * dspark_gguf_get_arr_str(const struct dspark_gguf * g, int64_t i, int64_t j) {
    if (!kv_ok(g, i)) return nullptr;
    if (gguf_get_kv_type(g->gguf, i) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g->gguf, i) != GGUF_TYPE_STRING) {
        dspark_set_last_error(dspark_format("%s: key '%s' is not a string array", g->path.c_str(), gguf_get_key(g->gguf, i)));
        return nullptr;
    }
    if (j < 0 || j >= (int64_t) gguf_get_arr_n(g->gguf, i)) {
        dspark_set_last_error(dspark_format("%s: index %lld out of range", g->path.c_str(), (long long) j));
        return nullptr;
    }
    return gguf_get_arr_str(g->gguf, i, (size_t) j);
}

int64_t dspark_gguf_n_tensors(const struct dspark_gguf * g) { return g ? g->n_tensors() : 0; }

int64_t dspark_gguf_find_tensor(const struct dspark_gguf * g, const char * name) {
    return g && name ? gguf_find_tensor(g->gguf, name) : -1;
}

const char * dspark_gguf_tensor_name(const struct dspark_gguf * g, int64_t i) {
    return tensor_ok(g, i) ? gguf_get_tensor_name(g->gguf, i) : nullptr;
}

const char * dspark_gguf_tensor_type(const struct dspark_gguf * g, int64_t i) {
    return tensor_ok(g, i) ? ggml_type_name(gguf_get_tensor_type(g->gguf, i)) : nullptr;
}

int32_t dspark_gguf_tensor_n_dims(const struct dspark_gguf * g, int64_t i) {
    return tensor_ok(g, i) ? ggml_n_dims(g->tensor(i)) : DSPARK_STATUS_INVALID_ARGUMENT;
}

int64_t dspark_gguf_tensor_ne(const struct dspark_gguf * g, int64_t i, int32_t dim) {
    if (!tensor_ok(g, i)) return -1;
    if (dim < 0 || dim >= GGML_MAX_DIMS) {
        dspark_set_last_error(dspark_format("dimension %d out of range", dim));
        return -1;
    }
    return g->tensor(i)->ne[dim];
}

uint64_t dspark_gguf_tensor_offset(const struct dspark_gguf * g, int64_t i) {
    return tensor_ok(g, i) ? g->tensor_file_offset(i) : 0;
}

uint64_t dspark_gguf_tensor_nbytes(const struct dspark_gguf * g, int64_t i) {
    return tensor_ok(g, i) ? gguf_get_tensor_size(g->gguf, i) : 0;
}

// ---- models -------------------------------------------------------------------------------------

struct dspark_model_params dspark_model_default_params(void) {
    dspark_model_params p;
    p.device                   = -1;
    p.draft_sample_from_anchor = -1;
    p.draft_layer_offset       = 0;
    p.use_mmap                 = true;
    p.cpu_repack               = true;
    std::fill(std::begin(p.tensor_split), std::end(p.tensor_split), 0.0f);
    return p;
}

struct dspark_model * dspark_model_load_from_file(const char * path, const struct dspark_model_params * params) {
    if (!path) {
        dspark_set_last_error("dspark_model_load_from_file: path is NULL");
        return nullptr;
    }
    const dspark_model_params p = params ? *params : dspark_model_default_params();
    return guard_ptr<dspark_model>([&]() {
        dspark_backends_load();
        return dspark_model_load_target(path, p);
    });
}

void dspark_model_free(struct dspark_model * model) {
    // its own devices only: a draft's target may be gone already (it must not be read here)
    guarded_free(model, model && model->weights ? model->weights->devices : std::vector<ggml_backend_dev_t>());
}

const struct dspark_gguf * dspark_model_gguf(const struct dspark_model * m) {
    return m ? &m->file() : nullptr;
}

const char * dspark_model_arch(const struct dspark_model * m) { return m ? m->arch.c_str() : nullptr; }

const char * dspark_model_device(const struct dspark_model * m) {
    return m && m->device() ? ggml_backend_dev_name(m->device()) : nullptr;
}

const char * dspark_model_devices(const struct dspark_model * m) {
    return m ? m->device_names.c_str() : nullptr;
}

#define TARGET_HP(m, field) \
    ((m) && (m)->target ? (int32_t) (m)->target->hp.field : (m) && (m)->draft ? (int32_t) (m)->draft->hp.field : 0)

int32_t dspark_model_n_vocab(const struct dspark_model * m)     { return TARGET_HP(m, n_vocab); }
int32_t dspark_model_n_embd(const struct dspark_model * m)      { return TARGET_HP(m, n_embd); }
int32_t dspark_model_n_layer(const struct dspark_model * m)     { return TARGET_HP(m, n_layer); }
int32_t dspark_model_n_head(const struct dspark_model * m)      { return TARGET_HP(m, n_head); }
int32_t dspark_model_n_head_kv(const struct dspark_model * m)   { return TARGET_HP(m, n_head_kv); }
int32_t dspark_model_n_ctx_train(const struct dspark_model * m) { return TARGET_HP(m, n_ctx_train); }
uint64_t dspark_model_n_params(const struct dspark_model * m)   { return m ? m->weights->n_params : 0; }
uint64_t dspark_model_size(const struct dspark_model * m)       { return m ? m->weights->n_bytes : 0; }
int32_t dspark_model_n_repacked(const struct dspark_model * m)  { return m ? (int32_t) m->weights->n_repacked : 0; }

// ---- contexts ------------------------------------------------------------------------------------

struct dspark_context_params dspark_context_default_params(void) {
    dspark_context_params p;
    p.n_ctx                 = 0;
    p.n_batch               = 512;
    p.n_seq_max             = 1;
    p.n_outputs_max_per_seq = 0;
    p.n_threads             = 0;
    p.type_kv               = DSPARK_KV_TYPE_F16;
    p.flash_attn            = DSPARK_FLASH_ATTN_AUTO;
    p.batch_invariant       = false;
    return p;
}

// A target or draft context (T) over a model, with the default parameters when params is NULL.
template <typename T>
static T * new_context(const char * fn, const char * arg, dspark_model * model, const dspark_context_params * params) {
    if (!model) {
        dspark_set_last_error(std::string(fn) + ": " + arg + " is NULL");
        return nullptr;
    }
    const dspark_context_params p = params ? *params : dspark_context_default_params();
    return guard_ptr<T>([&]() { return new T(*model, p); });
}

template <typename T>
static void free_context(T * ctx) {
    guarded_free(ctx, ctx ? ctx->compute.devices : std::vector<ggml_backend_dev_t>());
}

struct dspark_context * dspark_context_init(struct dspark_model * model, const struct dspark_context_params * params) {
    return new_context<dspark_context>("dspark_context_init", "model", model, params);
}

void dspark_context_free(struct dspark_context * ctx) {
    free_context(ctx);
}

void dspark_context_get_params(const struct dspark_context * ctx, struct dspark_context_params * out) {
    if (ctx && out) {
        *out = ctx->params;
    }
}

int32_t dspark_context_set_threads(struct dspark_context * ctx, int32_t n_threads) {
    if (!ctx || n_threads < 1 || n_threads > GGML_MAX_N_THREADS) {
        dspark_set_last_error("dspark_context_set_threads: need a context and n_threads in 1 .. 512");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    ctx->params.n_threads = n_threads;
    ctx->compute.set_threads(n_threads);
    return DSPARK_STATUS_OK;
}

void dspark_context_graph_counts(const struct dspark_context * ctx, uint64_t * built, uint64_t * reused) {
    if (built) {
        *built = ctx ? ctx->n_graphs_built : 0;
    }
    if (reused) {
        *reused = ctx ? ctx->n_graphs_reused : 0;
    }
}

void dspark_context_set_abort_callback(struct dspark_context * ctx, dspark_abort_callback callback, void * user_data) {
    if (ctx) {
        ctx->compute.set_abort(callback, user_data);
    }
}

int32_t dspark_set_capture_layers(struct dspark_context * ctx, const int32_t * layer_ids, int32_t n) {
    if (!ctx || n < 0 || (n > 0 && !layer_ids)) {
        dspark_set_last_error("dspark_set_capture_layers: need a context and n >= 0 layer ids");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        ctx->set_capture(std::vector<int32_t>(layer_ids, layer_ids + n));
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_decode(struct dspark_context * ctx, const struct dspark_batch * batch) {
    if (!ctx || !batch) {
        dspark_set_last_error("dspark_decode: context and batch are required");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        ctx->decode(*batch);
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_n_outputs(const struct dspark_context * ctx) {
    return ctx ? ctx->n_outputs : 0;
}

const float * dspark_get_logits(const struct dspark_context * ctx) {
    return ctx ? ctx->logits.data() : nullptr;
}

const float * dspark_get_captured(const struct dspark_context * ctx, int32_t * n_tokens, int32_t * width) {
    if (!ctx) {
        return nullptr;
    }
    if (n_tokens) *n_tokens = ctx->n_captured;
    if (width) *width = (int32_t) (ctx->capture.size() * ctx->hp().n_embd);
    return ctx->captured.data();
}

// ---- KV caches -----------------------------------------------------------------------------------

static dspark_kv_cache * as_cache(dspark_kv * kv) { return reinterpret_cast<dspark_kv_cache *>(kv); }
static const dspark_kv_cache * as_cache(const dspark_kv * kv) { return reinterpret_cast<const dspark_kv_cache *>(kv); }

struct dspark_kv * dspark_get_kv(struct dspark_context * ctx) {
    return ctx ? reinterpret_cast<dspark_kv *>(&ctx->kv) : nullptr;
}

static int32_t check_seq(const dspark_kv_cache * kv, dspark_seq_id seq, bool allow_all) {
    if (!kv) {
        dspark_set_last_error("KV cache handle is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    if ((allow_all && seq < -1) || (!allow_all && seq < 0) || seq >= (int32_t) kv->n_seq_max) {
        dspark_set_last_error(dspark_format("sequence id %d out of range (0 .. %u)", seq, kv->n_seq_max - 1));
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return DSPARK_STATUS_OK;
}

int32_t dspark_kv_seq_rm(struct dspark_kv * kv, dspark_seq_id seq, dspark_pos p0, dspark_pos p1) {
    const int32_t st = check_seq(as_cache(kv), seq, true);
    if (st == DSPARK_STATUS_OK) {
        as_cache(kv)->seq_rm(seq, std::max(p0, 0), p1);
    }
    return st;
}

int32_t dspark_kv_seq_cp(struct dspark_kv * kv, dspark_seq_id src, dspark_seq_id dst, dspark_pos p0, dspark_pos p1) {
    int32_t st = check_seq(as_cache(kv), src, false);
    if (st == DSPARK_STATUS_OK) {
        st = check_seq(as_cache(kv), dst, false);
    }
    if (st == DSPARK_STATUS_OK) {
        as_cache(kv)->seq_cp(src, dst, std::max(p0, 0), p1);
    }
    return st;
}

int32_t dspark_kv_seq_keep(struct dspark_kv * kv, dspark_seq_id seq) {
    const int32_t st = check_seq(as_cache(kv), seq, false);
    if (st == DSPARK_STATUS_OK) {
        as_cache(kv)->seq_keep(seq);
    }
    return st;
}

void dspark_kv_clear(struct dspark_kv * kv) {
    if (kv) {
        as_cache(kv)->clear();
    }
}

dspark_pos dspark_kv_seq_pos_max(const struct dspark_kv * kv, dspark_seq_id seq) {
    return check_seq(as_cache(kv), seq, false) == DSPARK_STATUS_OK ? as_cache(kv)->seq_pos_max(seq) : -1;
}

dspark_pos dspark_kv_seq_pos_min(const struct dspark_kv * kv, dspark_seq_id seq) {
    return check_seq(as_cache(kv), seq, false) == DSPARK_STATUS_OK ? as_cache(kv)->seq_pos_min(seq) : -1;
}

int32_t dspark_kv_n_used(const struct dspark_kv * kv) {
    return kv ? (int32_t) as_cache(kv)->n_used() : 0;
}

int32_t dspark_kv_n_cells(const struct dspark_kv * kv) {
    return kv ? (int32_t) as_cache(kv)->n_cells : 0;
}

uint64_t dspark_kv_nbytes(const struct dspark_kv * kv) {
    return kv ? (uint64_t) as_cache(kv)->nbytes() : 0;
}

// ---- drafts ---------------------------------------------------------------------------------------

struct dspark_model * dspark_draft_load_from_file(const char * path, const struct dspark_model * target,
                                                  const struct dspark_model_params * params) {
    if (!path) {
        dspark_set_last_error("dspark_draft_load_from_file: path is NULL");
        return nullptr;
    }
    const dspark_model_params p = params ? *params : dspark_model_default_params();
    return guard_ptr<dspark_model>([&]() {
        dspark_backends_load();
        return dspark_model_load_draft(path, target, p);
    });
}

int32_t dspark_draft_get_info(const struct dspark_model * m, struct dspark_draft_info * out) {
    if (!m || !m->draft || !out) {
        dspark_set_last_error("dspark_draft_get_info: need a draft model and an output struct");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    const dflash_hparams & hp = m->draft->hp;
    *out = dspark_draft_info();
    out->block_size = hp.block_size;
    out->max_draft = hp.max_draft();
    out->n_target_layers = (int32_t) std::min<size_t>(hp.target_layers.size(), DSPARK_MAX_TARGET_LAYERS);
    for (int32_t i = 0; i < out->n_target_layers; ++i) {
        out->target_layers[i] = hp.target_layers[i];
    }
    out->mask_token_id = hp.mask_token_id;
    out->n_vocab = hp.n_vocab;
    out->n_vocab_draft = hp.n_vocab_draft;
    out->markov_head = (int32_t) hp.markov;
    out->markov_rank = hp.markov_rank;
    out->sample_from_anchor = hp.sample_from_anchor;
    out->causal = hp.causal;
    out->has_confidence = hp.has_confidence;
    return DSPARK_STATUS_OK;
}

struct dspark_draft_context * dspark_draft_context_init(struct dspark_model * draft, const struct dspark_context_params * params) {
    return new_context<dspark_draft_context>("dspark_draft_context_init", "draft", draft, params);
}

void dspark_draft_context_free(struct dspark_draft_context * dctx) {
    free_context(dctx);
}

struct dspark_kv * dspark_draft_get_kv(struct dspark_draft_context * dctx) {
    return dctx ? reinterpret_cast<dspark_kv *>(&dctx->kv) : nullptr;
}

void dspark_draft_set_abort_callback(struct dspark_draft_context * dctx, dspark_abort_callback callback, void * user_data) {
    if (dctx) {
        dctx->compute.set_abort(callback, user_data);
    }
}

int32_t dspark_draft_inject(struct dspark_draft_context * dctx, const float * features, int32_t n_rows, int32_t width,
                            const dspark_pos * pos, const dspark_seq_id * seq_id) {
    if (!dctx) {
        dspark_set_last_error("dspark_draft_inject: context is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        dctx->inject(features, n_rows, width, pos, seq_id);
        return DSPARK_STATUS_OK;
    });
}

struct dspark_propose_params dspark_propose_default_params(void) {
    dspark_propose_params p;
    p.n_draft      = 0;
    p.markov_top_k = 0;
    p.temperature  = 1.0f;
    p.seed        = 0;
    p.sample      = false;
    p.want_logits = false;
    return p;
}

int32_t dspark_draft_propose(struct dspark_draft_context * dctx, int32_t n_seqs, const dspark_token * anchors,
                             const dspark_pos * pos0, const dspark_seq_id * seq_ids, const struct dspark_propose_params * params) {
    if (!dctx) {
        dspark_set_last_error("dspark_draft_propose: context is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    const dspark_propose_params p = params ? *params : dspark_propose_default_params();
    return guard([&]() {
        dspark_propose_request r;
        r.n_seqs = n_seqs;
        r.anchors = anchors;
        r.pos0 = pos0;
        r.seq_ids = seq_ids;
        r.n_draft = p.n_draft > 0 ? p.n_draft : dctx->hp().max_draft();
        r.want_logits = p.want_logits;
        r.sample = p.sample;
        r.markov_top_k = p.markov_top_k;
        // one temperature for all; each block's noise from the seed and its sequence id, so that
        // a sequence's block is the same whatever else is proposed with it
        const int32_t n = std::max(n_seqs, 0);
        dspark_sampler_params sp;
        sp.temperature = p.temperature;
        std::vector<dspark_sampler_params> samplers(n, sp);
        std::vector<uint64_t> seeds(n);
        for (int32_t i = 0; i < n && seq_ids; ++i) {
            seeds[i] = dspark_mix_seed(p.seed, (uint64_t) seq_ids[i]);
        }
        if (p.sample && !(p.temperature > 0.0f)) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "sampling needs a temperature > 0");
        }
        r.samplers = samplers.data();
        r.seeds = seeds.data();
        dctx->propose(r);
        return DSPARK_STATUS_OK;
    });
}

const dspark_token * dspark_draft_get_tokens(const struct dspark_draft_context * dctx, int32_t * n_seqs, int32_t * n_draft) {
    if (!dctx) {
        return nullptr;
    }
    if (n_seqs) *n_seqs = dctx->n_seqs;
    if (n_draft) *n_draft = dctx->n_draft;
    return dctx->tokens.data();
}

const float * dspark_draft_get_confidence(const struct dspark_draft_context * dctx) {
    return dctx && !dctx->confidence.empty() ? dctx->confidence.data() : nullptr;
}

void dspark_draft_graph_counts(const struct dspark_draft_context * dctx, uint64_t * built, uint64_t * reused) {
    if (built) {
        *built = dctx ? dctx->n_graphs_built : 0;
    }
    if (reused) {
        *reused = dctx ? dctx->n_graphs_reused : 0;
    }
}

const float * dspark_draft_get_probabilities(const struct dspark_draft_context * dctx) {
    return dctx && !dctx->probs.empty() ? dctx->probs.data() : nullptr;
}

const float * dspark_draft_get_logits(const struct dspark_draft_context * dctx) {
    return dctx && !dctx->logits.empty() ? dctx->logits.data() : nullptr;
}

// ---- sampling -------------------------------------------------------------------------------------

struct dspark_sampling_params dspark_sampling_default_params(void) {
    dspark_sampling_params p;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = DSPARK_DEFAULT_SEED;
    return p;
}


// Sample rows with one sampler each (params[r], or one for all), on the host (dev null) or in a graph on dev.
static int32_t sample_rows(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                           const dspark_sampling_params * params, bool one_for_all, const float * adjust,
                           ggml_backend_dev_t (*device)(int32_t), int32_t index, dspark_token * out, float * prob) {
    if (!logits || !u || !out || n_rows < 1 || n_vocab < 1) {
        dspark_set_last_error("dspark_sample_rows: need logits, uniforms, an output array and positive sizes");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        std::vector<dspark_sampler_params> sp(n_rows);
        for (int32_t r = 0; r < n_rows; ++r) {
            sp[r] = dspark_sampler_from(!params ? dspark_sampling_default_params() : params[one_for_all ? 0 : r]);
        }
        if (device) {
            dspark_sample_rows_in_graph(device(index), logits, n_rows, n_vocab, u, sp.data(), adjust, out, prob);
            return DSPARK_STATUS_OK;
        }
        for (int32_t r = 0; r < n_rows; ++r) {
            const size_t off = (size_t) r * n_vocab;
            out[r] = dspark_sample_host(logits + off, n_vocab, sp[r], u[r], adjust ? adjust + off : nullptr, prob ? prob + r : nullptr);
        }
        return DSPARK_STATUS_OK;
    });
}

static ggml_backend_dev_t cpu_device(int32_t) {
    return dspark_device_cpu();
}

static ggml_backend_dev_t indexed_device(int32_t index) {
    ggml_backend_dev_t dev = dspark_device_get(index);
    if (!dev) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "device index %d out of range (%d devices)", index, dspark_device_count_all());
    }
    return dev;
}

int32_t dspark_sample_rows(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                           const struct dspark_sampling_params * params, bool in_graph, dspark_token * out) {
    return sample_rows(logits, n_rows, n_vocab, u, params, true, nullptr, in_graph ? cpu_device : nullptr, 0, out, nullptr);
}

int32_t dspark_sample_rows_each(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                const struct dspark_sampling_params * params, const float * adjust, int32_t device,
                                dspark_token * out, float * prob) {
    if (device < -1) {
        dspark_set_last_error(dspark_format("dspark_sample_rows_each: device must be -1 (the host) or a device index, got %d", device));
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return sample_rows(logits, n_rows, n_vocab, u, params, false, adjust, device >= 0 ? indexed_device : nullptr, device, out, prob);
}

int32_t dspark_sampling_check(const struct dspark_sampling_params * params) {
    if (!params) {
        dspark_set_last_error("dspark_sampling_check: params is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        dspark_sampler_from(*params);
        return DSPARK_STATUS_OK;
    });
}

// ---- engine ---------------------------------------------------------------------------------------

int32_t dspark_spec_n_draft(const struct dspark_model * draft, int32_t n_max) {
    if (!draft || !draft->draft) {
        dspark_set_last_error("dspark_spec_n_draft: not a draft model");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return dspark_clamp_n_draft(draft->draft->hp, n_max);
}

struct dspark_spec_params dspark_spec_default_params(void) {
    dspark_spec_params p;
    p.n_max = 0;
    p.n_min = 0;
    p.p_min = 0.0f;
    p.draft_mode = DSPARK_DRAFT_GREEDY_CHAIN;
    p.schedule = DSPARK_SCHEDULE_STATIC;
    p.markov_top_k = 0;
    p.backend_sampling = DSPARK_BACKEND_SAMPLING_AUTO;
    return p;
}

int32_t dspark_spec_check(const struct dspark_spec_params * params) {
    if (!params) {
        dspark_set_last_error("dspark_spec_check: params is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        dspark_spec_params_check(*params);
        return DSPARK_STATUS_OK;
    });
}

struct dspark_engine * dspark_engine_init(struct dspark_context * target, struct dspark_draft_context * draft,
                                          const struct dspark_spec_params * params) {
    if (!target) {
        dspark_set_last_error("dspark_engine_init: target context is NULL");
        return nullptr;
    }
    const dspark_spec_params p = params ? *params : dspark_spec_default_params();
    return guard_ptr<dspark_engine>([&]() { return new dspark_engine(*target, draft, p); });
}

void dspark_engine_free(struct dspark_engine * engine) {
    delete engine;
}

int32_t dspark_engine_set_eog(struct dspark_engine * e, const dspark_token * ids, int32_t n) {
    if (!e || n < 0 || (n > 0 && !ids)) {
        dspark_set_last_error("dspark_engine_set_eog: need an engine and n >= 0 ids");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    e->eog.assign(ids, ids + n);
    return DSPARK_STATUS_OK;
}

int32_t dspark_engine_n_draft(const struct dspark_engine * e) {
    return e ? e->n_draft : 0;
}

int32_t dspark_engine_add(struct dspark_engine * e, dspark_seq_id seq_id, const struct dspark_request * req) {
    if (!e || !req) {
        dspark_set_last_error("dspark_engine_add: engine and request are required");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        e->add(seq_id, *req);
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_engine_cached_prefix(const struct dspark_engine * e, dspark_seq_id seq_id, const dspark_token * prompt,
                                    int32_t n_prompt) {
    if (!e) {
        dspark_set_last_error("dspark_engine_cached_prefix: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard_count<int32_t>([&]() { return e->cached_prefix(seq_id, prompt, n_prompt); });
}

int32_t dspark_engine_step(struct dspark_engine * e) {
    if (!e) {
        dspark_set_last_error("dspark_engine_step: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard_count<int32_t>([&]() { return e->step(); });
}

int32_t dspark_engine_run(struct dspark_engine * e, int32_t max_steps) {
    if (!e) {
        dspark_set_last_error("dspark_engine_run: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard_count<int32_t>([&]() { return e->run(max_steps); });
}

int32_t dspark_engine_get_tokens(const struct dspark_engine * e, dspark_seq_id seq_id, const dspark_token ** tokens,
                                 const uint8_t ** from_draft) {
    if (!e) {
        dspark_set_last_error("dspark_engine_get_tokens: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    int32_t n = 0;
    const int32_t st = guard([&]() {
        const dspark_seq_state & s = e->seq(seq_id);
        if (tokens) *tokens = s.new_tokens.data();
        if (from_draft) *from_draft = s.new_from_draft.data();
        n = (int32_t) s.new_tokens.size();
        return DSPARK_STATUS_OK;
    });
    return st < 0 ? st : n;
}

static int32_t get_logprobs(const char * fn, const struct dspark_engine * e, dspark_seq_id seq_id, bool prompt,
                            const float ** logprob, const dspark_token ** top_ids, const float ** top_logprobs, int32_t * top) {
    if (!e) {
        dspark_set_last_error(std::string(fn) + ": engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard_count<int32_t>([&]() {
        const dspark_seq_state & s = e->seq(seq_id);
        const dspark_logprobs & lp = prompt ? s.prompt_logprobs : s.new_logprobs;
        if (logprob) *logprob = lp.logprob.data();
        if (top_ids) *top_ids = lp.top_ids.data();
        if (top_logprobs) *top_logprobs = lp.top_logprobs.data();
        if (top) *top = lp.top;
        return (int32_t) lp.size();
    });
}

int32_t dspark_engine_get_logprobs(const struct dspark_engine * e, dspark_seq_id seq_id, const float ** logprob,
                                   const dspark_token ** top_ids, const float ** top_logprobs, int32_t * top) {
    return get_logprobs("dspark_engine_get_logprobs", e, seq_id, false, logprob, top_ids, top_logprobs, top);
}

int32_t dspark_engine_get_prompt_logprobs(const struct dspark_engine * e, dspark_seq_id seq_id, const float ** logprob,
                                          const dspark_token ** top_ids, const float ** top_logprobs, int32_t * top) {
    return get_logprobs("dspark_engine_get_prompt_logprobs", e, seq_id, true, logprob, top_ids, top_logprobs, top);
}

int32_t dspark_engine_seq_status(const struct dspark_engine * e, dspark_seq_id seq_id) {
    if (!e) {
        dspark_set_last_error("dspark_engine_seq_status: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return e->status(seq_id);
}

int32_t dspark_engine_get_stats(const struct dspark_engine * e, dspark_seq_id seq_id, struct dspark_spec_stats * out) {
    if (!e || !out) {
        dspark_set_last_error("dspark_engine_get_stats: engine and output are required");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        *out = seq_id < 0 ? e->total : e->seq(seq_id).stats;
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_engine_remove(struct dspark_engine * e, dspark_seq_id seq_id) {
    if (!e) {
        dspark_set_last_error("dspark_engine_remove: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        e->remove(seq_id);
        return DSPARK_STATUS_OK;
    });
}

int32_t dspark_engine_detach(struct dspark_engine * e, dspark_seq_id seq_id) {
    if (!e) {
        dspark_set_last_error("dspark_engine_detach: engine is NULL");
        return DSPARK_STATUS_INVALID_ARGUMENT;
    }
    return guard([&]() {
        e->detach(seq_id);
        return DSPARK_STATUS_OK;
    });
}

void dspark_engine_request_abort(struct dspark_engine * e, bool requested) {
    if (e) {
        e->abort.requested.store(requested, std::memory_order_relaxed);
    }
}

void dspark_engine_set_abort_callback(struct dspark_engine * e, dspark_abort_callback callback, void * user_data) {
    if (!e) {
        return;
    }
    e->tgt.compute.set_abort(callback, user_data);
    if (e->dft) {
        e->dft->compute.set_abort(callback, user_data);
    }
}
