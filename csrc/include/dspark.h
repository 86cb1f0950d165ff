/*
 * dspark.h — the public C API of dspark-ggml.
 *
 * Speculative decoding on ggml: a target LLM (GGUF archs qwen3, qwen2, llama, qwen3moe, gemma4)
 * verifies blocks of tokens proposed by a DFlash / DSpark draft (GGUF arch "dflash").
 *
 * Usage, target only:
 *
 *     struct dspark_model * model = dspark_model_load_from_file("qwen3.gguf", NULL);
 *     if (!model) { fprintf(stderr, "%s\n", dspark_last_error()); return 1; }
 *     struct dspark_context_params cp = dspark_context_default_params();
 *     cp.n_ctx = 4096;
 *     struct dspark_context * ctx = dspark_context_init(model, &cp);
 *     // fill a dspark_batch, dspark_decode(ctx, &batch), read dspark_get_logits(ctx) ...
 *     dspark_context_free(ctx);
 *     dspark_model_free(model);
 *
 * Conventions
 *   - Functions returning int32_t return DSPARK_STATUS_OK (0) or a negative enum dspark_status,
 *     unless documented otherwise. Constructors return NULL on failure. After any failure,
 *     dspark_last_error() holds a message for this thread naming the problem.
 *   - A failed call leaves its objects as they were (a refused decode changes no KV cell).
 *   - Params are passed by pointer; NULL means the defaults from *_default_params().
 *   - Ownership: the caller owns what *_load / *_init / *_open return and frees it with the
 *     matching *_free / *_close (NULL is accepted and ignored). A context borrows its model, which
 *     must outlive it. Returned pointers (strings, logits) are owned by the object and stay valid
 *     until the next call that modifies it.
 *   - Thread safety: a model is immutable after loading and may be shared by contexts on several
 *     threads; a context (or gguf handle) must not be used by two threads at once.
 *   - No C++ exception, abort or exit crosses this boundary on bad input.
 *
 * The declarations between the cdef markers are also read by the Python binding (cffi), so they
 * stay within plain C: no macros other than integer #defines, no includes.
 */
#ifndef DSPARK_H
#define DSPARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#    ifdef DSPARK_BUILD
#        define DSPARK_API __declspec(dllexport)
#    else
#        define DSPARK_API __declspec(dllimport)
#    endif
#else
#    define DSPARK_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* @cdef-begin */

#define DSPARK_API_VERSION 1
#define DSPARK_TOKEN_NULL -1
#define DSPARK_DEFAULT_SEED 4294967295

typedef int32_t dspark_token;
typedef int32_t dspark_pos;
typedef int32_t dspark_seq_id;

enum dspark_status {
    DSPARK_STATUS_OK               =    0,
    DSPARK_STATUS_INVALID_ARGUMENT =   -1, /* a bad value from the caller: nothing changed     */
    DSPARK_STATUS_IO               =   -2, /* a file could not be opened or read              */
    DSPARK_STATUS_BAD_FORMAT       =   -3, /* a file is not a valid GGUF of a known model     */
    DSPARK_STATUS_UNSUPPORTED      =   -4, /* valid input this build cannot handle            */
    DSPARK_STATUS_OUT_OF_MEMORY    =   -5,
    DSPARK_STATUS_CONTEXT_FULL     =   -6, /* no free KV cells for the batch: nothing changed */
    DSPARK_STATUS_ABORTED          =   -7, /* the abort callback asked to stop                */
    DSPARK_STATUS_DEVICE_LOST      =   -8, /* a device stopped answering (an RPC server died): what
                                              was placed on it cannot be used any more          */
    DSPARK_STATUS_INTERNAL         = -100,
};

/* ---- library ------------------------------------------------------------------------------ */

DSPARK_API const char * dspark_version(void);
DSPARK_API const char * dspark_status_str(int32_t status);

/* Message of the last failed call on this thread ("" if none), and its status (0 if none): the
 * way to learn why a constructor returned NULL. */
DSPARK_API const char * dspark_last_error(void);
DSPARK_API int32_t      dspark_last_status(void);

/* Load dynamically built ggml backends (GGML_BACKEND_DL builds) from a directory. Idempotent;
 * backends linked into the library are always available. NULL = the library's own directory. */
DSPARK_API int32_t dspark_backend_load_all(const char * dir);

/* ggml build facts: ggml version, backends, CPU features. */
DSPARK_API const char * dspark_system_info(void);

enum dspark_log_level {
    DSPARK_LOG_LEVEL_DEBUG = 1,
    DSPARK_LOG_LEVEL_INFO  = 2,
    DSPARK_LOG_LEVEL_WARN  = 3,
    DSPARK_LOG_LEVEL_ERROR = 4,
};
typedef void (*dspark_log_callback)(int32_t level, const char * text, void * user_data);
/* Route library and ggml log messages; NULL restores the default (stderr, warnings and up). */
DSPARK_API void dspark_log_set(dspark_log_callback callback, void * user_data);

/* Weight quantization with ggml's own kernels, by type name ("f16", "q8_0", "q4_k", ...):
 * the byte size of n_rows rows of n_per_row values, quantize (returns bytes written), and
 * dequantize n values from the src_size bytes at src. Negative status on an unknown type, a type
 * with no float conversion (i8 .. i64, f64), a row length the type cannot hold, or a source
 * buffer shorter than n values of the type. */
DSPARK_API int64_t dspark_quant_size(const char * type, int64_t n_rows, int64_t n_per_row);
DSPARK_API int64_t dspark_quantize(const char * type, const float * src, void * dst, int64_t n_rows, int64_t n_per_row);
DSPARK_API int32_t dspark_dequantize(const char * type, const void * src, size_t src_size, float * dst, int64_t n);

/* The CPU's weight matmul as the runtime computes it, for tests and benchmarks: y [n_cols][n_rows]
 * = w · x for a weight of `type` (n_rows rows of n_per_row values, as dspark_quantize writes them;
 * w_size bytes at w) and x [n_cols][n_per_row] F32, on n_threads threads, through `route`: "auto"
 * (the plan the runtime picks for this weight), "blocks", "own", "rows" (the type's single-column
 * kernel per column) or "ggml" (ggml's matmul as it is). Writes the route taken to route_out (16
 * bytes) if not NULL. UNSUPPORTED when this CPU or build cannot run the route for the type. */
DSPARK_API int32_t dspark_cpu_matmul(const char * type, const void * w, size_t w_size, int64_t n_rows, int64_t n_per_row,
                                     const float * x, int64_t n_cols, float * y, const char * route, int32_t n_threads,
                                     char * route_out);

/* The vector instructions our CPU kernels use on this machine: "scalar", "avx2", "avx512_vnni" or
 * "amx_int8" (AVX-512 VNNI and AMX tiles the OS grants) (DSPARK_CPU_ISA caps it). */
DSPARK_API const char * dspark_cpu_isa(void);

/* ---- devices ------------------------------------------------------------------------------ */

enum dspark_device_type {
    DSPARK_DEVICE_TYPE_CPU   = 0,
    DSPARK_DEVICE_TYPE_GPU   = 1,
    DSPARK_DEVICE_TYPE_IGPU  = 2,
    DSPARK_DEVICE_TYPE_ACCEL = 3,
    DSPARK_DEVICE_TYPE_RPC   = 4, /* a device of an rpc-server on another machine (or process) */
};

DSPARK_API int32_t      dspark_device_count(void);
DSPARK_API const char * dspark_device_name(int32_t index);         /* NULL if out of range */
DSPARK_API const char * dspark_device_description(int32_t index);  /* NULL if out of range */
DSPARK_API int32_t      dspark_device_type(int32_t index);         /* enum dspark_device_type or < 0 */
DSPARK_API int32_t      dspark_device_memory(int32_t index, size_t * free_bytes, size_t * total_bytes);

/* ggml's RPC backend: the devices of an rpc-server at "host:port" join the device list (named RPC0,
 * RPC1, ...; type DSPARK_DEVICE_TYPE_RPC) and can hold models or some of a target's layers
 * (dspark_model_params.tensor_split). Returns the number of devices the server offers (adding a
 * server twice adds nothing), or a negative status: unreachable server, malformed endpoint, or a
 * ggml built without RPC. Once any server is added, calls run on worker threads so that a server
 * that dies mid-call makes the call fail with DSPARK_STATUS_DEVICE_LOST instead of hanging; after that,
 * what was placed on RPC devices refuses further work (free it; its memory is not reclaimed). */
DSPARK_API int32_t dspark_rpc_add_server(const char * endpoint);
/* Serve local devices to RPC clients at "host:port" (device: an index, or -1 for the CPU), with
 * n_threads CPU threads. Blocks for as long as it serves; returns a negative status if it cannot
 * start (port in use, no RPC in this build, an RPC device given). One client at a time, no
 * authentication: bind it to a trusted network only. */
DSPARK_API int32_t dspark_rpc_serve(const char * endpoint, int32_t device, int32_t n_threads);

/* ---- GGUF files ---------------------------------------------------------------------------- */

/* Metadata value types, numbered as in the GGUF format. */
enum dspark_gguf_type {
    DSPARK_GGUF_TYPE_UINT8   = 0,
    DSPARK_GGUF_TYPE_INT8    = 1,
    DSPARK_GGUF_TYPE_UINT16  = 2,
    DSPARK_GGUF_TYPE_INT16   = 3,
    DSPARK_GGUF_TYPE_UINT32  = 4,
    DSPARK_GGUF_TYPE_INT32   = 5,
    DSPARK_GGUF_TYPE_FLOAT32 = 6,
    DSPARK_GGUF_TYPE_BOOL    = 7,
    DSPARK_GGUF_TYPE_STRING  = 8,
    DSPARK_GGUF_TYPE_ARRAY   = 9,
    DSPARK_GGUF_TYPE_UINT64  = 10,
    DSPARK_GGUF_TYPE_INT64   = 11,
    DSPARK_GGUF_TYPE_FLOAT64 = 12,
};

struct dspark_gguf;

/* Open a GGUF file and check its structure (header, metadata, tensor table, that every tensor's
 * data lies inside the file). Reads no tensor data. NULL on error. */
DSPARK_API struct dspark_gguf * dspark_gguf_open(const char * path);
DSPARK_API void                 dspark_gguf_close(struct dspark_gguf * gguf);

DSPARK_API uint64_t     dspark_gguf_file_size(const struct dspark_gguf * gguf);
DSPARK_API uint32_t     dspark_gguf_version(const struct dspark_gguf * gguf);
DSPARK_API int64_t      dspark_gguf_n_kv(const struct dspark_gguf * gguf);
DSPARK_API int64_t      dspark_gguf_find_key(const struct dspark_gguf * gguf, const char * key); /* -1: absent */
DSPARK_API const char * dspark_gguf_key(const struct dspark_gguf * gguf, int64_t i);
DSPARK_API int32_t      dspark_gguf_kv_type(const struct dspark_gguf * gguf, int64_t i);  /* enum dspark_gguf_type */
DSPARK_API int32_t      dspark_gguf_arr_type(const struct dspark_gguf * gguf, int64_t i); /* element type of an array */
DSPARK_API int64_t      dspark_gguf_arr_n(const struct dspark_gguf * gguf, int64_t i);
/* Scalars of any integer/bool type, of any float type, and strings. Wrong type: error status. */
DSPARK_API int32_t      dspark_gguf_get_int(const struct dspark_gguf * gguf, int64_t i, int64_t * out);
DSPARK_API int32_t      dspark_gguf_get_float(const struct dspark_gguf * gguf, int64_t i, double * out);
DSPARK_API const char * dspark_gguf_get_str(const struct dspark_gguf * gguf, int64_t i);
/* Arrays: raw element data of a numeric array (element type from dspark_gguf_arr_type), and the
 * j-th string of a string array. NULL on a type mismatch or out-of-range index. */
DSPARK_API const void * dspark_gguf_get_arr_data(const struct dspark_gguf * gguf, int64_t i);
DSPARK_API const char * dspark_gguf_get_arr_str(const struct dspark_gguf * gguf, int64_t i, int64_t j);

DSPARK_API int64_t      dspark_gguf_n_tensors(const struct dspark_gguf * gguf);
DSPARK_API int64_t      dspark_gguf_find_tensor(const struct dspark_gguf * gguf, const char * name); /* -1: absent */
DSPARK_API const char * dspark_gguf_tensor_name(const struct dspark_gguf * gguf, int64_t i);
DSPARK_API const char * dspark_gguf_tensor_type(const struct dspark_gguf * gguf, int64_t i); /* "f16", "q8_0", ... */
DSPARK_API int32_t      dspark_gguf_tensor_n_dims(const struct dspark_gguf * gguf, int64_t i);
DSPARK_API int64_t      dspark_gguf_tensor_ne(const struct dspark_gguf * gguf, int64_t i, int32_t dim); /* ggml order */
DSPARK_API uint64_t     dspark_gguf_tensor_offset(const struct dspark_gguf * gguf, int64_t i); /* in the file */
DSPARK_API uint64_t     dspark_gguf_tensor_nbytes(const struct dspark_gguf * gguf, int64_t i);

/* ---- models ------------------------------------------------------------------------------ */

struct dspark_model;

#define DSPARK_MAX_DEVICES 16

struct dspark_model_params {
    int32_t device;                   /* index from dspark_device_*; -1 = the first GPU if any, else the CPU
                                         (a draft loaded with a target: -1 = the target's device) */
    int32_t draft_sample_from_anchor; /* drafts: -1 = as the file says; 0 / 1 = force the 1+N / anchor-first layout */
    int32_t draft_layer_offset;       /* drafts: added to every target layer id (to test conversions); default 0 */
    bool    use_mmap;                 /* map the file and compute from it without a copy (CPU); default true */
    bool    cpu_repack;               /* CPU: copy weights the backend can repack for faster matmuls (Q4_0, Q4_K,
                                         IQ4_NL on AVX2) into that layout, as llama.cpp does, and pack the
                                         32-value block types for our kernel on AVX-512 VNNI; default true */
    float   tensor_split[DSPARK_MAX_DEVICES]; /* spread the repeating layers over devices in these
                                         proportions, by device index (like llama.cpp's --tensor-split); the
                                         embeddings, final norm and head stay on `device`. All 0 (default):
                                         every layer on `device` */
};

DSPARK_API struct dspark_model_params dspark_model_default_params(void);

/* Load a target model (arch qwen3, qwen2, llama, qwen3moe or gemma4). NULL on error (see
 * dspark_last_error). */
DSPARK_API struct dspark_model * dspark_model_load_from_file(const char * path, const struct dspark_model_params * params);
DSPARK_API void                  dspark_model_free(struct dspark_model * model);

/* The model's GGUF metadata and tensor table; owned by the model. */
DSPARK_API const struct dspark_gguf * dspark_model_gguf(const struct dspark_model * model);

DSPARK_API const char * dspark_model_arch(const struct dspark_model * model);
DSPARK_API const char * dspark_model_device(const struct dspark_model * model); /* device name */
/* Every device holding some of its weights, main device first, comma-separated ("CPU,RPC0"). */
DSPARK_API const char * dspark_model_devices(const struct dspark_model * model);
DSPARK_API int32_t      dspark_model_n_vocab(const struct dspark_model * model);
DSPARK_API int32_t      dspark_model_n_embd(const struct dspark_model * model);
DSPARK_API int32_t      dspark_model_n_layer(const struct dspark_model * model);
DSPARK_API int32_t      dspark_model_n_head(const struct dspark_model * model);
DSPARK_API int32_t      dspark_model_n_head_kv(const struct dspark_model * model);
DSPARK_API int32_t      dspark_model_n_ctx_train(const struct dspark_model * model);
DSPARK_API uint64_t     dspark_model_n_params(const struct dspark_model * model);
DSPARK_API uint64_t     dspark_model_size(const struct dspark_model * model); /* bytes of weights */
/* weight tensors held in a faster CPU layout than the file's (repacked by ggml, packed for our kernel) */
DSPARK_API int32_t      dspark_model_n_repacked(const struct dspark_model * model);

/* ---- contexts (target) ---------------------------------------------------------------------- */

enum dspark_kv_type {
    DSPARK_KV_TYPE_F16  = 0,
    DSPARK_KV_TYPE_F32  = 1,
    DSPARK_KV_TYPE_BF16 = 2,
    DSPARK_KV_TYPE_Q8_0 = 3,
};

enum dspark_flash_attn {
    DSPARK_FLASH_ATTN_AUTO = -1, /* on where the device supports it */
    DSPARK_FLASH_ATTN_OFF  =  0,
    DSPARK_FLASH_ATTN_ON   =  1,
};

struct dspark_context;

struct dspark_context_params {
    uint32_t n_ctx;                 /* KV cells shared by all sequences; 0 = the model's training context  */
    uint32_t n_batch;               /* max tokens in one decode; default 512                               */
    uint32_t n_seq_max;             /* sequence ids allowed: 0 .. n_seq_max-1 (at most 256); default 1      */
    uint32_t n_outputs_max_per_seq; /* max output rows of one sequence in a batch; 0 = no limit but n_batch */
    int32_t  n_threads;             /* CPU threads; <= 0 = all hardware threads                            */
    int32_t  type_kv;               /* enum dspark_kv_type; default F16                                     */
    int32_t  flash_attn;            /* enum dspark_flash_attn; default AUTO                                 */
    bool     batch_invariant;       /* CPU: a row's results must not depend on the rest of its batch (what a
                                       server needs for the same tokens in any batch). Builds with our CPU
                                       attention node (AVX2/FMA/F16C) are so already; others switch to
                                       ggml's reference kernels (flash attention row by row, no fused ops).
                                       Default false */
};

DSPARK_API struct dspark_context_params dspark_context_default_params(void);

/* A context for a target model: KV cache, compute buffers (reserved here for the largest batch)
 * and output buffers. Borrows the model. NULL on error. */
DSPARK_API struct dspark_context * dspark_context_init(struct dspark_model * model, const struct dspark_context_params * params);
DSPARK_API void                    dspark_context_free(struct dspark_context * ctx);

/* The parameters in effect (defaults resolved). */
DSPARK_API void    dspark_context_get_params(const struct dspark_context * ctx, struct dspark_context_params * out);
DSPARK_API int32_t dspark_context_set_threads(struct dspark_context * ctx, int32_t n_threads);

/* Called during computation; returning true stops it: the call returns DSPARK_STATUS_ABORTED and
 * leaves the KV cache as it was before the call. NULL removes the callback. */
typedef bool (*dspark_abort_callback)(void * user_data);
DSPARK_API void dspark_context_set_abort_callback(struct dspark_context * ctx, dspark_abort_callback callback, void * user_data);

/* Capture, for every token of each following batch, the residual stream entering each listed layer
 * (0 = the token embeddings, n_layer = the input of the final norm), concatenated in list order.
 * n = 0 turns capture off. */
DSPARK_API int32_t dspark_set_capture_layers(struct dspark_context * ctx, const int32_t * layer_ids, int32_t n);

/* A batch of tokens: each with a position, a sequence id and whether it produces logits. */
struct dspark_batch {
    int32_t               n_tokens;
    const dspark_token  * token;   /* [n_tokens] */
    const dspark_pos    * pos;     /* [n_tokens]; per sequence, above every position already cached */
    const dspark_seq_id * seq_id;  /* [n_tokens] */
    const int8_t        * output;  /* [n_tokens] nonzero = produce logits; NULL = only the last token */
};

/* Run the target on a batch: attention is causal within each sequence and never crosses
 * sequences. Returns DSPARK_STATUS_OK, or INVALID_ARGUMENT (bad token, position, sequence id, batch
 * size or output count), CONTEXT_FULL, ABORTED; on any failure the KV cache is unchanged. */
DSPARK_API int32_t dspark_decode(struct dspark_context * ctx, const struct dspark_batch * batch);

/* Decode graphs built and reused so far: a batch of the same shape as the previous one (tokens,
 * outputs, cache cells attended, capture, in-graph sampling) runs the previous graph again. */
DSPARK_API void dspark_context_graph_counts(const struct dspark_context * ctx, uint64_t * built, uint64_t * reused);

/* Outputs of the last decode, valid until the next one. Logits: [n_outputs][n_vocab], rows in
 * batch order of the flagged tokens. Captured: [n_tokens][width], width = n_layers_captured * n_embd. */
DSPARK_API int32_t       dspark_n_outputs(const struct dspark_context * ctx);
DSPARK_API const float * dspark_get_logits(const struct dspark_context * ctx);
DSPARK_API const float * dspark_get_captured(const struct dspark_context * ctx, int32_t * n_tokens, int32_t * width);

/* ---- KV caches ------------------------------------------------------------------------------ */

/* The KV cache of a target context (dspark_get_kv) or of a draft context (dspark_draft_get_kv);
 * owned by its context. Sequence operations are bookkeeping only, no graph runs. p1 < 0 means to
 * the end; seq_id -1 in seq_rm means every sequence. */
struct dspark_kv;

DSPARK_API struct dspark_kv * dspark_get_kv(struct dspark_context * ctx);
DSPARK_API int32_t    dspark_kv_seq_rm(struct dspark_kv * kv, dspark_seq_id seq_id, dspark_pos p0, dspark_pos p1);
DSPARK_API int32_t    dspark_kv_seq_cp(struct dspark_kv * kv, dspark_seq_id src, dspark_seq_id dst, dspark_pos p0, dspark_pos p1);
DSPARK_API int32_t    dspark_kv_seq_keep(struct dspark_kv * kv, dspark_seq_id seq_id);
DSPARK_API void       dspark_kv_clear(struct dspark_kv * kv);
DSPARK_API dspark_pos dspark_kv_seq_pos_max(const struct dspark_kv * kv, dspark_seq_id seq_id); /* -1: empty */
DSPARK_API dspark_pos dspark_kv_seq_pos_min(const struct dspark_kv * kv, dspark_seq_id seq_id); /* -1: empty */
DSPARK_API int32_t    dspark_kv_n_used(const struct dspark_kv * kv);
DSPARK_API int32_t    dspark_kv_n_cells(const struct dspark_kv * kv);
/* Bytes of K and V the cache holds, over every layer (memory allocated, whatever is used). */
DSPARK_API uint64_t   dspark_kv_nbytes(const struct dspark_kv * kv);

/* ---- drafts (DFlash / DSpark, GGUF arch "dflash") ---------------------------------------------- */

#define DSPARK_MAX_TARGET_LAYERS 64

enum dspark_markov_head {
    DSPARK_MARKOV_NONE    = 0, /* DFlash */
    DSPARK_MARKOV_VANILLA = 1, /* bias = W2 W1[prev] */
    DSPARK_MARKOV_GATED   = 2, /* bias = W2 (sigmoid(Wg [h; W1[prev]] + bg) * W1[prev]) */
    DSPARK_MARKOV_RNN     = 3, /* a block-local recurrent state over [s; W1[prev]; h] */
};

struct dspark_draft_info {
    int32_t block_size;          /* trained block length (dflash.block_size) */
    int32_t max_draft;           /* tokens one block proposes at most: block_size (anchor-first DSpark) or block_size-1 */
    int32_t n_target_layers;
    int32_t target_layers[DSPARK_MAX_TARGET_LAYERS]; /* target layer ids whose inputs the draft reads */
    int32_t mask_token_id;
    int32_t n_vocab;             /* target vocabulary */
    int32_t n_vocab_draft;       /* rows of the draft's lm head (< n_vocab for reduced-vocab drafts) */
    int32_t markov_head;         /* enum dspark_markov_head */
    int32_t markov_rank;
    bool    sample_from_anchor;  /* anchor-first layout (every slot predicts) vs 1+N */
    bool    causal;              /* causal attention inside the block */
    bool    has_confidence;      /* confidence head present */
};

/* Load a draft for a target. target may be NULL only for a draft with its own embeddings and lm
 * head. Fails on a draft that does not fit the target (hidden size, layer ids, vocabulary). The
 * target must outlive the draft. NULL on error. */
DSPARK_API struct dspark_model * dspark_draft_load_from_file(const char * path, const struct dspark_model * target,
                                                             const struct dspark_model_params * params);
DSPARK_API int32_t dspark_draft_get_info(const struct dspark_model * draft, struct dspark_draft_info * out);

struct dspark_draft_context;

/* n_ctx, n_batch (max feature rows per inject), n_seq_max, n_threads, type_kv, flash_attn apply. */
DSPARK_API struct dspark_draft_context * dspark_draft_context_init(struct dspark_model * draft, const struct dspark_context_params * params);
DSPARK_API void                          dspark_draft_context_free(struct dspark_draft_context * dctx);
DSPARK_API struct dspark_kv *            dspark_draft_get_kv(struct dspark_draft_context * dctx);
DSPARK_API void dspark_draft_set_abort_callback(struct dspark_draft_context * dctx, dspark_abort_callback callback, void * user_data);

/* Inject target features (rows of dspark_get_captured, width = n_target_layers * n_embd) as context
 * cells at the target positions pos[i] of sequences seq_id[i]. Positions of a sequence must follow
 * its injected ones. On failure the draft cache is unchanged. */
DSPARK_API int32_t dspark_draft_inject(struct dspark_draft_context * dctx, const float * features, int32_t n_rows,
                                       int32_t width, const dspark_pos * pos, const dspark_seq_id * seq_id);

struct dspark_propose_params {
    int32_t  n_draft;      /* tokens to propose per sequence, 1 .. max_draft (same for every block) */
    int32_t  markov_top_k; /* > 0: add the Markov bias to each slot's top-k base candidates only (argmax
                              drafting): k rows of the Markov W2 per slot instead of all; 0 = exact */
    float    temperature;  /* > 0 with sample: each slot (and so the Markov chain) drawn in-graph from
                              softmax(logits / temperature) by inverse CDF at one uniform per slot */
    uint64_t seed;         /* seed of the uniforms when sampling: each block draws from its own stream of
                              this seed and its sequence id, whatever else is proposed with it */
    bool     sample;       /* false: argmax chain (default) */
    bool     want_logits;  /* also return each drafted slot's full-vocabulary logits */
};

DSPARK_API struct dspark_propose_params dspark_propose_default_params(void);

/* Propose a block for each sequence: anchors[i] is its last committed token, at position pos0[i]
 * (the first position not yet injected). Blocks are [anchor, MASK, ...] of equal length; the draft
 * cache is the same afterwards. Results stay valid until the next propose. */
DSPARK_API int32_t dspark_draft_propose(struct dspark_draft_context * dctx, int32_t n_seqs, const dspark_token * anchors,
                                        const dspark_pos * pos0, const dspark_seq_id * seq_ids,
                                        const struct dspark_propose_params * params);
/* Propose graphs built and reused so far (a step of the same shape as the previous one reuses it). */
DSPARK_API void dspark_draft_graph_counts(const struct dspark_draft_context * dctx, uint64_t * built, uint64_t * reused);
/* [n_seqs][n_draft] token ids (target vocabulary), block-major. */
DSPARK_API const dspark_token * dspark_draft_get_tokens(const struct dspark_draft_context * dctx, int32_t * n_seqs, int32_t * n_draft);
/* [n_seqs][n_draft] confidence of each drafted token, or NULL without a confidence head. */
DSPARK_API const float * dspark_draft_get_confidence(const struct dspark_draft_context * dctx);
/* [n_seqs][n_draft] probability of each drafted token under the distribution it was drawn from
 * (sample only; NULL otherwise): the q of speculative rejection sampling. */
DSPARK_API const float * dspark_draft_get_probabilities(const struct dspark_draft_context * dctx);
/* [n_seqs][n_draft][n_vocab] logits (-inf where a reduced vocab cannot reach), or NULL if not asked for. */
DSPARK_API const float * dspark_draft_get_logits(const struct dspark_draft_context * dctx);

/* ---- sampling ------------------------------------------------------------------------------- */

/* The sampler chain (llama.cpp's order): temperature 0 is greedy (argmax). Otherwise top_k,
 * then top_p and min_p filter on the softmax at temperature 1, then a softmax at the temperature
 * and a draw against one uniform number. 0 / 1.0 / 0.0 turn top_k / top_p / min_p off. */
struct dspark_sampling_params {
    float    temperature; /* default 0 (greedy); must be finite and >= 0: negative, inf and NaN are refused */
    int32_t  top_k;       /* default 0 (off) */
    float    top_p;       /* default 1.0 (off) */
    float    min_p;       /* default 0.0 (off) */
    uint32_t seed;        /* DSPARK_DEFAULT_SEED = random */
};

DSPARK_API struct dspark_sampling_params dspark_sampling_default_params(void);
/* OK, or INVALID_ARGUMENT naming the first bad value (the rules every sampling entry point applies). */
DSPARK_API int32_t dspark_sampling_check(const struct dspark_sampling_params * params);

/* Sample each of n_rows rows of logits [n_rows][n_vocab] with the uniform draws u[n_rows], on the
 * host (in_graph false) or as a ggml graph on the CPU backend (in_graph true). Both run the same
 * chain: they differ only by float rounding, so a draw can differ only when u lies within rounding
 * of a boundary between two tokens' cumulative probabilities. */
DSPARK_API int32_t dspark_sample_rows(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                      const struct dspark_sampling_params * params, bool in_graph, dspark_token * out);
/* The same with a sampler per row (params[n_rows]; NULL = the defaults for every row), an
 * adjustment added to each row's logits first (adjust [n_rows][n_vocab]; NULL = none; -inf bans a
 * token), on the host (device -1) or as one graph on a device (an index of dspark_device_*), and
 * optionally (prob not NULL) the probability of each row's token under the distribution it was
 * drawn from (1 for greedy rows). */
DSPARK_API int32_t dspark_sample_rows_each(const float * logits, int32_t n_rows, int32_t n_vocab, const float * u,
                                           const struct dspark_sampling_params * params, const float * adjust,
                                           int32_t device, dspark_token * out, float * prob);

/* ---- speculative decoding engine --------------------------------------------------------------- */

enum dspark_draft_mode {
    DSPARK_DRAFT_GREEDY_CHAIN  = 0, /* argmax chain; accept by sampling the target and matching (llama.cpp) */
    DSPARK_DRAFT_PROBABILISTIC = 1, /* sample the chain in-graph; accept with min(1, p/q), resample the residual */
};

enum dspark_verify_schedule {
    DSPARK_SCHEDULE_STATIC     = 0, /* verify n_max drafts, cut by p_min */
    DSPARK_SCHEDULE_CONFIDENCE = 1, /* DSpark's prefix scheduler: draft a block as ADAPTIVE does, then keep
                                       the draft positions, by survival probability (the confidences'
                                       product), that raise the expected tokens per verify time most */
    DSPARK_SCHEDULE_ADAPTIVE   = 2, /* per step one block length 0 .. n_max (0: no draft) maximising expected
                                       tokens per ms, from measured draft and verify costs and the running
                                       acceptance of each sequence: shorter blocks as the batch grows */
};

/* Where the target's verify rows are sampled. In the graph only token ids (and, for rejection
 * sampling, p of each drafted token) leave the backend; on the host the logits are read back. */
enum dspark_backend_sampling {
    DSPARK_BACKEND_SAMPLING_AUTO = -1, /* in the graph for verify batches whose sequences are all greedy
                                          (measured faster there), on the host otherwise */
    DSPARK_BACKEND_SAMPLING_OFF  = 0,
    DSPARK_BACKEND_SAMPLING_ON   = 1,
};

struct dspark_spec_params {
    int32_t n_max;            /* draft tokens per step; 0 = the draft's maximum (block_size, or block_size-1
                                 for DFlash and the 1+N layout); larger values are clamped to it */
    int32_t n_min;            /* draft nothing when fewer than this would be verified; default 0 */
    float   p_min;            /* DSpark: cut the block at the first position with confidence < p_min; 0 = off */
    int32_t draft_mode;       /* enum dspark_draft_mode; default GREEDY_CHAIN */
    int32_t schedule;         /* enum dspark_verify_schedule; default STATIC */
    int32_t markov_top_k;     /* DSpark, argmax drafting: bias only the top-k base candidates (0 = exact) */
    int32_t backend_sampling; /* enum dspark_backend_sampling; default AUTO */
};

DSPARK_API struct dspark_spec_params dspark_spec_default_params(void);
/* OK, or INVALID_ARGUMENT naming the first bad setting (the rules dspark_engine_init applies before it
 * looks at the models: ranges and enum values). */
DSPARK_API int32_t dspark_spec_check(const struct dspark_spec_params * params);
/* Draft tokens per verify step the engine takes for this draft and n_max (0 = the most its block
 * layout allows; larger values are clamped), before any context limit: a verify block is this + 1. */
DSPARK_API int32_t dspark_spec_n_draft(const struct dspark_model * draft, int32_t n_max);

enum dspark_seq_status {
    DSPARK_SEQ_IDLE       = 0, /* unknown or removed */
    DSPARK_SEQ_ACTIVE     = 1,
    DSPARK_SEQ_MAX_TOKENS = 2, /* finished: max_tokens generated */
    DSPARK_SEQ_EOG        = 3, /* finished: an end-of-generation token */
    DSPARK_SEQ_STOP       = 4, /* finished: a stop token sequence */
    DSPARK_SEQ_CTX_FULL   = 5, /* finished: the context is full */
};

/* One generation request. Stop sequences are given flattened: n_stop sequences whose lengths are
 * stop_lens[i], back to back in stop_tokens. */
struct dspark_request {
    const dspark_token * prompt;
    int32_t              n_prompt;
    int32_t              max_tokens;   /* <= 0: until end of generation or the context is full */
    const struct dspark_sampling_params * sampling; /* NULL = greedy */
    const dspark_token * stop_tokens;
    const int32_t *      stop_lens;
    int32_t              n_stop;
    bool                 reuse_prefix; /* prompt caching: keep the cells this sequence id already holds of the
                                          prompt's longest prefix (dspark_engine_cached_prefix) and prefill
                                          only the rest; false: prefill all of it */
    /* Issue 24: the request's own sampler fields (all zero = off: the sequence pays nothing for them).
     * The sampler chain sees the ADJUSTED logits: logits + logit_bias, then the penalties, then the
     * constraint's bans (-inf). Penalties follow llama.cpp's: over the last penalty_last_n tokens of
     * prompt + output (each verify row counts the draft tokens before it), a token seen `count` times
     * gets logit > 0 ? logit / repeat : logit * repeat, then -= count * frequency + presence. */
    const struct dspark_logit_bias * logit_bias;  /* token ids in the vocabulary; bias finite or -inf (bans) */
    int32_t              n_logit_bias;
    float                presence_penalty;   /* OpenAI range [-2, 2] */
    float                frequency_penalty;  /* OpenAI range [-2, 2] */
    float                repeat_penalty;     /* > 0; 0 or 1 = off */
    int32_t              penalty_last_n;     /* the penalties' window; 0 = off, -1 = the whole context */
    /* Logprobs of every committed token (dspark_engine_get_logprobs): log of its probability in the
     * distribution it was drawn from (adjusted logits, filters, temperature; a greedy request: the
     * softmax at temperature 1 of the adjusted logits), and the top_logprobs most probable tokens of
     * it (0 .. 20; descending, ties by id). The same with and without a draft. A sequence asking for
     * them makes its verify batch sample on the host. */
    bool                 logprobs;
    int32_t              top_logprobs;
    bool                 prompt_logprobs;    /* also those of prompt tokens 1 .. n-1 at prefill (no prefix reuse) */
    const struct dspark_constraint * constraint;  /* NULL = none; must outlive the sequence */
};

/* One entry of a request's logit bias. */
struct dspark_logit_bias {
    dspark_token token;
    float        bias;  /* added to the token's logit; -inf bans it */
};

/* A grammar behind callbacks (structured output). Masks are over the TARGET's vocabulary,
 * n_words = ceil(n_vocab / 32) uint32 words per row, bit (t % 32) of word t / 32 set = t allowed. */
struct dspark_constraint {
    /* Fill rows 0 .. n_tokens of masks ([n_tokens + 1][n_words]): row i is the state after the
     * committed tokens plus tokens[0 .. i). Row i + 1 is filled only if row i allows tokens[i].
     * Returns the rows filled (1 .. n_tokens + 1), or < 0 on error (the step fails). The engine
     * asks masks(NULL, 0) at prefill and masks(draft, k) before each verify: returning r rows cuts
     * the draft to r - 1 tokens (a drafted token the grammar rejects is never verified). */
    int32_t (*masks)(void * user_data, const dspark_token * tokens, int32_t n_tokens, uint32_t * masks, int32_t n_words);
    /* The tokens the engine committed (prefill's first, then each step's), in order; < 0 = error. */
    int32_t (*commit)(void * user_data, const dspark_token * tokens, int32_t n_tokens);
    void *   user_data;
};

#define DSPARK_MAX_TOP_LOGPROBS 20

#define DSPARK_STATS_MAX_POS 64

/* Counters of one sequence, or of all (seq_id -1). tau = (n_accepted + n_steps) / n_steps is the
 * mean accepted length per verify step counting the target's own token. */
struct dspark_spec_stats {
    int32_t n_prompt;
    int32_t n_cached;                             /* of the prompt, tokens reused from the cache, not prefilled */
    int32_t n_generated;                          /* tokens emitted, the prefill's first token included */
    int32_t n_steps;                              /* verify steps */
    int32_t n_drafted;                            /* draft tokens sent to verification */
    int32_t n_accepted;                           /* of those, accepted */
    int32_t drafted_at[DSPARK_STATS_MAX_POS];     /* per draft position */
    int32_t accepted_at[DSPARK_STATS_MAX_POS];
    double  t_prefill_ms;
    double  t_draft_ms;
    double  t_verify_ms;
    double  t_host_ms;                            /* sampling, acceptance and bookkeeping */
};

struct dspark_engine;

/* Ties a target context and a draft context (NULL: target-only decoding with the same interface).
 * Captures the draft's target layers in the target context. Both contexts must outlive it. */
DSPARK_API struct dspark_engine * dspark_engine_init(struct dspark_context * target, struct dspark_draft_context * draft,
                                                     const struct dspark_spec_params * params);
DSPARK_API void    dspark_engine_free(struct dspark_engine * engine);
/* Tokens that end generation (EOS, EOT, ...). */
DSPARK_API int32_t dspark_engine_set_eog(struct dspark_engine * engine, const dspark_token * ids, int32_t n);
/* The draft tokens per step after clamping n_max to what the draft's layout allows (0 without a draft). */
DSPARK_API int32_t dspark_engine_n_draft(const struct dspark_engine * engine);

/* Start a sequence: prefill its prompt (target and draft) and emit its first token. The sequence id
 * must not be active; its cells are cleared first, but for the reused prefix with reuse_prefix.
 * On failure the sequence id holds no cells. */
DSPARK_API int32_t dspark_engine_add(struct dspark_engine * engine, dspark_seq_id seq_id, const struct dspark_request * request);
/* Prompt caching: how many leading tokens of prompt the cells of seq_id hold, in the target's cache
 * and (with a draft) the draft's, which is what dspark_engine_add with reuse_prefix keeps; at most
 * n_prompt - 1 (the last prompt token is always decoded). Cells record their tokens, so a stale
 * cell never counts. Returns the count, or < 0 on a bad sequence id. */
DSPARK_API int32_t dspark_engine_cached_prefix(const struct dspark_engine * engine, dspark_seq_id seq_id,
                                               const dspark_token * prompt, int32_t n_prompt);
/* One step for every active sequence. Returns the number of sequences still active, or < 0. */
DSPARK_API int32_t dspark_engine_step(struct dspark_engine * engine);
/* Up to max_steps steps, as many dspark_engine_step calls but without returning in between; ends
 * early after a step in which a sequence finished (its slot can take a new request), when no
 * sequence is active, or while a stop is requested (dspark_engine_request_abort). The tokens of
 * all its steps accumulate for dspark_engine_get_tokens. Returns the number of steps run, or < 0
 * when a step failed: the tokens of the steps before it are still there to read. */
DSPARK_API int32_t dspark_engine_run(struct dspark_engine * engine, int32_t max_steps);
/* Tokens the last add/step/run committed for a sequence, and which came from the draft; valid
 * until the next add/step/run. Returns their count. */
DSPARK_API int32_t dspark_engine_get_tokens(const struct dspark_engine * engine, dspark_seq_id seq_id,
                                            const dspark_token ** tokens, const uint8_t ** from_draft);
/* Logprobs of the tokens the last add/step/run committed for seq_id (aligned with dspark_engine_get_tokens),
 * for a request with logprobs: logprob[n], top_ids[n][*top], top_logprobs[n][*top] (*top = the request's
 * top_logprobs); valid until the next add/step/run. Returns n (0 for a request without logprobs), or < 0.
 * Any output pointer may be NULL. */
DSPARK_API int32_t dspark_engine_get_logprobs(const struct dspark_engine * engine, dspark_seq_id seq_id, const float ** logprob,
                                              const dspark_token ** top_ids, const float ** top_logprobs, int32_t * top);
/* Prompt logprobs of a prompt_logprobs request, after add until the sequence is removed: n_prompt - 1
 * entries, for prompt tokens 1 .. n_prompt - 1 (each under the logits of the rows before it, no
 * adjustment, temperature 1), same layout. Returns the count (0 without prompt_logprobs), or < 0. */
DSPARK_API int32_t dspark_engine_get_prompt_logprobs(const struct dspark_engine * engine, dspark_seq_id seq_id, const float ** logprob,
                                                     const dspark_token ** top_ids, const float ** top_logprobs, int32_t * top);
DSPARK_API int32_t dspark_engine_seq_status(const struct dspark_engine * engine, dspark_seq_id seq_id);
DSPARK_API int32_t dspark_engine_get_stats(const struct dspark_engine * engine, dspark_seq_id seq_id, struct dspark_spec_stats * out);
/* Finish a sequence now and free its cells in both caches. */
DSPARK_API int32_t dspark_engine_remove(struct dspark_engine * engine, dspark_seq_id seq_id);
/* Forget a sequence (finished or not) but leave its cells in both caches, for a later request that
 * starts with the same tokens (reuse_prefix); dspark_kv_seq_rm frees them. */
DSPARK_API int32_t dspark_engine_detach(struct dspark_engine * engine, dspark_seq_id seq_id);
/* Called during the computations of add and step (prefill, draft, verify); returning true stops
 * them with DSPARK_STATUS_ABORTED. The engine checks it only where stopping leaves every sequence
 * and both caches as they were before the call, so the engine stays usable. NULL removes it. */
DSPARK_API void    dspark_engine_set_abort_callback(struct dspark_engine * engine, dspark_abort_callback callback, void * user_data);
/* Request (true) or withdraw (false) a stop: while requested, the engine's computations stop as
 * when the abort callback returns true, but nothing is called per graph node. Safe from any thread
 * and from a signal handler; the engine never clears it itself. */
DSPARK_API void    dspark_engine_request_abort(struct dspark_engine * engine, bool requested);

/* @cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* DSPARK_H */
