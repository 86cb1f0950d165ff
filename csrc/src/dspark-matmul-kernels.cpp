#include "dspark-matmul-kernels.h"
#include "dspark-column-passes.h"
#include "dspark-matmul-amx-bf16.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#    include <immintrin.h>
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// float weights: llamafile's per-output arithmetic. Each output is one vector of partial sums
// over the row in steps of the vector width (fused multiply-add), reduced at the end; the vector
// is 16 floats with AVX-512, 8 with AVX2, and bf16 pairs go through the dot-product instruction
// where AVX512-BF16 has it.

#if defined(__AVX512F__)
using vec = __m512;
constexpr int WIDTH = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec load_f32(const float * p) { return _mm512_loadu_ps(p); }
inline vec load_f16(const ggml_fp16_t * p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p)); }
inline vec load_bf16(const ggml_bf16_t * p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *) p)), 16));
}
inline vec madd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(vec x) { return _mm512_reduce_add_ps(x); }
#    define DSPARK_FLOAT_KERNELS 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
using vec = __m256;
constexpr int WIDTH = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec load_f32(const float * p) { return _mm256_loadu_ps(p); }
inline vec load_f16(const ggml_fp16_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
inline vec load_bf16(const ggml_bf16_t * p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) p)), 16));
}
inline vec madd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(vec x) {
    __m128 h = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#    define DSPARK_FLOAT_KERNELS 1
#endif

#ifdef DSPARK_FLOAT_KERNELS

// Compilers fold a vector load into each FMA that uses it (free on Intel's cores); on Zen 4, which
// loads one 64-byte vector a cycle, a tile then waits on its loads. An empty asm that claims to
// change the register keeps the loaded vector in it.
template <typename V> inline void keep_in_register(V & v) {
#    if defined(__GNUC__)
    __asm__("" : "+v"(v));
#    else
    (void) v;
#    endif
}

// Bytes ahead in each weight row's stream that a tile asks the cache for: the FMA chain of a row
// holds the loads back, and without it a decode step waited on memory (Xeon, SmolLM2-135M, 2
// cores: f16 decode 20.3 -> 17.3 ms, a 9-row f16 verify -5 %, f32 -9 %, AVX512-BF16 decode -10 %;
// 512 and 2048 bytes did about as well, 4096 worse).
constexpr int PREFETCH_AHEAD = 1024;

// A tile of several rows reads them side by side, so 1 KiB ahead in one row is mostly the next
// row, which the tile is already reading: it asks instead for the same place in the next tile's
// rows, which float_columns takes next (every column pass over a tile before the next tile), so
// the memory works while a tile's later passes compute from L1. Zen 4, SmolLM2-135M, 2 cores: a
// 9-row verify f16 26.6 -> 19.4 ms, f32 33.8 -> 27.7, bf16 (AVX512-BF16) 21.2 -> 16.7; two tiles
// ahead did worse.
inline size_t fetch_ahead(int rows_at_once, size_t row_stride) {
    return rows_at_once == 1 ? (size_t) PREFETCH_AHEAD : rows_at_once * row_stride;
}

// A tile of RM rows and RN columns: RM·RN sums, each the single-column one step for step; a row
// vector is read (and converted) once for the RN columns, a column vector once for the RM rows.
// Columns are x_stride bytes apart. OPS names the operands: their element types, how many values
// one step takes, how each is loaded and the step itself.
template <class OPS, int RM, int RN>
void float_tiles(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const char * x, size_t x_stride,
                 float * y, size_t y_stride) {
    using W = typename OPS::w_type;
    using X = typename OPS::x_type;
    const size_t ahead = fetch_ahead(RM, row_stride);
    for (int64_t r = 0; r + RM <= n_rows; r += RM) {
        vec acc[RM][RN];
        for (int i = 0; i < RM; ++i) {
            for (int j = 0; j < RN; ++j) {
                acc[i][j] = vzero();
            }
        }
        for (int64_t l = 0; l < K; l += OPS::STEP) {
            typename OPS::operand wv[RM];
            for (int i = 0; i < RM; ++i) {
                const W * at = (const W *) (rows + (r + i) * row_stride) + l;
                _mm_prefetch((const char *) at + ahead, _MM_HINT_T0);
                wv[i] = OPS::load_w(at);
            }
            for (int j = 0; j < RN; ++j) {
                typename OPS::operand xv = OPS::load_x((const X *) (x + j * x_stride) + l);
                keep_in_register(xv);  // one load for the RM rows, not one folded into each step
                for (int i = 0; i < RM; ++i) {
                    acc[i][j] = OPS::step(acc[i][j], wv[i], xv);
                }
            }
        }
        for (int i = 0; i < RM; ++i) {
            for (int j = 0; j < RN; ++j) {
                y[j * y_stride + r + i] = hsum(acc[i][j]);
            }
        }
    }
}

// Float weights against columns kept as f32 (exactly the values ggml's f16 conversion gives, for
// f16 weights): fused multiply-adds, the vector width a step.
template <typename W, vec (*LOAD_W)(const W *)>
struct fma_ops {
    using w_type = W;
    using x_type = float;
    using operand = vec;
    static constexpr int STEP = WIDTH;
    static vec load_w(const W * p) { return LOAD_W(p); }
    static vec load_x(const float * p) { return load_f32(p); }
    static vec step(vec acc, vec w, vec x) { return madd(w, x, acc); }
};

#    if defined(__AVX512BF16__)
// bf16 · bf16 in pairs (the instruction's own rounding), 32 values a step, columns as bf16.
struct bf16_pair_ops {
    using w_type = ggml_bf16_t;
    using x_type = ggml_bf16_t;
    using operand = __m512bh;
    static constexpr int STEP = 32;
    static __m512bh load_w(const ggml_bf16_t * p) { return (__m512bh) _mm512_loadu_ps((const float *) p); }
    static __m512bh load_x(const ggml_bf16_t * p) { return (__m512bh) _mm512_loadu_ps((const float *) p); }
    static __m512 step(__m512 acc, __m512bh w, __m512bh x) { return _mm512_dpbf16_ps(acc, w, x); }
};
using bf16_ops = bf16_pair_ops;
#    else
using bf16_ops = fma_ops<ggml_bf16_t, load_bf16>;
#    endif

// A decode step (one column) reads the rows one at a time, front to back: one sequential stream,
// which the hardware prefetchers follow best. Four rows at once (four streams 2·K bytes apart)
// streamed f16 at 21 GB/s on two Zen 4 cores against 36 GB/s row by row, and one FMA chain
// (an FMA every 4 cycles, 32 bytes each) still outruns the memory. Several columns are compute:
// tiles of 4 rows and up to COLUMNS_AT_ONCE columns (llamafile's tile for AVX-512), where the
// vector registers hold 4·6 sums (32 registers with AVX-512; 4·3 of 16 with AVX2).
constexpr int ROWS_AT_ONCE = 4;
constexpr int COLUMNS_AT_ONCE = WIDTH == 16 ? 6 : 3;

using float_rows_fn = void (*)(const char *, size_t, int64_t, int64_t, const char *, size_t, float *, size_t);

template <class OPS, int RM, size_t... I>
constexpr std::array<float_rows_fn, sizeof...(I)> by_columns(std::index_sequence<I...>) {
    return {&float_tiles<OPS, RM, (int) I + 1>...};
}

template <class OPS>
void float_columns(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const char * x, size_t x_stride,
                   int64_t n_cols, float * y, size_t y_stride) {
    static constexpr auto tiles = by_columns<OPS, ROWS_AT_ONCE>(std::make_index_sequence<COLUMNS_AT_ONCE>());
    static constexpr auto singles = by_columns<OPS, 1>(std::make_index_sequence<COLUMNS_AT_ONCE>());
    if (n_cols == 1) {
        singles[0](rows, row_stride, K, n_rows, x, x_stride, y, y_stride);
        return;
    }
    const int64_t tiled = n_rows / ROWS_AT_ONCE * ROWS_AT_ONCE;
    for (int64_t r = 0; r < tiled; r += ROWS_AT_ONCE) {  // every pass over a tile before the next tile (fetch_ahead)
        dspark_balanced_passes((int) n_cols, COLUMNS_AT_ONCE, [&](int, int c0, int n) {
            tiles[n - 1](rows + r * row_stride, row_stride, K, ROWS_AT_ONCE, x + c0 * x_stride, x_stride,
                         y + c0 * y_stride + r, y_stride);
        });
    }
    dspark_balanced_passes((int) n_cols, COLUMNS_AT_ONCE, [&](int, int c0, int n) {
        singles[n - 1](rows + tiled * row_stride, row_stride, K, n_rows - tiled, x + c0 * x_stride, x_stride,
                       y + c0 * y_stride + tiled, y_stride);
    });
}

bool float_columns_run(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                       const char * x, size_t x_stride, int64_t n_cols, float * y, size_t y_stride) {
    switch (type) {
        case GGML_TYPE_F32:  float_columns<fma_ops<float, load_f32>>(rows, row_stride, K, n_rows, x, x_stride, n_cols, y, y_stride); return true;
        case GGML_TYPE_F16:  float_columns<fma_ops<ggml_fp16_t, load_f16>>(rows, row_stride, K, n_rows, x, x_stride, n_cols, y, y_stride); return true;
        case GGML_TYPE_BF16: float_columns<bf16_ops>(rows, row_stride, K, n_rows, x, x_stride, n_cols, y, y_stride); return true;
        default:             return false;
    }
}

#endif  // DSPARK_FLOAT_KERNELS


// ---------------------------------------------------------------------------------------------
// K-quants (q2_K .. q6_K, iq4_xs): ggml's tiled kernel (eight columns and more) computes, for each
// weight row, column and 256-value block, two exact integers - s1, the block's dot product with
// each sub-block scaled, and s2, the sub-block minimums times the column's sub-block sums - and
// then, in floats,
//     r = s1·d - dmin·s2 (the product fused into the subtraction),   acc += r · d_column,
// block after block from acc = 0. Any way of getting the integers right gives the same bits, so
// the kernel here gets them its own way, for one column at a time, and repeats the float steps.

struct q8k_block {  // ggml's q8_K: how a column meets K-quant weights
    float   d;
    int8_t  qs[256];
    int16_t bsums[16];
};
struct q2k_block { uint8_t scales[16]; uint8_t qs[64]; ggml_fp16_t d, dmin; };
struct q3k_block { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; ggml_fp16_t d; };
struct q4k_block { ggml_fp16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct q5k_block { ggml_fp16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct q6k_block { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ggml_fp16_t d; };
struct iq4xs_block { ggml_fp16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
static_assert(sizeof(q8k_block) == 292 && sizeof(q2k_block) == 84 && sizeof(q3k_block) == 110 &&
              sizeof(q4k_block) == 144 && sizeof(q5k_block) == 176 && sizeof(q6k_block) == 210 &&
              sizeof(iq4xs_block) == 136, "K-quant block layouts");

const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#    define DSPARK_KQUANT_SIMD 1

// The same integers with AVX-512, four weight rows at a time. A block's 256 values are taken as
// four vectors of 64 unsigned codes (value + the type's bias, or |value| with the column's sign
// flipped), in an order that is cheap to unpack; the column is permuted to the same order once.
// Sub-block scales multiply pairs of products (maddubs, then madd with per-lane scales); the bias
// comes back out through the column's sums of 16.

struct kq_block_vectors {
    __m512i code[4];    // unsigned codes, in the type's order
    __mmask64 flip[4];  // SIGNED: lanes whose value is negative
    __m512i scale[4];   // int16 per pair of codes: the sub-block scale of that pair
    __m256i scale16;    // int16 [16]: the scale of each run of 16 values in natural order
    __m256i min16;      // int16 [16]: the min of each run of 16 (HAS_MIN)
    float   d = 0.0f, dmin = 0.0f;
};

// A prepared column block: the column's q8_K block with its values in the weight type's order.
struct kq_column_block {
    int8_t  qs[256];
    int16_t bsums[16];
    float   d;
};

// f16 → f32 is exact; the instruction, not a call into ggml (a call would spill the vectors).
inline float half_to_float(ggml_fp16_t h) { return _cvtsh_ss(h); }
inline __m512i nibbles_lo(__m512i x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0F)); }
inline __m512i nibbles_hi(__m512i x) { return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0F)); }
inline __m512i twice(const uint8_t * p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) p)); }
const __mmask64 UPPER_HALF = 0xFFFFFFFF00000000ull;

// Each byte of the lower half of x shifted right by `lo`, of the upper half by `hi` (bits that
// cross into a byte from its neighbour are above the ones the callers keep).
inline __m512i shift_halves(__m512i x, int lo, int hi) {
    return _mm512_srlv_epi16(x, _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short) lo), _mm512_set1_epi16((short) hi)));
}

// int16 lanes taking scales[idx[lane]] from 16 int16 scales
inline __m512i spread(__m256i scales16, const int16_t * idx) {
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), _mm512_castsi256_si512(scales16));
}
// index tables: which sub-block (of 16 values) each int16 lane of vector v belongs to
alignas(64) const int16_t SPREAD_NATURAL16[4][32] = {  // 64 values per vector in natural order, sub-blocks of 16
    {0,0,0,0,0,0,0,0, 1,1,1,1,1,1,1,1, 2,2,2,2,2,2,2,2, 3,3,3,3,3,3,3,3},
    {4,4,4,4,4,4,4,4, 5,5,5,5,5,5,5,5, 6,6,6,6,6,6,6,6, 7,7,7,7,7,7,7,7},
    {8,8,8,8,8,8,8,8, 9,9,9,9,9,9,9,9, 10,10,10,10,10,10,10,10, 11,11,11,11,11,11,11,11},
    {12,12,12,12,12,12,12,12, 13,13,13,13,13,13,13,13, 14,14,14,14,14,14,14,14, 15,15,15,15,15,15,15,15}};

// q4_K and q5_K: the 6-bit scales and mins of the 8 sub-blocks of 32 (12 bytes: the low 6 bits of
// bytes 0-3 and 4-7 are the scales and mins of sub-blocks 0-3; for sub-blocks 4-7, bytes 8-11 hold
// their low 4 bits and the top 2 bits of bytes 0-3 / 4-7 their high ones). K4_SPREAD[v]: the
// sub-block of each int16 lane of vector v in q4_K's order (one sub-block per half).
alignas(64) const int16_t K4_SPREAD[4][32] = {
    {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0, 2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2},
    {1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1, 3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3},
    {4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4, 6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6},
    {5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5, 7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7}};
// The 12 bytes of q4_K's packing as bytes [scale 0..7, min 0..7]: 32-bit words u0, u1, u2 give
// scales 0-3 = u0 & low6, mins 0-3 = u1 & low6, and for 4-7 the low 4 bits from u2 (low / high
// nibbles) with the top 2 bits of u0 / u1 above them.
inline __m128i k4_scales_mins_bytes(const uint8_t * q) {
    uint32_t u[3];
    memcpy(u, q, sizeof(u));
    const uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, top2 = 0x03030303;
    return _mm_setr_epi32((int) (u[0] & low6), (int) ((u[2] & low4) | (((u[0] >> 6) & top2) << 4)),
                          (int) (u[1] & low6), (int) (((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4)));
}

// A q4_K / q5_K block's d, dmin and scales as the int16 scale vectors.
template <typename Block>
inline void k4_header(const Block & x, kq_block_vectors & b) {
    const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins_bytes(x.scales));  // int16 [scale 0..7, min 0..7]
    for (int v = 0; v < 4; ++v) {
        b.scale[v] = _mm512_permutexvar_epi16(_mm512_load_si512(K4_SPREAD[v]), _mm512_castsi256_si512(sm));
    }
    b.min16 = _mm256_permutexvar_epi16(_mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), sm);
    b.d = half_to_float(x.d);
    b.dmin = half_to_float(x.dmin);
}

// ---- q4_K: vector 2j holds the low nibbles of qs[64j..64j+63] (values 128j + 0..31, 64..95),
// vector 2j+1 the high ones (128j + 32..63, 96..127); sub-blocks of 32.
struct q4k_simd {
    using block = q4k_block;
    static constexpr int BIAS = 0;
    static constexpr bool HAS_MIN = true, SIGNED = false;
    static int order(int i) {  // position i of the permuted column → natural index
        const int v = i >> 6, half = (i >> 5) & 1, l = i & 31;
        return 128 * (v >> 1) + 32 * (v & 1) + 64 * half + l;
    }
    static void load(const block & x, kq_block_vectors & b) {
        const __m512i q0 = _mm512_loadu_si512(x.qs), q1 = _mm512_loadu_si512(x.qs + 64);
        b.code[0] = nibbles_lo(q0); b.code[1] = nibbles_hi(q0);
        b.code[2] = nibbles_lo(q1); b.code[3] = nibbles_hi(q1);
        k4_header(x, b);
    }
};

// ---- q5_K: q4_K's order, plus the fifth bit from qh (bit 2j of qh[l] for values 64j + l, bit
// 2j+1 for 64j + 32 + l).
struct q5k_simd {
    using block = q5k_block;
    static constexpr int BIAS = 0;
    static constexpr bool HAS_MIN = true, SIGNED = false;
    static int order(int i) { return q4k_simd::order(i); }
    static void load(const block & x, kq_block_vectors & b) {
        const __m512i q0 = _mm512_loadu_si512(x.qs), q1 = _mm512_loadu_si512(x.qs + 64);
        b.code[0] = nibbles_lo(q0); b.code[1] = nibbles_hi(q0);
        b.code[2] = nibbles_lo(q1); b.code[3] = nibbles_hi(q1);
        const __m512i h = twice(x.qh);
        static const int bit_lo[4] = {0, 1, 4, 5}, bit_hi[4] = {2, 3, 6, 7};
        for (int v = 0; v < 4; ++v) {
            const __m512i sel = _mm512_mask_blend_epi8(UPPER_HALF, _mm512_set1_epi8((char) (1 << bit_lo[v])),
                                                       _mm512_set1_epi8((char) (1 << bit_hi[v])));
            const __mmask64 top = _mm512_test_epi8_mask(h, sel);
            b.code[v] = _mm512_mask_add_epi8(b.code[v], top, b.code[v], _mm512_set1_epi8(16));
        }
        k4_header(x, b);
    }
};

// ---- q6_K: natural order; code = 4 bits of ql | 2 bits of qh, value = code - 32; sub-blocks of 16.
struct q6k_simd {
    using block = q6k_block;
    static constexpr int BIAS = 32;
    static constexpr bool HAS_MIN = false, SIGNED = false;
    static int order(int i) { return i; }
    static void load(const block & x, kq_block_vectors & b) {
        for (int h = 0; h < 2; ++h) {
            const __m512i l = _mm512_loadu_si512(x.ql + 64 * h);
            const __m512i q = twice(x.qh + 32 * h);
            // low nibbles: values 128h + 0..63 (top bits 0-1 for the first 32, 2-3 for the next)
            const __m512i top_lo = shift_halves(q, 0, 2);
            const __m512i top_hi = shift_halves(q, 4, 6);
            const __m512i three = _mm512_set1_epi8(3);
            b.code[2 * h]     = _mm512_or_si512(nibbles_lo(l), _mm512_slli_epi16(_mm512_and_si512(top_lo, three), 4));
            b.code[2 * h + 1] = _mm512_or_si512(nibbles_hi(l), _mm512_slli_epi16(_mm512_and_si512(top_hi, three), 4));
        }
        b.scale16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x.scales));
        for (int v = 0; v < 4; ++v) {
            b.scale[v] = spread(b.scale16, SPREAD_NATURAL16[v]);
        }
        b.d = half_to_float(x.d);
    }
};

// ---- q3_K: natural order; code = 2 bits of qs | the hmask bit << 2, value = code - 4; sub-blocks of 16.
struct q3k_simd {
    using block = q3k_block;
    static constexpr int BIAS = 4;
    static constexpr bool HAS_MIN = false, SIGNED = false;
    static int order(int i) { return i; }
    static void load(const block & x, kq_block_vectors & b) {
        const __m512i hm = twice(x.hmask);
        for (int v = 0; v < 4; ++v) {
            const int h = v >> 1, g = 2 * (v & 1);  // values 128h + 32g + 0..63: groups g and g + 1
            const __m512i q = twice(x.qs + 32 * h);
            const __m512i low = _mm512_and_si512(shift_halves(q, 2 * g, 2 * g + 2), _mm512_set1_epi8(3));
            const __m512i sel = _mm512_mask_blend_epi8(UPPER_HALF, _mm512_set1_epi8((char) (1 << (4 * h + g))),
                                                       _mm512_set1_epi8((char) (1 << (4 * h + g + 1))));
            b.code[v] = _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hm, sel), low, _mm512_set1_epi8(4));
        }
        uint32_t a[3];  // 6-bit scales: low 4 bits in bytes 0-7 (two per byte), high 2 bits in bytes 8-11
        memcpy(a, x.scales, sizeof(a));
        const uint32_t m1 = 0x03030303, m2 = 0x0f0f0f0f;
        const __m128i s = _mm_setr_epi32((int) ((a[0] & m2) | (((a[2] >> 0) & m1) << 4)),
                                         (int) ((a[1] & m2) | (((a[2] >> 2) & m1) << 4)),
                                         (int) (((a[0] >> 4) & m2) | (((a[2] >> 4) & m1) << 4)),
                                         (int) (((a[1] >> 4) & m2) | (((a[2] >> 6) & m1) << 4)));
        b.scale16 = _mm256_sub_epi16(_mm256_cvtepi8_epi16(s), _mm256_set1_epi16(32));
        for (int v = 0; v < 4; ++v) {
            b.scale[v] = spread(b.scale16, SPREAD_NATURAL16[v]);
        }
        b.d = half_to_float(x.d);
    }
};

// ---- q2_K: natural order; code = 2 bits of qs; 4-bit scale and min per sub-block of 16.
struct q2k_simd {
    using block = q2k_block;
    static constexpr int BIAS = 0;
    static constexpr bool HAS_MIN = true, SIGNED = false;
    static int order(int i) { return i; }
    static void load(const block & x, kq_block_vectors & b) {
        for (int v = 0; v < 4; ++v) {
            const int h = v >> 1, j = 2 * (v & 1);
            const __m512i q = twice(x.qs + 32 * h);
            b.code[v] = _mm512_and_si512(shift_halves(q, 2 * j, 2 * j + 2), _mm512_set1_epi8(3));
        }
        const __m256i s = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *) x.scales));
        b.scale16 = _mm256_and_si256(s, _mm256_set1_epi16(0xF));
        b.min16 = _mm256_srli_epi16(s, 4);
        for (int v = 0; v < 4; ++v) {
            b.scale[v] = spread(b.scale16, SPREAD_NATURAL16[v]);
        }
        b.d = half_to_float(x.d); b.dmin = half_to_float(x.dmin);
    }
};

// ---- iq4_xs: vector k holds the low nibbles of qs[32k..32k+31] then the high ones: values
// 64k + {0..15, 32..47} then 64k + {16..31, 48..63}; signed values from the table; sub-blocks of 32.
struct iq4xs_simd {
    using block = iq4xs_block;
    static constexpr int BIAS = 0;
    static constexpr bool HAS_MIN = false, SIGNED = true;
    static int order(int i) {
        const int k = i >> 6, hi = (i >> 5) & 1, r = i & 31;  // r: byte of qs[32k..]: 0..15 sub 2k, 16..31 sub 2k+1
        return 64 * k + 32 * (r >> 4) + 16 * hi + (r & 15);
    }
    static void load(const block & x, kq_block_vectors & b) {
        const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *) IQ4_VALUES));
        for (int k = 0; k < 4; ++k) {
            const __m512i q = twice(x.qs + 32 * k);
            const __m512i nib = nibbles_lo(shift_halves(q, 0, 4));
            const __m512i v = _mm512_shuffle_epi8(lut, nib);
            b.flip[k] = _mm512_movepi8_mask(v);
            b.code[k] = _mm512_abs_epi8(v);
        }
        // 6-bit scales (value + 32): the low 4 bits are the nibbles of scales_l, the top 2 the bit
        // pairs of scales_h; deposited into the bytes of sub-blocks 0..7
        uint32_t low;
        memcpy(&low, x.scales_l, sizeof(low));
        const uint64_t sc = _pdep_u64(low, 0x0F0F0F0F0F0F0F0Full) | _pdep_u64(x.scales_h, 0x3030303030303030ull);
        const __m128i sc16 = _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long) sc)), _mm_set1_epi16(32));
        alignas(64) static const int16_t idx[4][32] = {  // vector k: sub-blocks 2k, 2k+1, 2k, 2k+1 (16 values each)
            {0,0,0,0,0,0,0,0, 1,1,1,1,1,1,1,1, 0,0,0,0,0,0,0,0, 1,1,1,1,1,1,1,1},
            {2,2,2,2,2,2,2,2, 3,3,3,3,3,3,3,3, 2,2,2,2,2,2,2,2, 3,3,3,3,3,3,3,3},
            {4,4,4,4,4,4,4,4, 5,5,5,5,5,5,5,5, 4,4,4,4,4,4,4,4, 5,5,5,5,5,5,5,5},
            {6,6,6,6,6,6,6,6, 7,7,7,7,7,7,7,7, 6,6,6,6,6,6,6,6, 7,7,7,7,7,7,7,7}};
        for (int v = 0; v < 4; ++v) {
            b.scale[v] = _mm512_permutexvar_epi16(_mm512_load_si512(idx[v]), _mm512_castsi128_si512(sc16));
        }
        b.d = half_to_float(x.d);
    }
};

// The column's blocks in the type's order.
template <typename T>
void kq_prepare(const q8k_block * natural, int64_t nb, kq_column_block * out) {
    for (int64_t i = 0; i < nb; ++i) {
        for (int p = 0; p < 256; p += 16) {  // every type's order keeps runs of 16 together
            memcpy(out[i].qs + p, natural[i].qs + T::order(p), 16);
        }
        memcpy(out[i].bsums, natural[i].bsums, sizeof(out[i].bsums));
        out[i].d = natural[i].d;
    }
}

// The 16 int32 partial sums of s1 for one row's block (their total is s1), and s2's 8.
template <typename T>
inline void kq_block_sums(const kq_block_vectors & b, const __m512i * col, __m256i bsums, __m512i & s1, __m256i & s2) {
    __m512i acc = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
        __m512i a = col[v];
        if constexpr (T::SIGNED) {
            a = _mm512_mask_sub_epi8(a, b.flip[v], _mm512_setzero_si512(), a);
        }
        acc = _mm512_dpwssd_epi32(acc, b.scale[v], _mm512_maddubs_epi16(b.code[v], a));  // += scale·(pair sums)
    }
    if constexpr (T::BIAS != 0) {  // Σ scale·(code - BIAS)·a = Σ scale·code·a - BIAS·Σ scale·(sum of a)
        static_assert((T::BIAS & (T::BIAS - 1)) == 0, "the bias is a power of two: a shift");
        const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(b.scale16, bsums), __builtin_ctz(T::BIAS));
        acc = _mm512_sub_epi32(acc, _mm512_zextsi256_si512(bias));
    }
    s1 = acc;
    if constexpr (T::HAS_MIN) {
        s2 = _mm256_madd_epi16(b.min16, bsums);
    }
}

// [Σ a, Σ b, Σ c, Σ d] of four vectors of 16 int32.
inline __m128i hsum4(__m512i a, __m512i b, __m512i c, __m512i d) {
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    const __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
inline __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    return hsum4(_mm512_zextsi256_si512(a), _mm512_zextsi256_si512(b), _mm512_zextsi256_si512(c), _mm512_zextsi256_si512(d));
}

template <typename T>
void kquant_rows_simd(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const kq_column_block * x, float * y) {
    using B = typename T::block;
    const int64_t nb = K / 256;
    int64_t r = 0;
    for (; r < n_rows; r += 4) {
        const int n = (int) std::min<int64_t>(4, n_rows - r);
        const B * w[4];
        for (int i = 0; i < 4; ++i) {
            w[i] = (const B *) (rows + (r + std::min(i, n - 1)) * row_stride);  // short tail: repeat the last row
        }
        __m128 acc = _mm_setzero_ps();
        for (int64_t blk = 0; blk < nb; ++blk) {
            const kq_column_block & c = x[blk];
            const __m512i col[4] = {_mm512_loadu_si512(c.qs), _mm512_loadu_si512(c.qs + 64),
                                    _mm512_loadu_si512(c.qs + 128), _mm512_loadu_si512(c.qs + 192)};
            const __m256i bsums = _mm256_loadu_si256((const __m256i *) c.bsums);
            __m512i s1[4];
            __m256i s2[4] = {};
            alignas(16) float d[4], dmin[4];
            for (int i = 0; i < 4; ++i) {
                kq_block_vectors b;
                T::load(w[i][blk], b);
                kq_block_sums<T>(b, col, bsums, s1[i], s2[i]);
                d[i] = b.d;
                dmin[i] = b.dmin;
            }
            // r = s1·d - dmin·s2 (fused), acc += r·d_column (fused): the tiled kernel's steps, per row
            __m128 rv = _mm_mul_ps(_mm_cvtepi32_ps(hsum4(s1[0], s1[1], s1[2], s1[3])), _mm_load_ps(d));
            if constexpr (T::HAS_MIN) {
                rv = _mm_fnmadd_ps(_mm_load_ps(dmin), _mm_cvtepi32_ps(hsum4(s2[0], s2[1], s2[2], s2[3])), rv);
            }
            acc = _mm_fmadd_ps(rv, _mm_set1_ps(c.d), acc);
        }
        alignas(16) float out[4];
        _mm_store_ps(out, acc);
        for (int i = 0; i < n; ++i) {
            y[r + i] = out[i];
        }
    }
}


// ---------------------------------------------------------------------------------------------
// q4_K in ggml's repacked layout (block_q4_Kx8: eight rows interleaved). Its gemm, which takes the
// columns four at a time, computes for each row, column and 64 values (sub-blocks 2s and 2s+1 of
// a block) two exact integers - I = Σ scale·(codes·column), m = Σ min·(sum of the column) - and
// then, in floats,
//     acc += I · (d·d_column),   accm += m · (dmin·d_column)   (fused),   out = acc - accm,
// on a column quantized to q8_K with its own sign rule (the block's largest magnitude counts as
// positive when it occurs as a positive value). Its gemv, for the columns left over, goes block by
// block instead, so the kernel here repeats the gemm's steps for a single column.

struct q4kx8_block {
    ggml_fp16_t d[8], dmin[8];
    uint8_t     scales[96];  // sub-block j: 12 bytes, the eight rows' scales and mins packed as in q4_K
    uint8_t     qs[1024];    // 8-byte runs: run k holds bytes 8(k/8) .. 8(k/8)+7 of row k % 8
};
static_assert(sizeof(q4kx8_block) == 1152, "q4_Kx8 layout");

// The column as the gemm's quantizer makes it: per block, d = 1/iscale with iscale = ∓127/amax
// (minus when amax occurs as a positive value), values rounded to nearest even, sums of 16.
void q8k_quads_prepare(const float * x, int64_t nb, q8k_block * out) {
    for (int64_t b = 0; b < nb; ++b) {
        const float * v = x + 256 * b;
        __m512 amax = _mm512_setzero_ps();
        for (int i = 0; i < 256; i += 16) {
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(v + i)));
        }
        const float m = _mm512_reduce_max_ps(amax);
        bool positive = false;
        for (int i = 0; i < 256 && !positive; i += 16) {
            positive = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), _mm512_set1_ps(m), _CMP_EQ_OQ) != 0;
        }
        const float iscale = m != 0.0f ? (positive ? -127.0f / m : 127.0f / m) : 0.0f;
        out[b].d = m != 0.0f ? 1.0f / iscale : 0.0f;
        for (int i = 0; i < 256; i += 16) {
            const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(iscale)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i q = _mm512_cvtps_epi32(r);
            _mm_storeu_si128((__m128i *) (out[b].qs + i), _mm512_cvtsepi32_epi8(q));
            out[b].bsums[i / 16] = (int16_t) _mm512_reduce_add_epi32(q);
        }
    }
}

// y[r] for rows [r0, r0 + n) (multiples of 8) of a repacked q4_K weight of nb blocks per row.
void q4kx8_rows(const q4kx8_block * w, int64_t nb, int64_t r0, int64_t n, const q8k_block * x, float * y) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    // int16 lanes of a [scale r, 0] pair per int32 lane 2r and 2r+1, from int16 [scale 0..7, min 0..7]
    alignas(64) static const int16_t SPREAD[32] = {0,0,0,0, 1,0,1,0, 2,0,2,0, 3,0,3,0, 4,0,4,0, 5,0,5,0, 6,0,6,0, 7,0,7,0};
    const __m512i spread_scales = _mm512_load_si512(SPREAD);
    for (int64_t g = r0 / 8; g < (r0 + n) / 8; ++g) {
        const q4kx8_block * blocks = w + g * nb;
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const q4kx8_block & B = blocks[b];
            const q8k_block & a = x[b];
            const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) B.d)), _mm256_set1_ps(a.d));
            const __m256 ddm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) B.dmin)), _mm256_set1_ps(a.d));
            for (int sb = 0; sb < 4; ++sb) {
                __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();  // int32 lanes 2r, 2r+1: row r
                for (int t = 0; t < 4; ++t) {
                    const __m512i q = _mm512_loadu_si512(B.qs + 64 * (4 * sb + t));
                    int64_t a_lo, a_hi;
                    memcpy(&a_lo, a.qs + 64 * sb + 8 * t, 8);
                    memcpy(&a_hi, a.qs + 64 * sb + 32 + 8 * t, 8);
                    lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(q, low4), _mm512_set1_epi64(a_lo));
                    hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(q, 4), low4), _mm512_set1_epi64(a_hi));
                }
                // each lane sums 16 products (|.| < 2^15): its low int16 times [scale, 0] is exact
                const __m256i sm_lo = _mm256_cvtepu8_epi16(k4_scales_mins_bytes(B.scales + 12 * (2 * sb)));
                const __m256i sm_hi = _mm256_cvtepu8_epi16(k4_scales_mins_bytes(B.scales + 12 * (2 * sb + 1)));
                const __mmask32 even = 0x55555555u;
                const __m512i s_lo = _mm512_maskz_permutexvar_epi16(even, spread_scales, _mm512_castsi256_si512(sm_lo));
                const __m512i s_hi = _mm512_maskz_permutexvar_epi16(even, spread_scales, _mm512_castsi256_si512(sm_hi));
                const __m512i p = _mm512_dpwssd_epi32(_mm512_madd_epi16(lo, s_lo), hi, s_hi);
                const __m256i I = _mm512_cvtepi64_epi32(_mm512_add_epi64(p, _mm512_srli_epi64(p, 32)));  // lanes 2r + 2r+1
                // mins: [min of 2s, min of 2s+1] per row against the column's sums of those sub-blocks
                const __m128i m_lo = _mm256_extracti128_si256(sm_lo, 1), m_hi = _mm256_extracti128_si256(sm_hi, 1);
                const __m256i m_pairs = _mm256_set_m128i(_mm_unpackhi_epi16(m_lo, m_hi), _mm_unpacklo_epi16(m_lo, m_hi));
                const int bs_lo = a.bsums[4 * sb] + a.bsums[4 * sb + 1], bs_hi = a.bsums[4 * sb + 2] + a.bsums[4 * sb + 3];
                const __m256i mins = _mm256_madd_epi16(m_pairs, _mm256_set1_epi32((int) ((uint32_t) (uint16_t) bs_lo | ((uint32_t) (uint16_t) bs_hi << 16))));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), dd, acc);
                accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), ddm, accm);
            }
        }
        _mm256_storeu_ps(y + g * 8 - r0, _mm256_sub_ps(acc, accm));
    }
}

#endif  // AVX-512 VNNI

bool is_kquant(ggml_type t) {
    return t == GGML_TYPE_Q2_K || t == GGML_TYPE_Q3_K || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ||
           t == GGML_TYPE_Q6_K || t == GGML_TYPE_IQ4_XS;
}

}  // namespace

// Are bf16 columns of K values kept as bf16 (for AVX512-BF16's pair instruction, or the AMX tile
// program) rather than widened to f32?
static bool bf16_columns(int64_t K) {
#if defined(__AVX512BF16__)
    (void) K;
    return true;
#else
    return dspark_amx_bf16_available(GGML_TYPE_BF16, K);
#endif
}

bool dspark_own_dot_takes_row_ranges(ggml_type type, int64_t K) {
    return dspark_amx_bf16_available(type, K);
}

bool dspark_own_dot_available(ggml_type type, int64_t K) {
    if (dspark_amx_bf16_available(type, K)) {
        return true;
    }
    if (is_kquant(type)) {
#ifdef DSPARK_KQUANT_SIMD
        return K % 256 == 0;
#else
        return false;
#endif
    }
#ifdef DSPARK_FLOAT_KERNELS
#    if defined(__AVX512BF16__)
    const int64_t step = type == GGML_TYPE_BF16 ? 32 : WIDTH;
#    else
    const int64_t step = WIDTH;
#    endif
    return (type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) && K % step == 0;
#else
    (void) type; (void) K;
    return false;
#endif
}

size_t dspark_own_dot_prepared_size(ggml_type type, int64_t K) {
    if (is_kquant(type)) {
        return sizeof(q8k_block) * (size_t) (K / 256);  // q8_K blocks, values in the weight type's order
    }
    if (type == GGML_TYPE_BF16 && bf16_columns(K)) {
        return sizeof(ggml_bf16_t) * (size_t) K;
    }
    return sizeof(float) * (size_t) K;
}

void dspark_own_dot_prepare(ggml_type type, const float * x, int64_t K, void * prepared) {
#ifdef DSPARK_KQUANT_SIMD
    if (is_kquant(type)) {
        static thread_local std::vector<q8k_block> natural;
        const int64_t nb = K / 256;
        natural.resize((size_t) nb);
        ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(x, natural.data(), K);  // as ggml converts it
        kq_column_block * out = (kq_column_block *) prepared;
        switch (type) {
            case GGML_TYPE_Q2_K:   kq_prepare<q2k_simd>(natural.data(), nb, out); break;
            case GGML_TYPE_Q3_K:   kq_prepare<q3k_simd>(natural.data(), nb, out); break;
            case GGML_TYPE_Q4_K:   kq_prepare<q4k_simd>(natural.data(), nb, out); break;
            case GGML_TYPE_Q5_K:   kq_prepare<q5k_simd>(natural.data(), nb, out); break;
            case GGML_TYPE_Q6_K:   kq_prepare<q6k_simd>(natural.data(), nb, out); break;
            default:               kq_prepare<iq4xs_simd>(natural.data(), nb, out); break;
        }
        return;
    }
#endif
    switch (type) {
        case GGML_TYPE_F16: {
            // ggml multiplies f16 weights by the column rounded to f16 (to nearest, even on ties)
            float * out = (float *) prepared;
            int64_t i = 0;
#if defined(__F16C__)
            for (; i + 8 <= K; i += 8) {
                const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
            }
#endif
            for (; i < K; ++i) {
                out[i] = ggml_fp16_to_fp32(ggml_fp32_to_fp16(x[i]));
            }
            break;
        }
        case GGML_TYPE_BF16: {
            // ... and bf16 weights by the column rounded to bf16 (ggml's own conversion)
            if (bf16_columns(K)) {
                ggml_get_type_traits_cpu(GGML_TYPE_BF16)->from_float(x, prepared, K);
                break;
            }
            float * out = (float *) prepared;
            ggml_get_type_traits_cpu(GGML_TYPE_BF16)->from_float(x, prepared, K);  // in place: bf16 first
            const ggml_bf16_t * b = (const ggml_bf16_t *) prepared;
            for (int64_t i = K - 1; i >= 0; --i) {  // widen from the end: out[i] overlaps b[2i], b[2i+1]
                out[i] = ggml_bf16_to_fp32(b[i]);
            }
            break;
        }
        default:
            memcpy(prepared, x, sizeof(float) * (size_t) K);
            break;
    }
}

void dspark_own_dot_rows(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                         const void * prepared, float * y) {
    if (dspark_amx_bf16_available(type, K)) {
        dspark_amx_bf16_matmul(rows, row_stride, K, n_rows, (const ggml_bf16_t *) prepared, 0, 1, y, 0);
        return;
    }
#ifdef DSPARK_KQUANT_SIMD
    const kq_column_block * col = (const kq_column_block *) prepared;
    switch (type) {
        case GGML_TYPE_Q2_K:   kquant_rows_simd<q2k_simd>(rows, row_stride, K, n_rows, col, y); return;
        case GGML_TYPE_Q3_K:   kquant_rows_simd<q3k_simd>(rows, row_stride, K, n_rows, col, y); return;
        case GGML_TYPE_Q4_K:   kquant_rows_simd<q4k_simd>(rows, row_stride, K, n_rows, col, y); return;
        case GGML_TYPE_Q5_K:   kquant_rows_simd<q5k_simd>(rows, row_stride, K, n_rows, col, y); return;
        case GGML_TYPE_Q6_K:   kquant_rows_simd<q6k_simd>(rows, row_stride, K, n_rows, col, y); return;
        case GGML_TYPE_IQ4_XS: kquant_rows_simd<iq4xs_simd>(rows, row_stride, K, n_rows, col, y); return;
        default: break;
    }
#endif
#ifdef DSPARK_FLOAT_KERNELS
    float_columns_run(type, rows, row_stride, K, n_rows, (const char *) prepared, 0, 1, y, 0);
#endif
}

bool dspark_own_dot_columns_available(ggml_type type, int64_t K) {
    return dspark_amx_bf16_available(type, K) ||
           ((type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) && dspark_own_dot_available(type, K));
}

void dspark_own_dot_rows_columns(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                                 const void * prepared, size_t prepared_stride, int64_t n_cols, float * y, size_t y_stride) {
    if (dspark_amx_bf16_available(type, K)) {
        dspark_amx_bf16_matmul(rows, row_stride, K, n_rows, (const ggml_bf16_t *) prepared, prepared_stride, n_cols, y, y_stride);
        return;
    }
#ifdef DSPARK_FLOAT_KERNELS
    float_columns_run(type, rows, row_stride, K, n_rows, (const char *) prepared, prepared_stride, n_cols, y, y_stride);
#else
    (void) type; (void) rows; (void) row_stride; (void) K; (void) n_rows; (void) prepared; (void) prepared_stride;
    (void) n_cols; (void) y; (void) y_stride;
#endif
}

bool dspark_own_dot_x8_available(ggml_type type, int64_t K) {
#ifdef DSPARK_KQUANT_SIMD
    return type == GGML_TYPE_Q4_K && K % 256 == 0;
#else
    (void) type; (void) K;
    return false;
#endif
}

size_t dspark_own_dot_x8_prepared_size(ggml_type type, int64_t K) {
    (void) type;
    return sizeof(q8k_block) * (size_t) (K / 256);
}

void dspark_own_dot_x8_prepare(ggml_type type, const float * x, int64_t K, void * prepared) {
    (void) type;
#ifdef DSPARK_KQUANT_SIMD
    q8k_quads_prepare(x, K / 256, (q8k_block *) prepared);
#else
    (void) x; (void) K; (void) prepared;
#endif
}

void dspark_own_dot_x8_rows(ggml_type type, const void * data, int64_t K, int64_t r0, int64_t n_rows,
                            const void * prepared, float * y) {
    (void) type;
#ifdef DSPARK_KQUANT_SIMD
    q4kx8_rows((const q4kx8_block *) data, K / 256, r0, n_rows, (const q8k_block *) prepared, y);
#else
    (void) data; (void) K; (void) r0; (void) n_rows; (void) prepared; (void) y;
#endif
}
