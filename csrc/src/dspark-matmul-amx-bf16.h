// bf16 weights on AMX-BF16 tiles: every batch, a decode step included, runs one tile program.
//
// TDPBF16PS multiplies a tile of 16 weight rows x 32 bf16 values (A, read in place from the
// weight's rows) by a tile of 16 bf16 pairs x 16 columns (B) into 16 x 16 f32 sums (C), each sum
// the running total of its (row, column) over the pairs, in the instruction's own rounding. The
// program here gives each output one tile sum from zero over its row's chunks of 32 values in
// order, whatever the number of columns (a decode step computes 15 zero columns beside its one),
// so a row's bits do not depend on its batch. They are not the bits of llamafile's bf16 sgemm or
// of the AVX512-BF16 kernel (dspark-matmul-kernels.h), which add partial sums in another order:
// where this program runs, it runs every batch (the `own` plan with no upper bound). The columns
// are rounded to bf16 as ggml rounds them (dspark_own_dot_prepare), so the operands are the ones
// ggml's bf16 kernels multiply.
//
// f16 weights stay on the vector kernels: an f16 value is the exact sum of two bf16 values, so four
// tile products (hi·hi, hi·lo, lo·hi, lo·lo) would compute them exactly too, but splitting the
// weights on the fly costs more vector work than the FMA kernel's whole decode step (on a Xeon,
// SmolLM2-135M: a decode step 28 ms against 17.8).
//
// Built where the compiler knows AMX-BF16 (x86-64, GCC 11 / Clang 12 on: DSPARK_AMX_BF16_KERNELS),
// taken where the CPU has it and the OS grants the tiles (dspark_cpu_isa_in_use() is amx_int8:
// DSPARK_CPU_ISA=avx512_vnni turns it off).
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

// Does the tile program take bf16 rows of K values on this CPU (K a multiple of 32)?
bool dspark_amx_bf16_available(ggml_type type, int64_t K);

// y[c·y_stride + r] = row r of the weight · column c, for n_rows rows at `rows` (row_stride bytes
// apart) and n_cols columns of K bf16 values at `cols` (col_stride bytes apart).
void dspark_amx_bf16_matmul(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const ggml_bf16_t * cols,
                            size_t col_stride, int64_t n_cols, float * y, size_t y_stride);
