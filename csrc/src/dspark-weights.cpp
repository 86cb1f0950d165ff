#include "dspark-weights.h"

#include "dspark-backend.h"
#include "dspark-impl.h"
#include "dspark-matmul.h"
#include "dspark-matmul-blocks.h"

#include "ggml-alloc.h"

#include <algorithm>
#include <cstring>

static std::string shape_str(const int64_t * ne, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) {
        s += (i ? ", " : "") + std::to_string(ne[i]);
    }
    return s + "]";
}

dspark_weights::dspark_weights(const std::string & path) : file(new dspark_gguf(path)) {}

dspark_weights::~dspark_weights() {
    for (ggml_backend_buffer_t b : buffers) {
        dspark_matmul_hold_packed(b, false);
        ggml_backend_buffer_free(b);
    }
    if (copies_ctx) {
        ggml_free(copies_ctx);
    }
}


// Types a matmul weight or embedding table may have: those ggml converts to float (and so
// multiplies and gathers); integer types and f64 have no conversion.
static bool is_matrix_type(ggml_type t) {
    if (t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16 && !ggml_is_quantized(t)) {
        return false;
    }
    return t == GGML_TYPE_F32 || ggml_get_type_traits(t)->to_float != nullptr;
}

void dspark_weights::check_type(const ggml_tensor * t, const std::string & name, int rank, ggml_type type) const {
    const char * role = nullptr;
    if (type != GGML_TYPE_COUNT) {
        role = t->type == type ? nullptr : ggml_type_name(type);
    } else if (rank <= 1) {
        role = t->type == GGML_TYPE_F32 ? nullptr : "f32 (a norm weight, bias or scale)";
    } else {
        role = is_matrix_type(t->type) ? nullptr : "f32, f16, bf16 or a quantized type (a weight matrix)";
    }
    if (role) {
        file->fail(DSPARK_STATUS_BAD_FORMAT, "tensor '" + name + "' has type " + ggml_type_name(t->type) + ", expected " + role);
    }
}

ggml_tensor * dspark_weights::opt(const std::string & name, std::initializer_list<int64_t> ne, ggml_type type) {
    ggml_tensor * t = file->find_tensor(name);
    if (!t) {
        return nullptr;
    }
    int64_t want[GGML_MAX_DIMS] = {1, 1, 1, 1};
    int n = 0;
    for (int64_t v : ne) {
        want[n++] = v;
    }
    for (int i = 0; i < GGML_MAX_DIMS; ++i) {
        if (t->ne[i] != want[i]) {
            file->fail(DSPARK_STATUS_BAD_FORMAT, "tensor '" + name + "' has shape " +
                                                     shape_str(t->ne, ggml_n_dims(t)) + ", expected " +
                                                     shape_str(want, n));
        }
    }
    check_type(t, name, n, type);
    used.insert(name);
    return t;
}

ggml_tensor * dspark_weights::req(const std::string & name, std::initializer_list<int64_t> ne, ggml_type type) {
    ggml_tensor * t = opt(name, ne, type);
    if (!t) {
        file->fail(DSPARK_STATUS_BAD_FORMAT, "missing required tensor '" + name + "'");
    }
    return t;
}

void dspark_weights::warn_unused() const {
    for (int64_t i = 0; i < file->n_tensors(); ++i) {
        const char * name = ggml_get_name(file->tensor(i));
        if (!used.count(name)) {
            DSPARK_LOG_WARN("%s: tensor '%s' is not used by this architecture", file->path.c_str(), name);
        }
    }
}

// The CPU backend's extra buffer type that repacks weights (null if this build has none).
static ggml_backend_buffer_type_t cpu_repack_buft(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) {
        return nullptr;
    }
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; ++b) {
        if (strstr(ggml_backend_buft_name(*b), "REPACK")) {
            return *b;
        }
    }
    return nullptr;
}

// Would a matmul with weight w run from the repack buffer type? (asks the backend, as llama.cpp does)
// 2-D weights go through mul_mat, 3-D expert stacks through mul_mat_id. A layout whose kernels
// compute a row differently in a batch of one than in larger batches is not used (dspark-matmul.h).
static bool repack_supports(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_tensor * w) {
    ggml_init_params ip = { /*.mem_size =*/ 3 * ggml_tensor_overhead(), nullptr, /*.no_alloc =*/ true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * op;
    if (ggml_n_dims(w) == 3) {
        ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w->ne[0], 2, 8);
        ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 8);
        op = ggml_mul_mat_id(ctx, w, x, ids);
    } else {
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 8);
        op = ggml_mul_mat(ctx, w, x);
    }
    ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
    ggml_backend_buffer_t saved = w->buffer;
    w->buffer = dummy;
    const bool ok = ggml_backend_dev_supports_op(dev, op);
    w->buffer = saved;
    ggml_backend_buffer_free(dummy);
    ggml_free(ctx);
    if (!ok) {
        return false;  // (and not probed: the buffer type cannot hold this one)
    }
    const dspark_mm_route route = dspark_matmul_plan(buft, w->type, w->ne[0], w->ne[1]).route;
    return route == dspark_mm_route::ggml || (route == dspark_mm_route::quads && ggml_n_dims(w) <= 2);
}

// Copy the chosen tensors into one repack buffer (the backend converts them on upload).
void dspark_weights::load_repacked(ggml_backend_buffer_type_t buft, const std::vector<ggml_tensor *> & tensors) {
    size_t size = 0;
    const size_t align = ggml_backend_buft_get_alignment(buft);
    for (ggml_tensor * t : tensors) {
        size += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
    }
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, size);
    if (!buf) {
        file->fail(DSPARK_STATUS_OUT_OF_MEMORY, "not enough memory to repack the weights");
    }
    fill_buffer(buf, tensors, " for repacking");
    n_repacked += tensors.size();
}

// Bytes of tensor t (2-D, or 3-D experts) in the packed layout.
static size_t packed_bytes(const ggml_tensor * t) {
    return dspark_blocks_packed_size(t->type, t->ne[0], t->ne[1]) * (size_t) t->ne[2];
}

// t's plain bytes `src` packed at `dst` (packed_bytes(t)), expert by expert.
static void pack_tensor(const ggml_tensor * t, const char * src, char * dst) {
    const size_t expert_bytes = dspark_blocks_packed_size(t->type, t->ne[0], t->ne[1]);
    for (int64_t e = 0; e < t->ne[2]; ++e) {
        dspark_blocks_pack(t->type, src + e * t->nb[2], t->nb[1], t->ne[0], t->ne[1], dst + e * expert_bytes);
    }
}

ggml_backend_buffer_t dspark_weights::packed_buffer(ggml_backend_dev_t device, const std::vector<ggml_tensor *> & tensors) {
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(device);
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t size = 0;
    for (ggml_tensor * t : tensors) {
        size += GGML_PAD(packed_bytes(t), align);
    }
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, size);
    if (!buf) {
        return nullptr;
    }
    buffers.push_back(buf);
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    char * at = (char *) ggml_backend_buffer_get_base(buf);
    for (ggml_tensor * t : tensors) {
        if (ggml_backend_tensor_alloc(buf, t, at) != GGML_STATUS_SUCCESS) {
            file->fail(DSPARK_STATUS_INTERNAL, std::string("could not place tensor '") + ggml_get_name(t) + "' packed");
        }
        at += GGML_PAD(packed_bytes(t), align);
    }
    dspark_matmul_hold_packed(buf, true);
    n_repacked += tensors.size();
    return buf;
}

bool dspark_weights::load_packed(ggml_backend_dev_t device, const std::vector<ggml_tensor *> & tensors) {
    if (!packed_buffer(device, tensors)) {
        return false;
    }
    for (ggml_tensor * t : tensors) {
        pack_tensor(t, (const char *) map->addr + file->tensor_file_offset(gguf_find_tensor(file->gguf, ggml_get_name(t))),
                    (char *) t->data);
    }
    return true;
}

void dspark_weights::fill_buffer(ggml_backend_buffer_t buf, const std::vector<ggml_tensor *> & tensors, const char * purpose) {
    buffers.push_back(buf);
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_tallocr talloc = ggml_tallocr_new(buf);
    for (ggml_tensor * t : tensors) {
        if (ggml_tallocr_alloc(&talloc, t) != GGML_STATUS_SUCCESS) {
            file->fail(DSPARK_STATUS_INTERNAL, std::string("could not place tensor '") + ggml_get_name(t) + "'" + purpose);
        }
        const int64_t i = gguf_find_tensor(file->gguf, ggml_get_name(t));
        ggml_backend_tensor_set(t, (const char *) map->addr + file->tensor_file_offset(i), 0, ggml_nbytes(t));
    }
}

// Computing from the mapping needs the data section at an address the device's buffers allow
// (ggml asserts it): a small or odd general.alignment can move it off that boundary.
void dspark_weights::check_mmap_alignment(ggml_backend_dev_t device) const {
    const size_t align = ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(device));
    if (file->data_offset() % align != 0) {
        file->fail(DSPARK_STATUS_BAD_FORMAT, "the tensor data starts at byte " + std::to_string(file->data_offset()) +
                                                 ", not a multiple of " + std::to_string(align) + " (general.alignment " +
                                                 std::to_string(gguf_get_alignment(file->gguf)) +
                                                 "): it cannot be memory-mapped; load it with use_mmap off");
    }
}

// "blk.12.attn_q.weight" -> 12; -1 for tensors outside the repeating layers.
static int layer_of(const char * name) {
    if (strncmp(name, "blk.", 4) != 0) {
        return -1;
    }
    char * end = nullptr;
    const long il = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' ? (int) il : -1;
}

ggml_backend_dev_t dspark_placement::of(const char * tensor_name) const {
    const int il = layer_of(tensor_name);
    return il >= 0 && il < (int) layers.size() && layers[il] ? layers[il] : main;
}

std::vector<ggml_backend_dev_t> dspark_placement::devices() const {
    std::vector<ggml_backend_dev_t> out = { main };
    for (ggml_backend_dev_t d : layers) {
        if (d && std::find(out.begin(), out.end(), d) == out.end()) {
            out.push_back(d);
        }
    }
    return out;
}

void dspark_weights::load(const dspark_placement & where, bool use_mmap, bool repack, const std::set<std::string> & gathered) {
    placement = where;
    dev = where.main;
    devices = where.devices();
    n_bytes = 0;
    n_params = 0;
    for (int64_t i = 0; i < file->n_tensors(); ++i) {
        ggml_tensor * t = file->tensor(i);
        n_bytes += ggml_nbytes(t);
        n_params += (uint64_t) ggml_nelements(t);
    }
    if (file->n_tensors() == 0) {
        return;
    }
    for (ggml_backend_dev_t d : devices) {
        ggml_backend_dev_props props;
        ggml_backend_dev_get_props(d, &props);
        if (use_mmap && props.caps.buffer_from_host_ptr) {
            check_mmap_alignment(d);  // before anything is allocated
        }
    }
    map.reset(new dspark_mmap(file->path));
    bool mapped = false;
    for (ggml_backend_dev_t d : devices) {
        std::vector<ggml_tensor *> group;
        for (int64_t i = 0; i < file->n_tensors(); ++i) {
            if (where.of(ggml_get_name(file->tensor(i))) == d) {
                group.push_back(file->tensor(i));
            }
        }
        mapped = load_on(d, group, use_mmap, repack, gathered) || mapped;
    }
    if (!mapped) {
        map.reset();  // the data now lives in the buffers
    }
}

// Place one device's tensors; true when they compute from the mapping (which must then stay).
bool dspark_weights::load_on(ggml_backend_dev_t device, const std::vector<ggml_tensor *> & tensors, bool use_mmap,
                             bool repack, const std::set<std::string> & gathered) {
    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(device, &props);
    const bool from_map = use_mmap && props.caps.buffer_from_host_ptr;  // compute from the mapping

    std::vector<ggml_tensor *> rest;
    std::vector<ggml_tensor *> repacked, packed;
    ggml_backend_buffer_type_t rbuft = repack && dspark_device_is_cpu(device) ? cpu_repack_buft(device) : nullptr;
    repack_enabled = repack_enabled || repack;
    for (ggml_tensor * t : tensors) {
        const int nd = ggml_n_dims(t);
        const bool matmuls_only = (nd == 2 || nd == 3) && !gathered.count(ggml_get_name(t));
        if (repack && matmuls_only && dspark_matmul_packs(device, t)) {
            packed.push_back(t);
            continue;
        }
        const bool r = rbuft && matmuls_only && repack_supports(device, rbuft, t);
        (r ? repacked : rest).push_back(t);
    }
    if (rbuft) {
        repack_buft = rbuft;
    }
    if (!repacked.empty()) {
        load_repacked(rbuft, repacked);
    }
    if (!packed.empty() && !load_packed(device, packed)) {
        rest.insert(rest.end(), packed.begin(), packed.end());  // no memory for a copy: the plain layout works too
    }
    if (rest.empty()) {
        return false;
    }
    if (from_map) {
        // Compute straight from the mapped file: one host buffer over the data section.
        char * base = (char *) map->addr + file->data_offset();
        const size_t size = map->size - file->data_offset();
        size_t max_tensor = 0;
        for (ggml_tensor * t : rest) {
            max_tensor = std::max(max_tensor, ggml_nbytes(t));
        }
        ggml_backend_buffer_t buf = ggml_backend_dev_buffer_from_host_ptr(device, base, size, max_tensor);
        if (!buf) {
            file->fail(DSPARK_STATUS_OUT_OF_MEMORY, "could not map the weights on device " +
                                                        std::string(ggml_backend_dev_name(device)));
        }
        buffers.push_back(buf);
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        for (ggml_tensor * t : rest) {
            const int64_t i = gguf_find_tensor(file->gguf, ggml_get_name(t));
            const uint64_t off = file->tensor_file_offset(i) - file->data_offset();
            if (ggml_backend_tensor_alloc(buf, t, base + off) != GGML_STATUS_SUCCESS) {
                file->fail(DSPARK_STATUS_INTERNAL, std::string("could not place tensor '") + ggml_get_name(t) + "'");
            }
        }
        return true;
    }

    // Copy into a device buffer.
    size_t size = 0;
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(device);
    const size_t align = ggml_backend_buft_get_alignment(buft);
    uint64_t bytes = 0;
    for (ggml_tensor * t : rest) {
        size += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
        bytes += ggml_nbytes(t);
    }
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, std::max<size_t>(size, 1));
    if (!buf) {
        file->fail(DSPARK_STATUS_OUT_OF_MEMORY, "not enough memory for the weights (" + std::to_string(bytes >> 20) +
                                                    " MiB) on device " + ggml_backend_dev_name(device));
    }
    fill_buffer(buf, rest, "");
    return false;
}

ggml_tensor * dspark_weights::repacked_copy(const std::string & name) {
    ggml_tensor * t = file->find_tensor(name);
    if (!t || !t->buffer || !repack_enabled || !dspark_device_is_cpu(dev)) {
        return nullptr;
    }
    const bool pack = dspark_matmul_packs(dev, t);
    if (!pack && (!repack_buft || !repack_supports(dev, repack_buft, t))) {
        return nullptr;
    }
    if (!copies_ctx) {
        ggml_init_params ip = { /*.mem_size =*/ 8 * ggml_tensor_overhead(), nullptr, /*.no_alloc =*/ true };
        copies_ctx = ggml_init(ip);
    }
    ggml_tensor * copy = ggml_dup_tensor(copies_ctx, t);
    ggml_format_name(copy, "%s (repacked copy)", name.c_str());
    std::vector<char> plain(ggml_nbytes(t));  // from the tensor (the file may no longer be mapped)
    ggml_backend_tensor_get(t, plain.data(), 0, plain.size());
    if (pack) {
        if (!packed_buffer(dev, {copy})) {
            return nullptr;  // the plain tensor still works
        }
        pack_tensor(copy, plain.data(), (char *) copy->data);
        return copy;
    }
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(repack_buft, ggml_backend_buft_get_alloc_size(repack_buft, copy));
    if (!buf) {
        return nullptr;
    }
    buffers.push_back(buf);
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_tallocr talloc = ggml_tallocr_new(buf);
    if (ggml_tallocr_alloc(&talloc, copy) != GGML_STATUS_SUCCESS) {
        return nullptr;
    }
    ggml_backend_tensor_set(copy, plain.data(), 0, plain.size());
    n_repacked++;
    return copy;
}
