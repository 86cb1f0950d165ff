#include "dspark-matmul-kernels.h"

#include "ggml-cpu.h"

#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#    include <immintrin.h>
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// float weights: llamafile's per-output arithmetic. Each output is one vector of partial sums
// over the row in steps of the vector width (fused multiply-add), reduced at the end; the vector
// is 16 floats with AVX-512, 8 with AVX2, and bf16 pairs go through the dot-product instruction
// where AVX512-BF16 has it.

constexpr int ROWS_AT_ONCE = 4;  // independent rows interleaved to fill the FMA pipelines

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

// The column is kept as f32 (exactly the values ggml's f16 conversion gives, for f16 weights).
template <typename W, vec (*load_w)(const W *)>
void float_rows(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const float * x, float * y) {
    int64_t r = 0;
    for (; r + ROWS_AT_ONCE <= n_rows; r += ROWS_AT_ONCE) {
        vec acc[ROWS_AT_ONCE];
        const W * w[ROWS_AT_ONCE];
        for (int i = 0; i < ROWS_AT_ONCE; ++i) {
            acc[i] = vzero();
            w[i] = (const W *) (rows + (r + i) * row_stride);
        }
        for (int64_t l = 0; l < K; l += WIDTH) {
            const vec xv = load_f32(x + l);
            for (int i = 0; i < ROWS_AT_ONCE; ++i) {
                acc[i] = madd(load_w(w[i] + l), xv, acc[i]);
            }
        }
        for (int i = 0; i < ROWS_AT_ONCE; ++i) {
            y[r + i] = hsum(acc[i]);
        }
    }
    for (; r < n_rows; ++r) {
        const W * w = (const W *) (rows + r * row_stride);
        vec acc = vzero();
        for (int64_t l = 0; l < K; l += WIDTH) {
            acc = madd(load_w(w + l), load_f32(x + l), acc);
        }
        y[r] = hsum(acc);
    }
}

#    if defined(__AVX512BF16__)
// bf16 · bf16 in pairs (the instruction's own rounding), 32 values per step.
void bf16_pair_rows(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const ggml_bf16_t * x, float * y) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const ggml_bf16_t * w = (const ggml_bf16_t *) (rows + r * row_stride);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t l = 0; l < K; l += 32) {
            acc = _mm512_dpbf16_ps(acc, (__m512bh) _mm512_loadu_ps((const float *) (w + l)),
                                   (__m512bh) _mm512_loadu_ps((const float *) (x + l)));
        }
        y[r] = _mm512_reduce_add_ps(acc);
    }
}
#    endif

#endif  // DSPARK_FLOAT_KERNELS

}  // namespace

bool dspark_own_dot_available(ggml_type type, int64_t K) {
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
#if defined(__AVX512BF16__)
    if (type == GGML_TYPE_BF16) {
        return sizeof(ggml_bf16_t) * (size_t) K;
    }
#endif
    (void) type;
    return sizeof(float) * (size_t) K;
}

void dspark_own_dot_prepare(ggml_type type, const float * x, int64_t K, void * prepared) {
    switch (type) {
        case GGML_TYPE_F16: {
            // ggml multiplies f16 weights by the column rounded to f16
            float * out = (float *) prepared;
            for (int64_t i = 0; i < K; ++i) {
                out[i] = ggml_fp16_to_fp32(ggml_fp32_to_fp16(x[i]));
            }
            break;
        }
        case GGML_TYPE_BF16: {
            // ... and bf16 weights by the column rounded to bf16 (ggml's own conversion)
#if defined(__AVX512BF16__)
            ggml_get_type_traits_cpu(GGML_TYPE_BF16)->from_float(x, prepared, K);
#else
            float * out = (float *) prepared;
            ggml_get_type_traits_cpu(GGML_TYPE_BF16)->from_float(x, prepared, K);  // in place: bf16 first
            const ggml_bf16_t * b = (const ggml_bf16_t *) prepared;
            for (int64_t i = K - 1; i >= 0; --i) {  // widen from the end: out[i] overlaps b[i..2i+1]
                out[i] = ggml_bf16_to_fp32(b[i]);
            }
#endif
            break;
        }
        default:
            memcpy(prepared, x, sizeof(float) * (size_t) K);
            break;
    }
}

void dspark_own_dot_rows(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows,
                         const void * prepared, float * y) {
#ifdef DSPARK_FLOAT_KERNELS
    switch (type) {
        case GGML_TYPE_F32:
            float_rows<float, load_f32>(rows, row_stride, K, n_rows, (const float *) prepared, y);
            return;
        case GGML_TYPE_F16:
            float_rows<ggml_fp16_t, load_f16>(rows, row_stride, K, n_rows, (const float *) prepared, y);
            return;
        case GGML_TYPE_BF16:
#    if defined(__AVX512BF16__)
            bf16_pair_rows(rows, row_stride, K, n_rows, (const ggml_bf16_t *) prepared, y);
#    else
            float_rows<ggml_bf16_t, load_bf16>(rows, row_stride, K, n_rows, (const float *) prepared, y);
#    endif
            return;
        default:
            break;
    }
#endif
    (void) type; (void) rows; (void) row_stride; (void) K; (void) n_rows; (void) prepared; (void) y;
}
