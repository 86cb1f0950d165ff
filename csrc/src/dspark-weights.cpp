#include "dspark-weights.h"

#include "dspark-backend.h"
#include "dspark-impl.h"

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
        ggml_backend_buffer_free(b);
    }
}

ggml_tensor * dspark_weights::opt(const std::string & name, std::initializer_list<int64_t> ne) {
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
    used.insert(name);
    return t;
}

ggml_tensor * dspark_weights::req(const std::string & name, std::initializer_list<int64_t> ne) {
    ggml_tensor * t = opt(name, ne);
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

void dspark_weights::load(ggml_backend_dev_t device, bool use_mmap) {
    dev = device;
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
    map.reset(new dspark_mmap(file->path));

    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(dev, &props);
    if (use_mmap && props.caps.buffer_from_host_ptr) {
        // Compute straight from the mapped file: one host buffer over the data section.
        char * base = (char *) map->addr + file->data_offset();
        const size_t size = map->size - file->data_offset();
        size_t max_tensor = 0;
        for (int64_t i = 0; i < file->n_tensors(); ++i) {
            max_tensor = std::max(max_tensor, ggml_nbytes(file->tensor(i)));
        }
        ggml_backend_buffer_t buf = ggml_backend_dev_buffer_from_host_ptr(dev, base, size, max_tensor);
        if (!buf) {
            file->fail(DSPARK_STATUS_OUT_OF_MEMORY, "could not map the weights on device " +
                                                        std::string(ggml_backend_dev_name(dev)));
        }
        buffers.push_back(buf);
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        for (int64_t i = 0; i < file->n_tensors(); ++i) {
            ggml_tensor * t = file->tensor(i);
            const uint64_t off = file->tensor_file_offset(i) - file->data_offset();
            if (ggml_backend_tensor_alloc(buf, t, base + off) != GGML_STATUS_SUCCESS) {
                file->fail(DSPARK_STATUS_INTERNAL, std::string("could not place tensor '") + ggml_get_name(t) + "'");
            }
        }
        return;
    }

    // Copy into a device buffer.
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(file->meta, buft);
    if (!buf) {
        file->fail(DSPARK_STATUS_OUT_OF_MEMORY, "not enough memory for the weights (" +
                                                    std::to_string(n_bytes >> 20) + " MiB) on device " +
                                                    ggml_backend_dev_name(dev));
    }
    buffers.push_back(buf);
    ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int64_t i = 0; i < file->n_tensors(); ++i) {
        ggml_tensor * t = file->tensor(i);
        ggml_backend_tensor_set(t, (const char *) map->addr + file->tensor_file_offset(i), 0, ggml_nbytes(t));
    }
    map.reset();  // the data now lives on the device
}
