// Many columns at once through weights of ggml's 32-value block types (q8_0, q4_0, q4_1, q5_0,
// q5_1) on x86-64 CPUs with AVX2 or AVX-512 VNNI: the kernel of the `blocks` route (dspark-matmul.h).
//
// The arithmetic is ours and the same for any number of columns. For each weight row, column and
// block of 32 values it takes one exact integer, the codes' dot product with the column's q8_0
// codes, and then, in floats, one chain per (row, column) in block order from acc = 0:
//     acc = fma(float(i_b), d_w·d_x, acc)        (and for q4_1, q5_1:  acc = fma(m_w, s_x, acc))
// with s_x = d_x·Σ codes of the column's block. A decode step (one column) and a verify block
// (many) therefore give a row the same bits, and the kernel can take the columns together: sixteen
// weight rows are transposed so that each vector lane holds one row, the transposed codes are
// multiplied with every column in turn (VNNI: 64 products per instruction; AVX2, eight rows a
// vector: 32 per VPMADDUBSW), and the float steps run on a vector of rows at once, so the
// per-block float work is shared by the rows x 32 values. The two builds give the same bits
// (dspark-matmul-blocks-isa.h). With
// AMX-INT8 (dspark_isa::amx_int8), batches of 12 columns and more take each block's integers for up
// to 16 columns from one tile product over the same transposed codes: the same integers, the same
// chain, the same bits.
//
// Weights come in two layouts. Plain (ggml's rows): each call makes every group of 16 rows ready
// (transposes the codes, gathers the scales), which is most of a decode step's arithmetic. Packed:
// the model's block weights are put in that ready form once at load (dspark_blocks_pack, the same
// bytes as the plain rows, one stream per group, in the form of the build the CPU runs), so a call
// only splits nibbles and reads scales.
// Both run the same passes: the same bits.
#pragma once

#include "dspark-cpu-isa.h"

#include "ggml.h"

#include <cstddef>
#include <cstdint>

// Does the blocks route take weights of this type, K values per row, on this CPU? (The kernels are
// built, with their own instruction flags, where the compiler targets x86-64: DSPARK_BLOCKS_KERNELS;
// they need AVX2 at least.)
inline bool dspark_blocks_available(ggml_type type, int64_t K) {
#ifdef DSPARK_BLOCKS_KERNELS
    const bool block_type = type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 ||
                            type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1;
    return block_type && K % 32 == 0 && dspark_cpu_isa_in_use() >= dspark_isa::avx2;
#else
    (void) type; (void) K;
    return false;
#endif
}

// Bytes of one column prepared for the kernel (K values).
size_t dspark_blocks_column_size(int64_t K);

// Quantize one column x [K] F32 for the kernel, whatever the weight type: ggml's q8_0 quantization,
// and per block its scale and the sum of its codes.
void dspark_blocks_prepare(const float * x, int64_t K, void * column);

// y[c][r] = row r of w · column c, for n_rows rows at `rows` (row_stride bytes apart) and n_cols
// prepared columns (any count: taken sixteen at a time).
void dspark_blocks_rows(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                        const void * const * columns, float * const * y, int n_cols);

// Bytes of n_rows rows of K values in the packed layout (whole groups of 16 rows).
size_t dspark_blocks_packed_size(ggml_type type, int64_t K, int64_t n_rows);

// n_rows plain rows (row_stride bytes apart) → the packed layout at `packed`
// (dspark_blocks_packed_size bytes; a last group of fewer than 16 rows repeats its last row).
void dspark_blocks_pack(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows, void * packed);

// dspark_blocks_rows for packed weights: n_rows rows from the first row of the group at `packed`.
void dspark_blocks_rows_packed(ggml_type type, const void * packed, int64_t K, int64_t n_rows, const void * const * columns,
                               float * const * y, int n_cols);
