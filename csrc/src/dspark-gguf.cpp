#include "dspark-gguf.h"

#include "dspark-impl.h"

#include <sys/stat.h>

#include <cstdio>

static bool is_int_type(enum gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
        case GGUF_TYPE_BOOL:
            return true;
        default:
            return false;
    }
}

static int64_t read_int_at(const void * data, enum gguf_type t, size_t i) {
    switch (t) {
        case GGUF_TYPE_UINT8:  return ((const uint8_t  *) data)[i];
        case GGUF_TYPE_INT8:   return ((const int8_t   *) data)[i];
        case GGUF_TYPE_UINT16: return ((const uint16_t *) data)[i];
        case GGUF_TYPE_INT16:  return ((const int16_t  *) data)[i];
        case GGUF_TYPE_UINT32: return ((const uint32_t *) data)[i];
        case GGUF_TYPE_INT32:  return ((const int32_t  *) data)[i];
        case GGUF_TYPE_UINT64: return (int64_t) ((const uint64_t *) data)[i];
        case GGUF_TYPE_INT64:  return ((const int64_t  *) data)[i];
        case GGUF_TYPE_BOOL:   return ((const int8_t   *) data)[i] != 0;
        default:               return 0;
    }
}

dspark_gguf::dspark_gguf(const std::string & path_) : path(path_) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        dspark_throw(DSPARK_STATUS_IO, "%s: cannot open file (no such file or not readable)", path.c_str());
    }
    if (!S_ISREG(st.st_mode)) {
        dspark_throw(DSPARK_STATUS_IO, "%s: not a regular file", path.c_str());
    }
    file_size = (uint64_t) st.st_size;
    if (FILE * f = fopen(path.c_str(), "rb")) {
        unsigned char head[8] = {0};
        const size_t n = fread(head, 1, 8, f);
        fclose(f);
        if (n < 4 || head[0] != 'G' || head[1] != 'G' || head[2] != 'U' || head[3] != 'F') {
            dspark_throw(DSPARK_STATUS_BAD_FORMAT, "%s: not a GGUF file (bad magic)", path.c_str());
        }
        // A GGUF written for a big-endian host stores its version word (and every number) the
        // other way round; ggml reads little-endian only, as llama.cpp does.
        const uint32_t version_be = (uint32_t) head[4] << 24 | (uint32_t) head[5] << 16 | (uint32_t) head[6] << 8 | head[7];
        if (n == 8 && version_be >= 1 && version_be <= 3) {
            dspark_throw(DSPARK_STATUS_BAD_FORMAT,
                         "%s: a big-endian GGUF file (version %u); only little-endian files are read "
                         "(gguf-py's gguf_convert_endian converts it)", path.c_str(), version_be);
        }
    } else {
        dspark_throw(DSPARK_STATUS_IO, "%s: cannot open file for reading", path.c_str());
    }

    dspark_take_ggml_error();
    gguf_init_params params = { /*.no_alloc =*/ true, /*.ctx =*/ &meta };
    gguf = gguf_init_from_file(path.c_str(), params);
    if (!gguf) {
        const std::string why = dspark_take_ggml_error();
        dspark_throw(DSPARK_STATUS_BAD_FORMAT, "%s: invalid or truncated GGUF file%s%s", path.c_str(),
                     why.empty() ? "" : ": ", why.c_str());
    }
    // gguf does not read tensor data here: make sure every tensor lies inside the file, so that a
    // truncated file is refused now rather than read out of bounds later.
    for (int64_t i = 0; i < n_tensors(); ++i) {
        const uint64_t end = tensor_file_offset(i) + gguf_get_tensor_size(gguf, i);
        if (end > file_size) {
            const std::string name = gguf_get_tensor_name(gguf, i);
            release();  // the destructor does not run when a constructor throws
            dspark_throw(DSPARK_STATUS_BAD_FORMAT,
                         "%s: truncated file: tensor '%s' ends at byte %llu but the file has %llu bytes",
                         path.c_str(), name.c_str(), (unsigned long long) end, (unsigned long long) file_size);
        }
    }
}

void dspark_gguf::release() {
    if (meta) {
        ggml_free(meta);
        meta = nullptr;
    }
    if (gguf) {
        gguf_free(gguf);
        gguf = nullptr;
    }
}

dspark_gguf::~dspark_gguf() {
    release();
}

void dspark_gguf::fail(int32_t status, const std::string & what) const {
    dspark_throw(status, "%s: %s", path.c_str(), what.c_str());
}

int64_t dspark_gguf::key_or_throw(const std::string & key) const {
    const int64_t i = find_key(key);
    if (i < 0) {
        fail(DSPARK_STATUS_BAD_FORMAT, "missing required key '" + key + "'");
    }
    return i;
}

std::string dspark_gguf::get_str(const std::string & key) const {
    const int64_t i = key_or_throw(key);
    if (gguf_get_kv_type(gguf, i) != GGUF_TYPE_STRING) {
        fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' should be a string but is " +
                                           gguf_type_name(gguf_get_kv_type(gguf, i)));
    }
    return gguf_get_val_str(gguf, i);
}

int64_t dspark_gguf::get_int(const std::string & key) const {
    const int64_t i = key_or_throw(key);
    const enum gguf_type t = gguf_get_kv_type(gguf, i);
    if (!is_int_type(t)) {
        fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' should be an integer but is " + gguf_type_name(t));
    }
    return read_int_at(gguf_get_val_data(gguf, i), t, 0);
}

double dspark_gguf::get_float(const std::string & key) const {
    const int64_t i = key_or_throw(key);
    switch (gguf_get_kv_type(gguf, i)) {
        case GGUF_TYPE_FLOAT32: return gguf_get_val_f32(gguf, i);
        case GGUF_TYPE_FLOAT64: return gguf_get_val_f64(gguf, i);
        default: break;
    }
    const enum gguf_type t = gguf_get_kv_type(gguf, i);
    if (is_int_type(t) && t != GGUF_TYPE_BOOL) {
        return (double) read_int_at(gguf_get_val_data(gguf, i), t, 0);
    }
    fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' should be a number but is " + gguf_type_name(t));
}

bool dspark_gguf::get_bool(const std::string & key) const {
    const int64_t i = key_or_throw(key);
    if (gguf_get_kv_type(gguf, i) != GGUF_TYPE_BOOL) {
        fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' should be a bool but is " +
                                           gguf_type_name(gguf_get_kv_type(gguf, i)));
    }
    return gguf_get_val_bool(gguf, i);
}

std::vector<int64_t> dspark_gguf::get_int_array(const std::string & key) const {
    const int64_t i = key_or_throw(key);
    const enum gguf_type at = gguf_get_arr_type(gguf, i);
    if (gguf_get_kv_type(gguf, i) != GGUF_TYPE_ARRAY || !is_int_type(at)) {
        fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' should be an array of integers");
    }
    std::vector<int64_t> out(gguf_get_arr_n(gguf, i));
    const void * data = gguf_get_arr_data(gguf, i);
    for (size_t j = 0; j < out.size(); ++j) {
        out[j] = read_int_at(data, at, j);
    }
    return out;
}

std::vector<double> dspark_gguf::get_float_array(const std::string & key) const {
    const int64_t i = key_or_throw(key);
    const enum gguf_type at = gguf_get_arr_type(gguf, i);
    if (gguf_get_kv_type(gguf, i) != GGUF_TYPE_ARRAY || (at != GGUF_TYPE_FLOAT32 && at != GGUF_TYPE_FLOAT64)) {
        fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' should be an array of floats");
    }
    std::vector<double> out(gguf_get_arr_n(gguf, i));
    const void * data = gguf_get_arr_data(gguf, i);
    for (size_t j = 0; j < out.size(); ++j) {
        out[j] = at == GGUF_TYPE_FLOAT32 ? ((const float *) data)[j] : ((const double *) data)[j];
    }
    return out;
}

std::vector<bool> dspark_gguf::get_bool_array(const std::string & key) const {
    std::vector<int64_t> v = get_int_array(key);
    return std::vector<bool>(v.begin(), v.end());
}

std::vector<int> dspark_gguf::get_int_per_layer(const std::string & key, int n_layer, int64_t def) const {
    if (!has_key(key) && def >= 0) {
        return std::vector<int>(n_layer, (int) def);
    }
    const int64_t i = key_or_throw(key);
    if (gguf_get_kv_type(gguf, i) != GGUF_TYPE_ARRAY) {
        return std::vector<int>(n_layer, (int) get_int(key));
    }
    const std::vector<int64_t> v = get_int_array(key);
    if ((int64_t) v.size() != n_layer) {
        fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' has " + std::to_string(v.size()) + " values for " +
             std::to_string(n_layer) + " layers");
    }
    std::vector<int> out(n_layer);
    for (int il = 0; il < n_layer; ++il) {
        if (v[il] < INT32_MIN || v[il] > INT32_MAX) {
            fail(DSPARK_STATUS_BAD_FORMAT, "key '" + key + "' holds a value out of range");
        }
        out[il] = (int) v[il];
    }
    return out;
}

std::string dspark_gguf::get_str(const std::string & key, const std::string & def) const {
    return has_key(key) ? get_str(key) : def;
}
int64_t dspark_gguf::get_int(const std::string & key, int64_t def) const {
    return has_key(key) ? get_int(key) : def;
}
double dspark_gguf::get_float(const std::string & key, double def) const {
    return has_key(key) ? get_float(key) : def;
}
bool dspark_gguf::get_bool(const std::string & key, bool def) const {
    return has_key(key) ? get_bool(key) : def;
}

ggml_tensor * dspark_gguf::tensor(int64_t i) const {
    return ggml_get_tensor(meta, gguf_get_tensor_name(gguf, i));
}

ggml_tensor * dspark_gguf::find_tensor(const std::string & name) const {
    return gguf_find_tensor(gguf, name.c_str()) >= 0 ? ggml_get_tensor(meta, name.c_str()) : nullptr;
}

uint64_t dspark_gguf::tensor_file_offset(int64_t i) const {
    return gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, i);
}

const char * dspark_gguf_type_name(int32_t type) {
    return gguf_type_name((enum gguf_type) type);
}
