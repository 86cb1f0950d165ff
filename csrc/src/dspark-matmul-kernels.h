// Single-column dot products that compute a weight row the way ggml's multi-column CPU kernel does,
// so that a decode step (one column) gets the bits a verify or prefill (many columns) gets, at the
// speed of a single-column kernel. See dspark-matmul.h for where they are used; every one of them
// is checked against ggml at run time before it is used (a build or CPU where it does not match
// falls back to computing every batch one column at a time).
//
// float weights (f32, f16, bf16): llamafile's sgemm computes each output as one vector of partial
//   sums, fused multiply-adds over the row in steps of the vector width, reduced at the end. The
//   kernel here does the same per row and column, with the columns of a batch (up to 16 at once)
//   passing over each row together; a column is converted once (to f32 from the f16 ggml rounds
//   it to, or to bf16), not once per row.
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

// Is there a kernel for weights of this type and row length in this build?
bool dspark_own_dot_available(ggml_type type, int64_t K);

// Bytes of one column prepared for dspark_own_dot_rows (K values).
size_t dspark_own_dot_prepared_size(ggml_type type, int64_t K);

// Convert one column x [K] F32 as the multi-column kernel sees it.
void dspark_own_dot_prepare(ggml_type type, const float * x, int64_t K, void * prepared);

// y[r] = row r of w · the prepared column, for n_rows rows at `rows` (row_stride bytes apart).
void dspark_own_dot_rows(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                         const void * prepared, float * y);

// Float weights (f32, f16, bf16): several columns over each row at once, the row read and converted
// once for all of them, each column's bits those of dspark_own_dot_rows on it alone. Columns
// prepared as for dspark_own_dot_rows, prepared_stride bytes apart; column c's results at
// y + c·y_stride.
bool dspark_own_dot_columns_available(ggml_type type, int64_t K);
// ... and should a thread hand it all its rows at once rather than 16 at a time (the AMX tile program
// for bf16, dspark-matmul-amx-bf16.h, which sets its tiles up once per call)?
bool dspark_own_dot_takes_row_ranges(ggml_type type, int64_t K);
void dspark_own_dot_rows_columns(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                                 const void * prepared, size_t prepared_stride, int64_t n_cols, float * y, size_t y_stride);

// The same for weights in ggml's repacked 8-row layout (q4_K as block_q4_Kx8), reproducing ggml's
// gemm for that layout (the kernel its matmul uses on groups of four columns) one column at a time.
bool dspark_own_dot_x8_available(ggml_type type, int64_t K);
size_t dspark_own_dot_x8_prepared_size(ggml_type type, int64_t K);
void dspark_own_dot_x8_prepare(ggml_type type, const float * x, int64_t K, void * prepared);

// y[i] = row r0 + i of the repacked weight at `data` · the prepared column, for i < n_rows (r0 and
// n_rows multiples of 8).
void dspark_own_dot_x8_rows(ggml_type type, const void * data, int64_t K, int64_t r0, int64_t n_rows,
                            const void * prepared, float * y);
