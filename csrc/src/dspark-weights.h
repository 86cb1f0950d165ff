// The tensors of one GGUF file, placed on a device: memory-mapped with no copy when the device can
// compute from host memory (the CPU), uploaded into a device buffer otherwise. Lookups check that
// a tensor exists and has the shape the architecture expects, naming the file and tensor if not.
#pragma once

#include "dspark-gguf.h"
#include "dspark-mmap.h"

#include "ggml-backend.h"

#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <vector>

// Where a model's tensors go: the repeating layers' (blk.N.*) to layers[N] where that is set, all
// others (embeddings, final norm, head) to `main`.
struct dspark_placement {
    ggml_backend_dev_t              main = nullptr;
    std::vector<ggml_backend_dev_t> layers;

    ggml_backend_dev_t              of(const char * tensor_name) const;
    std::vector<ggml_backend_dev_t> devices() const;  // main first, each once
};

struct dspark_weights {
    std::unique_ptr<dspark_gguf> file;
    std::unique_ptr<dspark_mmap> map;
    ggml_backend_dev_t           dev = nullptr;  // the placement's main device
    std::vector<ggml_backend_dev_t> devices;    // every device holding some tensor, main first
    dspark_placement             placement;
    std::vector<ggml_backend_buffer_t> buffers;
    uint64_t n_bytes  = 0;
    uint64_t n_params = 0;

    explicit dspark_weights(const std::string & path);  // opens and validates the file only
    ~dspark_weights();
    dspark_weights(const dspark_weights &) = delete;
    dspark_weights & operator=(const dspark_weights &) = delete;

    // A required tensor with this ggml shape (trailing dims may be omitted); throws otherwise.
    // The type is checked too, by the role the shape implies (a bad type would abort inside a
    // ggml op later): a 1-D tensor (norm weight, bias, scale) feeds elementwise ops with F32
    // activations and must be F32; a matrix feeds matmuls and row gathers and must be F32, F16,
    // BF16 or a quantized type. `type` demands one exact type instead (e.g. I64 ids).
    ggml_tensor * req(const std::string & name, std::initializer_list<int64_t> ne, ggml_type type = GGML_TYPE_COUNT);
    // The same, but nullptr when the tensor is absent.
    ggml_tensor * opt(const std::string & name, std::initializer_list<int64_t> ne, ggml_type type = GGML_TYPE_COUNT);

    // Warn about tensors the architecture never asked for (a sign of a mismatched file).
    void warn_unused() const;

    // Place every tensor of the file on its device (call after all lookups succeeded). On the CPU
    // with `repack`, matmul weights the CPU backend can repack into a faster layout (Q4_0, Q4_K,
    // IQ4_NL on AVX2, ...) are copied into its repack buffer, as llama.cpp does; `gathered` names
    // tensors read by row lookups (embeddings), which must keep the plain layout.
    // With `repack`, weights of the blocks route (dspark-matmul.h: q8_0, q4_0, q4_1, q5_0, q5_1 on
    // AVX-512 VNNI) are packed into its layout instead, in a buffer of their own.
    void load(const dspark_placement & placement, bool use_mmap, bool repack, const std::set<std::string> & gathered);
    size_t n_repacked = 0;  // by the CPU backend or packed by us

    // After load: a repacked (or packed) copy of a gathered tensor for its matmuls (a tied
    // embedding table that is also the lm head), when the CPU repacks its type; null otherwise
    // (use the tensor itself). llama.cpp duplicates such a tensor the same way.
    ggml_tensor * repacked_copy(const std::string & name);

  private:
    std::set<std::string> used;
    ggml_backend_buffer_type_t repack_buft = nullptr;  // the CPU's, when load() repacked
    ggml_context *             copies_ctx  = nullptr;  // tensors of repacked_copy()
    void check_type(const ggml_tensor * t, const std::string & name, int rank, ggml_type type) const;
    void check_mmap_alignment(ggml_backend_dev_t device) const;
    bool load_on(ggml_backend_dev_t device, const std::vector<ggml_tensor *> & tensors, bool use_mmap, bool repack,
                 const std::set<std::string> & gathered);
    void load_repacked(ggml_backend_buffer_type_t buft, const std::vector<ggml_tensor *> & tensors);
    // Place the tensors in one new buffer of `device` in the blocks route's packed layout (false:
    // no memory for it): packed_buffer places them, load_packed also packs their file data.
    ggml_backend_buffer_t packed_buffer(ggml_backend_dev_t device, const std::vector<ggml_tensor *> & tensors);
    bool load_packed(ggml_backend_dev_t device, const std::vector<ggml_tensor *> & tensors);
    bool repack_enabled = false;
    // Keep buf (a weights buffer) and copy the tensors' file data into it, placed one after another.
    void fill_buffer(ggml_backend_buffer_t buf, const std::vector<ggml_tensor *> & tensors, const char * purpose);
};
