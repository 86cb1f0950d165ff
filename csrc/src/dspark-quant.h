// Quantizing and dequantizing rows of values by ggml type name (the C API's dspark_quantize and
// friends, which the tests use to write K-quant GGUFs). Throw dspark_error on bad input.
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

// The ggml type named `name` (any case) whose blocks divide rows of n_per_row values; throws otherwise.
ggml_type dspark_type_by_name(const char * name, int64_t n_per_row);

int64_t dspark_quant_bytes(const char * type, int64_t n_rows, int64_t n_per_row);
int64_t dspark_quantize_rows(const char * type, const float * src, void * dst, int64_t n_rows, int64_t n_per_row);
void    dspark_dequantize_values(const char * type, const void * src, size_t src_size, float * dst, int64_t n);
