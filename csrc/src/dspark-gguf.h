// A GGUF file opened with ggml's gguf reader: metadata with typed accessors that name the file
// and key in their errors, and the tensor table (as ggml tensors without data).
#pragma once

#include "ggml.h"
#include "gguf.h"

#include <cstdint>
#include <string>
#include <vector>

struct dspark_gguf {
    std::string    path;
    uint64_t       file_size = 0;
    gguf_context * gguf      = nullptr;
    ggml_context * meta      = nullptr;  // one data-less ggml tensor per GGUF tensor

    explicit dspark_gguf(const std::string & path);  // throws dspark_error
    ~dspark_gguf();
    dspark_gguf(const dspark_gguf &) = delete;
    dspark_gguf & operator=(const dspark_gguf &) = delete;

    // metadata
    int64_t     find_key(const std::string & key) const { return gguf_find_key(gguf, key.c_str()); }
    bool        has_key(const std::string & key) const { return find_key(key) >= 0; }
    std::string get_str(const std::string & key) const;
    int64_t     get_int(const std::string & key) const;  // any integer or bool type
    double      get_float(const std::string & key) const;
    bool        get_bool(const std::string & key) const;
    std::vector<int64_t> get_int_array(const std::string & key) const;
    std::vector<bool>    get_bool_array(const std::string & key) const;
    std::vector<double>  get_float_array(const std::string & key) const;  // F32 or F64 arrays
    // An integer key given once for all layers or as an array of n_layer values (either way, n_layer
    // values come back); `def` when absent, or a BAD_FORMAT error when absent and def < 0.
    std::vector<int> get_int_per_layer(const std::string & key, int n_layer, int64_t def = -1) const;

    // with defaults when the key is absent (a present key of the wrong type is still an error)
    std::string get_str(const std::string & key, const std::string & def) const;
    int64_t     get_int(const std::string & key, int64_t def) const;
    double      get_float(const std::string & key, double def) const;
    bool        get_bool(const std::string & key, bool def) const;

    // tensors
    int64_t       n_tensors() const { return gguf_get_n_tensors(gguf); }
    ggml_tensor * tensor(int64_t i) const;                       // metadata tensor (no data)
    ggml_tensor * find_tensor(const std::string & name) const;  // nullptr if absent
    uint64_t      tensor_file_offset(int64_t i) const;          // absolute offset in the file
    uint64_t      data_offset() const { return gguf_get_data_offset(gguf); }

    [[noreturn]] void fail(int32_t status, const std::string & what) const;

  private:
    void    release();
    int64_t key_or_throw(const std::string & key) const;
};

const char * dspark_gguf_type_name(int32_t type);
