// Inside the blocks kernel (dspark-matmul-blocks.h): what its two instruction-set builds share.
//
// The kernel is built twice, each file with its own instruction flags (csrc/CMakeLists.txt):
// dspark-matmul-blocks-avx512.cpp (AVX-512 VNNI, and AMX-INT8 tiles where the compiler knows
// them) and dspark-matmul-blocks-avx2.cpp (AVX2 + FMA + F16C). dspark-matmul-blocks.cpp, built for
// any x86-64, prepares the columns and sends each call to the build the CPU runs. Both builds take
// the same exact integers and run the same float chain, so they give a row the same bits; each
// packs the weights into its own layout (the same bytes as the plain rows), used only by itself
// (the instruction set is fixed for the life of a process).
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

// A prepared column block: ggml's q8_0 codes of 32 values and what the float steps need.
struct dspark_blocks_column {
    int8_t  qs[32];
    float   d;     // the block's scale
    int32_t sum;   // Σ qs: times the weight type's code offset, taken off the integer
    float   s;     // d · Σ qs: what a weight block's minimum multiplies (q4_1, q5_1)
    int32_t pad;
};
static_assert(sizeof(dspark_blocks_column) == 48, "column block layout");

// The same four calls in each build (dspark-matmul-blocks.h says what they do).
void dspark_blocks_avx512_rows(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                               const dspark_blocks_column * const * cols, float * const * y, int n_cols);
void dspark_blocks_avx512_pack(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows, void * packed);
void dspark_blocks_avx512_rows_packed(ggml_type type, const void * packed, int64_t K, int64_t n_rows,
                                      const dspark_blocks_column * const * cols, float * const * y, int n_cols);

void dspark_blocks_avx2_rows(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                             const dspark_blocks_column * const * cols, float * const * y, int n_cols);
void dspark_blocks_avx2_pack(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows, void * packed);
void dspark_blocks_avx2_rows_packed(ggml_type type, const void * packed, int64_t K, int64_t n_rows,
                                    const dspark_blocks_column * const * cols, float * const * y, int n_cols);

// f(dspark_blocks_tag<W>{}) with W a build's struct for the weight type.
template <class W> struct dspark_blocks_tag { using type = W; };

template <class Q8_0, class Q4_0, class Q4_1, class Q5_0, class Q5_1, class F>
void dspark_blocks_with_type(ggml_type type, F && f) {
    switch (type) {
        case GGML_TYPE_Q8_0: f(dspark_blocks_tag<Q8_0>{}); break;
        case GGML_TYPE_Q4_0: f(dspark_blocks_tag<Q4_0>{}); break;
        case GGML_TYPE_Q4_1: f(dspark_blocks_tag<Q4_1>{}); break;
        case GGML_TYPE_Q5_0: f(dspark_blocks_tag<Q5_0>{}); break;
        case GGML_TYPE_Q5_1: f(dspark_blocks_tag<Q5_1>{}); break;
        default: GGML_ABORT("no blocks kernel for %s", ggml_type_name(type));
    }
}
