#include "dspark-quant.h"

#include "dspark-impl.h"

#include "ggml.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <strings.h>

ggml_type dspark_type_by_name(const char * name, int64_t n_per_row) {
    if (name) {
        for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
            const char * tn = ggml_type_name((ggml_type) t);
            if (tn && ggml_get_type_traits((ggml_type) t)->blck_size > 0 && strcasecmp(tn, name) == 0) {
                if (n_per_row % ggml_blck_size((ggml_type) t) != 0) {
                    dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "type %s needs rows of a multiple of %lld values, got %lld",
                                 name, (long long) ggml_blck_size((ggml_type) t), (long long) n_per_row);
                }
                return (ggml_type) t;
            }
        }
    }
    dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "unknown ggml type '%s'", name ? name : "(null)");
}

int64_t dspark_quant_bytes(const char * type, int64_t n_rows, int64_t n_per_row) {
    return (int64_t) ggml_row_size(dspark_type_by_name(type, n_per_row), n_per_row) * n_rows;
}

int64_t dspark_quantize_rows(const char * type, const float * src, void * dst, int64_t n_rows, int64_t n_per_row) {
    const ggml_type t = dspark_type_by_name(type, n_per_row);
    if (!src || !dst || n_rows < 0 || n_per_row <= 0) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "dspark_quantize: bad buffers or sizes");
    }
    // ggml_quantize_chunk asserts on other types; these need no importance matrix
    static const ggml_type ok[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                   GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                                   GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                   GGML_TYPE_IQ4_XS};
    if (std::find(std::begin(ok), std::end(ok), t) == std::end(ok) || ggml_quantize_requires_imatrix(t)) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "quantizing to %s is not supported here", type);
    }
    return (int64_t) ggml_quantize_chunk(t, src, dst, 0, n_rows, n_per_row, nullptr);
}

void dspark_dequantize_values(const char * type, const void * src, size_t src_size, float * dst, int64_t n) {
    const ggml_type t = dspark_type_by_name(type, n);
    if (!src || !dst || n < 0) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "dspark_dequantize: bad buffers or size");
    }
    // integer and f64 types have no to_float in ggml: calling it would jump through null
    const ggml_to_float_t to_float = ggml_get_type_traits(t)->to_float;
    if (t != GGML_TYPE_F32 && !to_float) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "dequantizing %s is not supported (no float conversion)", type);
    }
    const size_t need = ggml_row_size(t, n);
    if (src_size < need) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "dspark_dequantize: %lld %s values need %zu bytes, the source has %zu",
                     (long long) n, type, need, src_size);
    }
    if (t == GGML_TYPE_F32) {
        memcpy(dst, src, sizeof(float) * n);
    } else {
        to_float(src, dst, n);
    }
}
