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

struct dspark_weights {
    std::unique_ptr<dspark_gguf> file;
    std::unique_ptr<dspark_mmap> map;
    ggml_backend_dev_t           dev = nullptr;
    std::vector<ggml_backend_buffer_t> buffers;
    uint64_t n_bytes  = 0;
    uint64_t n_params = 0;

    explicit dspark_weights(const std::string & path);  // opens and validates the file only
    ~dspark_weights();
    dspark_weights(const dspark_weights &) = delete;
    dspark_weights & operator=(const dspark_weights &) = delete;

    // A required tensor with this ggml shape (trailing dims may be omitted); throws otherwise.
    ggml_tensor * req(const std::string & name, std::initializer_list<int64_t> ne);
    // The same, but nullptr when the tensor is absent.
    ggml_tensor * opt(const std::string & name, std::initializer_list<int64_t> ne);

    // Warn about tensors the architecture never asked for (a sign of a mismatched file).
    void warn_unused() const;

    // Place every tensor of the file on the device (call after all lookups succeeded).
    void load(ggml_backend_dev_t dev, bool use_mmap);

  private:
    std::set<std::string> used;
};
