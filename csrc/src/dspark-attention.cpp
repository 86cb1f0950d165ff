#include "dspark-attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

// The kernel needs AVX2, FMA and F16C at compile time (this file is built for the machine, see
// csrc/CMakeLists.txt); other builds keep ggml's flash attention.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#    define DSPARK_ATTENTION_SIMD 1
#    include "dspark-simd.h"
#else
#    define DSPARK_ATTENTION_SIMD 0
#endif

#if DSPARK_ATTENTION_SIMD

namespace {

constexpr int64_t BLOCK  = 64;  // cells per block: DSPARK_KV_ALIGN, and ggml's tile of cells
constexpr int64_t TOKENS = 8;   // the most tokens whose rows one work item takes (its buffers, its share)

const ggml_fp16_t F16_NEG_INF = 0xFC00;

// The scale travels in the op's userdata pointer, as its bits: no storage to keep alive.
void * pack_scale(float scale) {
    uint32_t bits;
    memcpy(&bits, &scale, sizeof(bits));
    return (void *) (uintptr_t) bits;
}

float unpack_scale(void * p) {
    const uint32_t bits = (uint32_t) (uintptr_t) p;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return scale;
}

// ---------------------------------------------------------------------------------------------
// The arithmetic is that of ggml's CPU flash attention for batches of 64 queries and more (its
// tiled path, ggml 0.25.3 ops.cpp), repeated here for every query, so that a prefill computes what
// llama.cpp's does (same perplexity and KL divergence) while a decode step of one query still gets
// the bits a prefill would: per 64-cell block, in this order,
//   s[c]  = (Σ_d k_c[d]·q[d], fused multiply-adds in order d = 0..D-1) · scale + mask[c]
//   M'    = max(M, max_c s[c]); on a new maximum o *= expf(M - M'), l *= expf(M - M')
//   p[c]  = exp(s[c] - M') by ggml's vector exp, l += Σ p (vector sums added in double)
//   o    += Σ_c p[c]·v_c (fused multiply-adds in order c = 0..63)
// and at the end out = o · (1 / l). A block a query sees nothing of changes none of its sums.

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// 16 cells a vector, as ggml's build for this machine computes them
using fvec = __m512;
constexpr int64_t W = 16;
inline fvec vzero() { return _mm512_setzero_ps(); }
inline fvec vset1(float x) { return _mm512_set1_ps(x); }
inline fvec vload(const float * p) { return _mm512_loadu_ps(p); }
inline void vstore(float * p, fvec x) { _mm512_storeu_ps(p, x); }
inline fvec vfma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
inline fvec vfnma(fvec a, fvec b, fvec c) { return _mm512_fnmadd_ps(a, b, c); }
inline fvec vmul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
inline fvec vadd(fvec a, fvec b) { return _mm512_add_ps(a, b); }
inline fvec vsub(fvec a, fvec b) { return _mm512_sub_ps(a, b); }
inline fvec vmax(fvec a, fvec b) { return _mm512_max_ps(a, b); }
inline float vmax_all(fvec x) { return _mm512_reduce_max_ps(x); }
inline float vsum_all(fvec x) { return _mm512_reduce_add_ps(x); }  // the compiler's fixed tree, as ggml's

// e^x: x·log2(e) rounded to n by the 1.5·2^23 shift, b = x - n·ln2 in two parts, a degree-5
// polynomial in b, scaled by 2^n; |n| > 192 gives 0 or infinity
inline fvec ggml_exp(fvec x) {
    const fvec shift = vset1(0x1.8p23f);
    const fvec n = vsub(vfma(x, vset1(0x1.715476p+0f), shift), shift);
    const fvec b = vfnma(n, vset1(0x1.7f7d1cp-20f), vfnma(n, vset1(0x1.62e4p-1f), x));
    const fvec b2 = vmul(b, b);
    const fvec hi = vfma(vfma(vset1(0x1.0e4020p-7f), b, vset1(0x1.573e2ep-5f)), b2,
                         vfma(vset1(0x1.555e66p-3f), b, vset1(0x1.fffdb6p-2f)));
    const fvec poly = vfma(hi, b2, vfma(vset1(0x1.ffffecp-1f), b, vset1(1.0f)));
    const fvec res = _mm512_scalef_ps(poly, n);
    const __mmask16 out_of_range = _mm512_cmp_ps_mask(_mm512_abs_ps(n), vset1(192.0f), _CMP_GT_OQ);
    if (!out_of_range) {
        return res;
    }
    const fvec limit = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, vzero(), _CMP_LE_OQ), vset1(INFINITY), vzero());
    return _mm512_mask_blend_ps(out_of_range, res, limit);
}
#else
// 8 cells a vector (AVX2)
using fvec = __m256;
constexpr int64_t W = 8;
inline fvec vzero() { return _mm256_setzero_ps(); }
inline fvec vset1(float x) { return _mm256_set1_ps(x); }
inline fvec vload(const float * p) { return _mm256_loadu_ps(p); }
inline void vstore(float * p, fvec x) { _mm256_storeu_ps(p, x); }
inline fvec vfma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
inline fvec vfnma(fvec a, fvec b, fvec c) { return _mm256_fnmadd_ps(a, b, c); }
inline fvec vmul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
inline fvec vadd(fvec a, fvec b) { return _mm256_add_ps(a, b); }
inline fvec vsub(fvec a, fvec b) { return _mm256_sub_ps(a, b); }
inline fvec vmax(fvec a, fvec b) { return _mm256_max_ps(a, b); }
inline float vmax_all(fvec x) { return dspark_hmax8(x); }
inline float vsum_all(fvec x) {  // ggml's order: halves, then pairs, then the last two
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// e^x as ggml's AVX2 build computes it: the same reduction and polynomial, 2^n applied through
// the exponent bits, with a two-step scaling where |n| > 126 and 0 or infinity past 192
inline fvec ggml_exp(fvec x) {
    const fvec shift = vset1(0x1.8p23f);
    const fvec z = vfma(x, vset1(0x1.715476p+0f), shift);
    const fvec n = vsub(z, shift);
    const fvec b = vfnma(n, vset1(0x1.7f7d1cp-20f), vfnma(n, vset1(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const fvec k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(vset1(1.0f))));
    const fvec abs_n = _mm256_andnot_ps(vset1(-0.0f), n);
    const fvec big = _mm256_cmp_ps(abs_n, vset1(126.0f), _CMP_GT_OQ);
    const fvec b2 = vmul(b, b);
    const fvec poly = vfma(vfma(vfma(vset1(0x1.0e4020p-7f), b, vset1(0x1.573e2ep-5f)), b2,
                                vfma(vset1(0x1.555e66p-3f), b, vset1(0x1.fffdb6p-2f))),
                           b2, vmul(vset1(0x1.ffffecp-1f), b));  // e^b - 1
    if (!_mm256_movemask_ps(big)) {
        return vfma(poly, k, k);
    }
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, vzero(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int) 0x82000000u));
    const fvec s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const fvec s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const fvec huge = _mm256_cmp_ps(abs_n, vset1(192.0f), _CMP_GT_OQ);
    const fvec scaled = _mm256_blendv_ps(vfma(k, poly, k), vmul(vfma(s2, poly, s2), s1), big);
    return _mm256_blendv_ps(scaled, vmul(s1, s1), huge);
}
#endif

constexpr int64_t VECS = BLOCK / W;  // vectors of cells per block

// Values d0..d0+7 of cell c of one head of a [D, n_kv, Hkv] view (F16 or F32) as f32 (exact).
inline __m256 load8(const ggml_tensor * t, int64_t head, int64_t c, int64_t d0) {
    const char * src = (const char *) t->data + c * t->nb[1] + head * t->nb[2];
    if (t->type == GGML_TYPE_F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) ((const ggml_fp16_t *) src + d0)));
    }
    return _mm256_loadu_ps((const float *) src + d0);
}

// Cache rows are strided in a head's view (every head of a cell side by side), a pattern the
// hardware prefetchers follow poorly: the loads below ask for the cell AHEAD cells on from the one
// they read, so a decode step, which reads each cell once, no longer waits on memory for each
// (SmolLM2-135M iq4_nl at 500 cells, two Zen 4 cores: a step 6.3 -> 5.0 ms; 4.7 with the cache
// rows always in cache; 12 to 48 cells ahead gave the same).
constexpr int64_t AHEAD = 24;

inline void prefetch_cell(const ggml_tensor * t, int64_t head, int64_t c) {
    if (c < t->ne[1]) {
        const char * src = (const char *) t->data + c * t->nb[1] + head * t->nb[2];
        for (size_t b = 0; b < (size_t) t->ne[0] * ggml_type_size(t->type); b += 64) {
            _mm_prefetch(src + b, _MM_HINT_T0);
        }
    }
}

// The values of cells [c0, c0 + n) as rows of D (row c at c·D); rows n..BLOCK-1 zeros.
void load_values(const ggml_tensor * t, int64_t head, int64_t c0, int64_t n, float * out) {
    const int64_t D = t->ne[0];
    for (int64_t c = 0; c < n; ++c) {
        prefetch_cell(t, head, c0 + c + AHEAD);
        for (int64_t d0 = 0; d0 < D; d0 += 8) {
            _mm256_storeu_ps(out + c * D + d0, load8(t, head, c0 + c, d0));
        }
    }
    memset(out + n * D, 0, sizeof(float) * (BLOCK - n) * D);
}

// r[i] (row i of an 8x8 tile) becomes column i.
inline void transpose8(__m256 r[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
        b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xEE);
        b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
        b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(b[i], b[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(b[i], b[i + 4], 0x31);
    }
}

// The keys of cells [c0, c0 + n) transposed (value d of cell c at d·BLOCK + c), so that a vector
// holds one dimension of consecutive cells; cells n..BLOCK-1 zeros.
void load_keys_transposed(const ggml_tensor * t, int64_t head, int64_t c0, int64_t n, float * out) {
    const int64_t D = t->ne[0];
    for (int64_t c = 0; c < BLOCK; c += 8) {
        for (int64_t i = 0; i < 8; ++i) {
            prefetch_cell(t, head, c0 + c + i + AHEAD);
        }
        for (int64_t d0 = 0; d0 < D; d0 += 8) {
            __m256 r[8];
            for (int64_t i = 0; i < 8; ++i) {
                r[i] = c + i < n ? load8(t, head, c0 + c + i, d0) : _mm256_setzero_ps();
            }
            transpose8(r);
            for (int64_t j = 0; j < 8; ++j) {
                _mm256_storeu_ps(out + (d0 + j) * BLOCK + c, r[j]);
            }
        }
    }
}

// Whether a token's mask row shows any of the block's first n cells: a whole block's 64 f16 values
// are compared 16 at a time (a decode step of many sequences asks this of every block of every
// other sequence, on every layer and KV head).
bool block_visible(const ggml_fp16_t * mrow, int64_t n) {
    if (n == BLOCK) {
        const __m256i neg_inf = _mm256_set1_epi16((short) F16_NEG_INF);
        __m256i hidden = _mm256_set1_epi16(-1);
        for (int64_t c = 0; c < BLOCK; c += 16) {
            const __m256i m = _mm256_loadu_si256((const __m256i *) (mrow + c));
            hidden = _mm256_and_si256(hidden, _mm256_cmpeq_epi16(m, neg_inf));
        }
        return _mm256_movemask_epi8(hidden) != -1;
    }
    for (int64_t c = 0; c < n; ++c) {
        if (mrow[c] != F16_NEG_INF) {
            return true;
        }
    }
    return false;
}

// The mask of a token over the block's cells as f32, cells at or past n hidden (-inf).
void load_mask(const ggml_fp16_t * mrow, int64_t n, float * out) {
    int64_t c = 0;
    if (mrow) {
        for (; c + 8 <= n; c += 8) {
            _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (mrow + c))));
        }
    }
    for (; c < BLOCK; ++c) {
        out[c] = c >= n ? -INFINITY : mrow ? _cvtsh_ss(mrow[c]) : 0.0f;
    }
}

// Query rows of one token (the heads of a KV group, which share its mask) go through a block
// together, a few at a time: each key and value vector is loaded once for all of them. Each row's
// sums are the ones it gets alone, in the same order.
constexpr int64_t MAX_ROWS = 4;
constexpr int64_t REGS     = W == 16 ? 32 : 16;  // vector registers

// The rows one call scores with nv vectors of cells: keys (nv), accumulators (rows·nv) and a
// broadcast fit in the registers.
constexpr int64_t rows_per_call(int64_t nv) {
    return std::clamp<int64_t>((REGS - 1 - nv) / nv, 1, MAX_ROWS);
}

struct work_buffers {
    std::vector<float> k, v, p, o, m, l;
    std::vector<float> mask;       // one token's mask over the block, shared by the heads of the group
    std::vector<const float *> q;  // the queries of one token's rows
};

// s = q_r·k_c · scale + mask for rows r < R and the first NV vectors of cells of the block, into
// p + r·BLOCK; top[r] = the largest of row r. (NV and R constants: the sums stay in registers.)
template <int64_t NV, int64_t R>
void block_scores_of(const float * const * q, const float * kt, int64_t D, float scale, const float * mask, float * p,
                     float * top) {
    fvec acc[R][NV];
    for (int64_t r = 0; r < R; ++r) {
        for (int64_t i = 0; i < NV; ++i) {
            acc[r][i] = vzero();
        }
    }
    for (int64_t d = 0; d < D; ++d) {
        fvec kd[NV];
        for (int64_t i = 0; i < NV; ++i) {
            kd[i] = vload(kt + d * BLOCK + i * W);
        }
        for (int64_t r = 0; r < R; ++r) {
            const fvec qd = vset1(q[r][d]);
            for (int64_t i = 0; i < NV; ++i) {
                acc[r][i] = vfma(kd[i], qd, acc[r][i]);
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        fvec t = vset1(-INFINITY);
        for (int64_t i = 0; i < NV; ++i) {
            const fvec s = vadd(vmul(acc[r][i], vset1(scale)), vload(mask + i * W));
            vstore(p + r * BLOCK + i * W, s);
            t = vmax(t, s);
        }
        top[r] = vmax_all(t);
    }
}

using scores_fn = void (*)(const float * const *, const float *, int64_t, float, const float *, float *, float *);

template <int64_t NV, size_t... R>
constexpr std::array<scores_fn, MAX_ROWS> scores_by_rows(std::index_sequence<R...>) {
    return {block_scores_of<NV, (int64_t) R + 1>...};
}

template <size_t... NV>
constexpr std::array<std::array<scores_fn, MAX_ROWS>, sizeof...(NV)> scores_by_vectors(std::index_sequence<NV...>) {
    return {scores_by_rows<(int64_t) NV + 1>(std::make_index_sequence<MAX_ROWS>{})...};
}

// SCORES[nv - 1][rows - 1]: block_scores_of for nv vectors of cells and that many rows.
constexpr auto SCORES = scores_by_vectors(std::make_index_sequence<VECS>{});

// The vectors of cells that hold the first nc cells of a block. The cells past nc are masked and
// add exp(-inf) = 0 to every sum, so the vectors wholly past nc (at the end of a sequence's cells)
// are neither scored nor added.
inline int64_t vectors_in_use(int64_t nc) { return (nc + W - 1) / W; }

// o_r += Σ_c p_r[c]·v_c over the first nc cells (the rest have p = 0) for rows r < R, D values of
// each o at a time in registers.
template <int64_t R>
void accumulate_values_of(const float * const * p, const float * v, int64_t nc, int64_t D, float * const * o) {
    constexpr int64_t PASS = std::min<int64_t>(8, (REGS - 1 - R) / R) * W;
    for (int64_t d0 = 0; d0 < D; d0 += PASS) {
        const int64_t nv = std::min<int64_t>(PASS, D - d0) / W;
        fvec acc[R][PASS / W];
        for (int64_t r = 0; r < R; ++r) {
            for (int64_t j = 0; j < nv; ++j) {
                acc[r][j] = vload(o[r] + d0 + j * W);
            }
        }
        for (int64_t c = 0; c < nc; ++c) {
            for (int64_t j = 0; j < nv; ++j) {
                const fvec vc = vload(v + c * D + d0 + j * W);
                for (int64_t r = 0; r < R; ++r) {
                    acc[r][j] = vfma(vc, vset1(p[r][c]), acc[r][j]);
                }
            }
        }
        for (int64_t r = 0; r < R; ++r) {
            for (int64_t j = 0; j < nv; ++j) {
                vstore(o[r] + d0 + j * W, acc[r][j]);
            }
        }
    }
}

using accumulate_fn = void (*)(const float * const *, const float *, int64_t, int64_t, float * const *);

template <size_t... R>
constexpr std::array<accumulate_fn, MAX_ROWS> accumulate_by_rows(std::index_sequence<R...>) {
    return {accumulate_values_of<(int64_t) R + 1>...};
}

// ACCUMULATE[rows - 1]: accumulate_values_of for that many rows.
constexpr auto ACCUMULATE = accumulate_by_rows(std::make_index_sequence<MAX_ROWS>{});

// Row i's running softmax takes the block's scores p (with their largest, top): rescaled to a new
// maximum, p becomes exp(s - M) in place and l adds its sum. False if the row sees none of it.
bool update_softmax(float top, float * p, int64_t nc, int64_t D, work_buffers & w, int64_t i) {
    if (top == -INFINITY) {
        return false;  // nothing of this block is visible to the query
    }
    float & m = w.m[i];
    float & l = w.l[i];
    float * o = w.o.data() + i * D;
    const float m_new = std::max(m, top);
    if (m_new > m) {
        const float shrink = expf(m - m_new);
        for (int64_t d = 0; d < D; ++d) {
            o[d] *= shrink;
        }
        l *= shrink;
    }
    m = m_new;
    double sum = 0.0;
    for (int64_t v = 0; v < vectors_in_use(nc); ++v) {
        const fvec e = ggml_exp(vsub(vload(p + v * W), vset1(m_new)));
        vstore(p + v * W, e);
        sum += (double) vsum_all(e);
    }
    l = (float) ((double) l + sum);
    return true;
}

// Fold one block into the running softmaxes of n query rows of one token: q[j] is the query of
// buffer row i0 + j.
void fold_rows(const float * const * q, int64_t i0, int64_t n, int64_t nc, int64_t D, float scale, work_buffers & w) {
    const int64_t nv = vectors_in_use(nc), per_call = rows_per_call(nv);
    for (int64_t j0 = 0; j0 < n; j0 += per_call) {
        const int64_t R = std::min(per_call, n - j0);
        float top[MAX_ROWS];
        SCORES[nv - 1][R - 1](q + j0, w.k.data(), D, scale, w.mask.data(), w.p.data(), top);
        const float * p[MAX_ROWS];
        float * o[MAX_ROWS];
        int64_t k = 0;
        for (int64_t j = 0; j < R; ++j) {
            float * pj = w.p.data() + j * BLOCK;
            if (update_softmax(top[j], pj, nc, D, w, i0 + j0 + j)) {
                p[k] = pj;
                o[k++] = w.o.data() + (i0 + j0 + j) * D;
            }
        }
        if (k > 0) {
            ACCUMULATE[k - 1](p, w.v.data(), nc, D, o);
        }
    }
}

// Query rows [r0, r1) of KV head hkv, block by block. The head's rows are token-major, then the
// query heads of its group: row r is token r / G, query head hkv·G + r % G.
void attend(ggml_tensor * dst, int64_t hkv, int64_t r0, int64_t r1, float scale, work_buffers & w) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const int64_t D = q->ne[0], H = q->ne[1], n_kv = k->ne[1], Hkv = k->ne[2], G = H / Hkv;
    const int64_t t0 = r0 / G, t1 = (r1 - 1) / G + 1;  // the tokens of the rows
    w.k.resize((size_t) (BLOCK * D));
    w.v.resize((size_t) (BLOCK * D));
    w.p.resize((size_t) (MAX_ROWS * BLOCK));
    w.mask.resize((size_t) BLOCK);
    w.q.resize((size_t) G);
    w.o.assign((size_t) ((r1 - r0) * D), 0.0f);
    w.m.assign((size_t) (r1 - r0), -INFINITY);
    w.l.assign((size_t) (r1 - r0), 0.0f);
    for (int64_t c0 = 0; c0 < n_kv; c0 += BLOCK) {
        const int64_t nc = std::min(BLOCK, n_kv - c0);
        bool loaded = false;
        for (int64_t t = t0; t < t1; ++t) {
            const ggml_fp16_t * mrow = mask ? (const ggml_fp16_t *) ((const char *) mask->data + t * mask->nb[1]) : nullptr;
            if (mrow && !block_visible(mrow + c0, nc)) {
                continue;  // a block this token sees nothing of changes none of its sums
            }
            if (!loaded) {
                load_keys_transposed(k, hkv, c0, nc, w.k.data());
                load_values(v, hkv, c0, nc, w.v.data());
                loaded = true;
            }
            load_mask(mrow ? mrow + c0 : nullptr, nc, w.mask.data());
            const int64_t ra = std::max(r0, t * G), rb = std::min(r1, (t + 1) * G);
            for (int64_t r = ra; r < rb; ++r) {
                w.q[r - ra] = (const float *) ((const char *) q->data + t * q->nb[2] + (hkv * G + r % G) * q->nb[1]);
            }
            fold_rows(w.q.data(), ra - r0, rb - ra, nc, D, scale, w);
        }
    }
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = r - r0;
        float * out = (float *) ((char *) dst->data + (r / G) * dst->nb[2] + (hkv * G + r % G) * dst->nb[1]);
        const float inv = w.l[i] == 0.0f ? 0.0f : 1.0f / w.l[i];  // a query that sees no cell: zeros
        for (int64_t d = 0; d < D; ++d) {
            out[d] = w.o[(size_t) (i * D + d)] * inv;
        }
    }
}

// The work is every query row of every KV head, numbered head by head (u = hkv·T·G + r), cut into
// items of equal size: a multiple of nth of them, of at most TOKENS tokens' rows each, taken in turn
// by the threads. So the threads get the same number of rows whatever the batch (a decode step's
// 9 rows of SmolLM2's 3 KV heads: 5 and 4, not 6 and 3; a 9-token verify: 42 and 39, not 51 and
// 30), and a prefill's items still alternate along the causal mask. Which thread computes a row,
// and with which others, changes nothing in how it is computed.
void attention_task(ggml_tensor * dst, int ith, int nth, void * userdata) {
    static thread_local work_buffers w;
    const int64_t T = dst->src[0]->ne[2], H = dst->src[0]->ne[1], Hkv = dst->src[1]->ne[2], G = H / Hkv;
    const int64_t rows_per_head = T * G, n_rows = Hkv * rows_per_head, max_item = TOKENS * G;
    const int64_t n_items = nth * ((n_rows + nth * max_item - 1) / (nth * max_item));
    const int64_t item_rows = (n_rows + n_items - 1) / n_items;
    for (int64_t item = ith; item < n_items; item += nth) {
        const int64_t u1 = std::min(n_rows, (item + 1) * item_rows);
        for (int64_t u = item * item_rows; u < u1;) {  // the item's rows, one KV head at a time
            const int64_t hkv = u / rows_per_head, r0 = u % rows_per_head;
            const int64_t r1 = std::min(rows_per_head, r0 + (u1 - u));
            attend(dst, hkv, r0, r1, unpack_scale(userdata), w);
            u += r1 - r0;
        }
    }
}

bool cache_type_ok(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_F32;
}

}  // namespace

bool dspark_attention_cpu_available() {
    return true;
}

bool dspark_attention_cpu_supports(const ggml_tensor * k, const ggml_tensor * v, const ggml_tensor * mask) {
    return cache_type_ok(k) && cache_type_ok(v) && k->ne[0] % W == 0 && v->ne[0] == k->ne[0] &&
           (!mask || mask->type == GGML_TYPE_F16);
}

ggml_tensor * dspark_attention_cpu(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                   ggml_tensor * mask, float scale) {
    ggml_tensor * args[4] = {q, k, v, mask};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, q->ne[0], q->ne[1], q->ne[2], 1, args, mask ? 4 : 3, attention_task,
                          GGML_N_TASKS_MAX, pack_scale(scale));
}

#else  // no SIMD kernel in this build

bool dspark_attention_cpu_available() {
    return false;
}

bool dspark_attention_cpu_supports(const ggml_tensor *, const ggml_tensor *, const ggml_tensor *) {
    return false;
}

ggml_tensor * dspark_attention_cpu(ggml_context *, ggml_tensor *, ggml_tensor *, ggml_tensor *, ggml_tensor *, float) {
    return nullptr;  // never called: dspark_attention_cpu_supports said no
}

#endif
