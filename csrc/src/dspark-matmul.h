// Batch-invariant weight matmuls on the CPU: a token's row of W·x must come out bit for bit the
// same whether its batch holds one row (a decode step) or many (a verify block, a prefill, other
// sequences), or greedy speculation stops being lossless.
//
// ggml's CPU backend does not promise that. It picks its kernel by the number of columns: one
// column runs the type's single-row dot product (vec_dot, or the repacked layout's gemv); two or
// more run llamafile's tiled sgemm (f32, f16, bf16, q8_0, q4_0, q5_0, iq4_nl on x86); eight or
// more run the tiled K-quant kernel (q2_K..q6_K, iq4_xs, iq1-iq3); the repacked layouts run a gemm
// on groups of four columns and the gemv on the rest. Each kernel is exact about its integer
// products but adds the float partial sums in its own order, so results differ in the last bits,
// which is enough to flip a greedy token now and then (within a hundred tokens on a K-quant model).
//
// Weights of the 32-value block types (q8_0, q4_0, q4_1, q5_0, q5_1) on an x86-64 CPU with AVX2 or
// AVX-512 VNNI (found at run time, dspark-cpu-isa.h) take none of ggml's kernels:
//   blocks  every batch, a decode step included, runs our kernel (dspark-matmul-blocks.h): exact
//           integer block products and one float chain per (row, column) of our own, the same for
//           any number of columns, so no probe is needed; the columns are quantized once per input
//           (q, k and v share theirs) and multiplied together, 16 transposed weight rows at a time.
//           A verify of 9 rows costs ~1.8-2.5 decode steps instead of 2.6-4.2 (Xeon, SmolLM2-135M),
//           and decode itself streams the weights faster than ggml's vec_dot. A model's weights of
//           these types are packed at load (cpu_repack, on by default; dspark-weights.cpp) into
//           the kernel's layout, groups of 16 rows transposed once, so a call no longer makes them
//           ready (the same bytes, the same bits; decode ~1.5x faster on the Xeon), and a pass of
//           up to 16 columns reads each block straight into registers (a verify of 9 rows in one
//           pass, not two over a copy of the ready blocks: 20-26 % faster on Zen 4). Where the CPU also has AMX-INT8 and the OS grants the tiles (Sapphire Rapids
//           on; not AMD Zen 4), batches of 12 columns and more take their integers from one tile
//           instruction per block instead of 32 VNNI ones: the same exact integers and the same
//           float chain, so the bits do not change (DSPARK_CPU_ISA=avx512_vnni keeps VNNI only). A
//           decode step and batches of up to 5 keep VNNI, faster there. Without VNNI (AMD Zen 1-3,
//           Intel client cores; DSPARK_CPU_ISA=avx2 forces it) the kernel's AVX2 build takes the
//           same integers from VPMADDUBSW / VPMADDWD, eight rows a vector, and runs the same chain,
//           so its bits are the VNNI pass's: on two Zen 3 cores (SmolLM2-135M) a 9-row verify costs
//           1.9-2.8 decode steps where ggml's kernels cost 3.5-6.1 (llama-bench 3.2-4.9), and a
//           decode step is no slower (iq4_nl, tried on it, verified at 3.0 steps instead of 4.1 but
//           decoded ~10 % slower than ggml's repacked gemv, so it keeps the plans below).
//           Without AVX2 (DSPARK_CPU_ISA=scalar) the block types take the probed plans below. On
//           two Zen 4 cores a 9-row q8_0 verify runs the pass at ~200 GMAC/s, what the cores' VPDPBUSD
//           gives (a loop of nothing else: 80-117 GMAC/s per core; folding the broadcasts and the
//           offset into fewer instructions did not make it faster), so there the rest of the step
//           (attention, ggml's small ops, barriers) is what is left to take. Still to come: the
//           routes of the other types on these units (q4_K, q6_K: ggml's tiled kernel repacks its
//           weights on every call and runs 30-40 GMAC/s at 9 columns).
//
// For the other types, rather than keep a table of which (type, CPU) pairs agree, each weight's plan
// is found by running ggml itself: a probe multiplies a small random matrix of the weight's type and shape by 1..17 and
// a few larger numbers of columns and compares every column with the same column computed alone.
//   ggml   every column count gave the single-column bits: ggml's matmul as it is (q8_0, q4_0,
//          q5_0, q4_1, q5_1; the repacked q4_0 and iq4_nl layouts on x86).
//   own    ggml's multi-column kernel agrees with itself from some column count on, and one of our
//          single-column kernels (dspark-matmul-kernels.h) reproduces it: batches below that count
//          run ours, column by column, and larger ones run ggml's (q2_K..q6_K and iq4_xs on AVX-512
//          VNNI builds: the tiled kernel from eight). f32, f16 and bf16 on x86 (llamafile from two
//          columns) run ours for every batch of up to 16 columns, a decode step, a verify block and
//          the decode of many sequences, and ggml's for prefills: our kernel takes the columns
//          together (tiles of 4 rows and up to 6 columns, as llamafile's) with each column's sum
//          the single-column one, and a decode step streams the rows one at a time. On Zen 4 (two
//          cores, SmolLM2-135M) that made an f16 decode step 13.4 -> 6.8 ms; a verify runs every
//          column pass over a tile of rows before the next tile, whose rows it fetches meanwhile,
//          so a 9-row verify costs 2.2-2.7 decode steps in f16 (llama-bench 2.5) and 1.6-2.1 in
//          bf16 (2.2), bound by the two cores' FMAs.
//          bf16 on a CPU with AMX-BF16 tiles (Sapphire Rapids on; DSPARK_CPU_ISA=avx512_vnni turns
//          them off) is own for every batch, prefills included, without a probe: one tile program
//          of ours (dspark-matmul-amx-bf16.h) whose sums are not llamafile's, so ggml's sgemm never
//          runs. On a Xeon (2 cores, SmolLM2-135M) a decode step streams at the memory's speed
//          (15.9 -> 13.6 ms), a 9-row verify costs 1.33 steps instead of 2.41, and a 512-token
//          prefill runs 2.4x llama-bench's.
//   rows   otherwise: every batch runs the type's own single-row kernel (ggml's vec_dot) for each
//          column, so a row is computed as a decode computes it (K-quants and iq4_xs in builds
//          without our kernels, plain iq4_nl).
//   quads  a repacked layout whose gemm (groups of four columns) differs from its gemv (the columns
//          left over), and one of our kernels reproduces the gemm one column at a time (q4_K's
//          8-row layout, AVX-512 VNNI): ggml's matmul takes the first multiple of four columns of
//          a batch, ours the rest (a decode step: ours alone), so every column gets the gemm's bits,
//          the ones llama.cpp's prefill gets.
// A repacked layout is used only where the plan is ggml or quads: q2_K (and q4_K without the
// kernel) stay in the plain layout on x86 and take its plan.
//
// A Vulkan device has the same problem with its own kernels (ggml-vulkan.cpp, ggml 0.25.3): up to
// mul_mat_vec_max_cols = 8 columns it runs the mul_mat_vec shaders, one workgroup per row block
// and every column reduced alone; from 9 columns on the tiled matmul shaders (mm, or mmq on q8_1
// activations), which add in another order (and with f16 operands where the device has f16), so
// every row of a 9..17-column verify block differs from its decode step. Devices with integer dot
// products can also differ at 2..8 columns: mul_mat_vec quantizes the columns to q8_1 (mmvq) for
// every batch of two or more, but for one column only on some vendors and row lengths
// (ggml_vk_should_use_mmvq). A probe on the device finds, per weight type and shape, the largest
// group of columns that comes out as each column alone:
//   ggml    every probed batch (1..17, 33, 64 columns) did: ggml's matmul as it is.
//   groups  batches of more than `group` columns run as matmuls of at most `group` columns (views
//           of the input, the results concatenated), up to DSPARK_MM_MAX_GROUPS of them; larger
//           batches (prefills) run as one matmul over a [K, 1, N] view, which ggml-vulkan computes
//           with its single-column shader once per column (`batched`: the probe found it exact;
//           otherwise they keep ggml's matmul). On lavapipe group is 8 for every type probed.
// mul_mat_id likewise: mul_mat_vec_id up to 8 tokens, the matmul shader beyond; groups of tokens.
//
// A CUDA device (ggml-cuda.cu, mmvq.cu, mmvf.cu, ggml 0.25.3) picks its kernel by the number of
// columns too: mmvq (quantized weights) splits a row's blocks over 4 warps for 1..4 columns and over
// 2 for 5..8, mmvf (f32, f16, bf16) takes one column only on Ampere and later, and from 9 columns
// mmq / mmf / cuBLAS tile the columns, so most rows of a verify block differ from their decode step.
// But one column of every channel of a batched matmul runs the one-column kernel, and a channel's
// arithmetic does not depend on how many channels there are:
//   channels  every batch, one column included, runs as one matmul over a [K, G, N/G] view of its
//             columns: channels of G columns, each computed as a decode step computes its column
//             (decode steps take the same view, so their graphs have the same nodes and ggml-cuda
//             fuses nothing in one that it does not fuse in the other). G is 1 for f32, f16 and bf16
//             (mmvf), 4 for quantized weights (mmvq's 4-column kernel: a column's sums do not
//             involve the other three), the batch padded with zero columns to a multiple of 4, so a
//             decode step computes three zero columns too: on an H200 (Qwen3-0.6B's shape, q8_0)
//             decode 6% slower than with G = 1, a 9-row verify 15% faster (3 channels, not 9,
//             each reading the weights); DSPARK_CUDA_COLUMNS=1 takes G = 1.
//             mul_mat_id likewise, for quantized experts: the batch's (token, expert slot) pairs
//             become the channels of one token (mmvq with ids takes one channel per pair); float
//             experts keep ggml's mul_mat_id (ggml-cuda has no one-column kernel for them there).
// Other non-CPU devices (Metal, RPC) keep ggml's matmul for now: not probed.
// DSPARK_DEVICE_MATMUL=ggml turns the device probe off (ggml's matmuls as they are), and
// DSPARK_CPU_MATMUL=ggml the CPU's (every plan ggml, every layout ggml repacks used).
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <string>
#include <vector>

enum class dspark_mm_route { ggml, own, rows, groups, quads, channels, blocks };

struct dspark_mm_plan {
    dspark_mm_route route = dspark_mm_route::ggml;
    int64_t         own_below = 0;  // own: batches of fewer columns than this run our kernel (INT64_MAX:
                                    // every batch, mul_mat_id too: bf16 on AMX tiles)
    int64_t         group = 0;      // groups: the most columns (or tokens, for mm_id) one matmul may take;
                                    // channels: the columns of one channel
    bool            batched = false;  // groups: a [K, 1, N] matmul gives every column the single-column bits
};

// The most groups one matmul is split into (a 64-column batch in groups of 8).
constexpr int64_t DSPARK_MM_MAX_GROUPS = 8;

// Graph nodes that `n_matmuls` matmuls may add by their plans (views, copies, concatenations) when
// the weights are on one of `devs`: what a graph's node budget must leave room for.
size_t dspark_matmul_extra_nodes(const std::vector<ggml_backend_dev_t> & devs, size_t n_matmuls);

// The plan for a matmul by a weight of `type`, `n_rows` rows of `n_per_row` values, held in a buffer
// of type `buft` (a CPU one: plain or repacked). Probed once per (buft, type, row length, row count
// mod 16) and cached; the same inputs always give the same plan.
dspark_mm_plan dspark_matmul_plan(ggml_backend_buffer_type_t buft, ggml_type type, int64_t n_per_row, int64_t n_rows);

// The plan on a (Vulkan) device for weights of `type`, `n_rows` rows of `n_per_row` values, or
// with `id` for ggml_mul_mat_id over such experts. Probed on the device once per (device, type, row
// length, row class, id) and cached.
dspark_mm_plan dspark_matmul_plan_device(ggml_backend_dev_t dev, ggml_type type, int64_t n_per_row, int64_t n_rows, bool id);

// The plan for a matmul by weight w as placed (for ggml_mul_mat_id with `id`): the CPU's plans for
// plain CPU buffers, the device probe's on a Vulkan device, channels on a CUDA device (and on the
// CPU under DSPARK_DEVICE_RULES=cuda), ggml elsewhere.
dspark_mm_plan dspark_matmul_plan_of(const ggml_tensor * w, bool id = false);

// w · x (x F32, [K, ...] contiguous or not) by the channels plan → [M, ...], x's other dimensions:
// plan.group columns per channel (the batch padded with zero columns to a multiple of it).
ggml_tensor * dspark_matmul_channels(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const dspark_mm_plan & plan);

// ggml_mul_mat_id(as, b, ids) (b [K, B, T] F32, ids [U, T]) by the channels plan → [M, U, T].
ggml_tensor * dspark_matmul_id_channels(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids);

// w · x (x [K, N] F32) by a quads plan (w repacked, M % 8 == 0) → [M, N] F32.
ggml_tensor * dspark_matmul_quads(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// w · x (x [K, N] F32) by a groups plan → [M, N] F32.
ggml_tensor * dspark_matmul_groups(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const dspark_mm_plan & plan);

// ggml_mul_mat_id(as, b, ids) (b [K, B, T], ids [U, T]) by a groups plan → [M, U, T].
ggml_tensor * dspark_matmul_id_groups(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids,
                                      const dspark_mm_plan & plan);

// w · x for w [K, M] in a plain CPU buffer and x [K, N] F32 (rows contiguous) by the plan's own
// or rows route → [M, N] F32.
ggml_tensor * dspark_matmul_node(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, dspark_mm_route route);

// The blocks route in its two nodes: x [K, N] F32 (rows contiguous) quantized for the kernel
// (I8 [column bytes, N], shareable by every weight of the block types that multiplies x; computed
// where weight w is), and w · those columns → [M, N] F32.
// w may be plain or packed (dspark_matmul_is_packed; the other form names the layout).
ggml_tensor * dspark_matmul_blocks_columns(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w);
ggml_tensor * dspark_matmul_blocks(ggml_context * ctx, ggml_tensor * w, ggml_tensor * columns);
ggml_tensor * dspark_matmul_blocks(ggml_context * ctx, ggml_tensor * w, ggml_tensor * columns, bool packed);

// Packed weights (dspark-matmul-blocks.h): weights of the blocks route kept in its layout from
// load on, so that no call transposes them again. They sit in buffers held here (held = false when
// the buffer is freed); only the blocks route reads them, so their plan is always blocks.
// dspark_matmul_packs: would weight w (2-D, or 3-D experts), placed on dev, take the blocks route
// there, and so be worth packing?
void dspark_matmul_hold_packed(ggml_backend_buffer_t buf, bool held);
bool dspark_matmul_is_packed(const ggml_tensor * w);
bool dspark_matmul_packs(ggml_backend_dev_t dev, const ggml_tensor * w);

// ggml_mul_mat_id by the rows route (or blocks: each expert's columns together): as [K, M, X]
// experts, b [K, B, T] F32, ids I32 [U, T] → [M, U, T], column (u, t) = as[:, :, ids[u, t]] · b[:, u % B, t].
ggml_tensor * dspark_matmul_id_rows(ggml_context * ctx, ggml_tensor * as, ggml_tensor * b, ggml_tensor * ids,
                                    dspark_mm_route route = dspark_mm_route::rows);

// The name of a route, for logs and tests.
const char * dspark_mm_route_name(dspark_mm_route route);

// The C API's dspark_cpu_matmul: y [N][M] = w · x for w (M rows of K values of type `type`, w_size
// bytes) and x [N][K] on the CPU through `route` ("auto", "blocks" (w packed first, as a model's
// weights are), "blocks_plain", "own", "rows", "ggml"), on
// n_threads threads. Returns the route taken; throws dspark_error on bad input or a route this CPU
// cannot run for the type.
std::string dspark_matmul_cpu_run(const char * type, const void * w, size_t w_size, int64_t M, int64_t K, const float * x,
                                  int64_t N, float * y, const char * route, int n_threads);
