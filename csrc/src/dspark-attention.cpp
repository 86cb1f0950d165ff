#include "dspark-attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

constexpr int64_t BLOCK  = 64;  // cells per block: DSPARK_KV_ALIGN
constexpr int64_t GROUP  = 8;   // cells scored at once (one AVX2 vector)
constexpr int64_t TOKENS = 8;   // tokens per work item, with all the query heads of one KV head

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

// Cells [c0, c0 + n) of one head of a [D, n_kv, Hkv] view as f32 rows of D; the rows after them up
// to the next multiple of GROUP are zeros (scored, then masked out).
void load_block(const ggml_tensor * t, int64_t head, int64_t c0, int64_t n, float * out) {
    const int64_t D = t->ne[0];
    const int64_t padded = (n + GROUP - 1) / GROUP * GROUP;
    for (int64_t c = 0; c < padded; ++c) {
        float * dst = out + c * D;
        if (c >= n) {
            memset(dst, 0, sizeof(float) * D);
            continue;
        }
        const char * src = (const char *) t->data + (c0 + c) * t->nb[1] + head * t->nb[2];
        if (t->type == GGML_TYPE_F16) {
            const ggml_fp16_t * x = (const ggml_fp16_t *) src;
            for (int64_t d = 0; d < D; d += 8) {
                _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + d))));
            }
        } else {
            memcpy(dst, src, sizeof(float) * D);
        }
    }
}

// q · k_j for the 8 rows k_0 .. k_7 (consecutive, D floats each), in one vector; a fixed tree.
inline __m256 dot8(const float * q, const float * k, int64_t D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 0 * D + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 1 * D + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * D + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * D + d), a3);
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 4 * D + d), a4);
        a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 5 * D + d), a5);
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 6 * D + d), a6);
        a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 7 * D + d), a7);
    }
    const __m256 h0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  // halves of 4 sums
    const __m256 h4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

// The mask of cells [c, c + 8) of a row as f32, cells at or past n hidden (-inf).
inline __m256 mask8(const ggml_fp16_t * mrow, int64_t c, int64_t n) {
    ggml_fp16_t m[GROUP];
    for (int64_t j = 0; j < GROUP; ++j) {
        m[j] = c + j >= n ? F16_NEG_INF : mrow ? mrow[c + j] : 0;
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) m));
}

// o = alpha · o + sum_c p[c] · v_c, 64 values of o at a time held in registers across the cells.
inline void accumulate_values(const float * p, const float * v, int64_t nc, int64_t D, float alpha, float * o) {
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int64_t nd = std::min<int64_t>(64, D - d0) / 8;  // vectors in this slice (D % 8 == 0)
        __m256 acc[8];
        for (int64_t j = 0; j < nd; ++j) {
            acc[j] = _mm256_mul_ps(_mm256_loadu_ps(o + d0 + 8 * j), va);
        }
        for (int64_t c = 0; c < nc; ++c) {
            if (p[c] == 0.0f) {
                continue;  // a hidden cell: adding its zero would change nothing
            }
            const __m256 pc = _mm256_set1_ps(p[c]);
            const float * vc = v + c * D + d0;
            for (int64_t j = 0; j < nd; ++j) {
                acc[j] = _mm256_fmadd_ps(pc, _mm256_loadu_ps(vc + 8 * j), acc[j]);
            }
        }
        for (int64_t j = 0; j < nd; ++j) {
            _mm256_storeu_ps(o + d0 + 8 * j, acc[j]);
        }
    }
}

struct work_buffers {
    std::vector<float> k, v, s, o, m, l;
    std::vector<float> mask;  // one token's mask over the block, shared by the heads of the group
};

// Fold one block into query row r's running softmax: scores, weights, the weighted sum of values.
void fold_row(const float * qv, int64_t nc, int64_t D, float scale, work_buffers & w, int64_t r) {
    const int64_t ng = (nc + GROUP - 1) / GROUP;
    float * s = w.s.data();
    const __m256 vscale = _mm256_set1_ps(scale);
    float bm = -INFINITY;
    for (int64_t g = 0; g < ng; ++g) {
        const __m256 mv = _mm256_loadu_ps(w.mask.data() + g * GROUP);
        const __m256 sv = _mm256_add_ps(_mm256_mul_ps(dot8(qv, w.k.data() + g * GROUP * D, D), vscale), mv);
        _mm256_storeu_ps(s + g * GROUP, sv);
    }
    for (int64_t c = 0; c < ng * GROUP; ++c) {
        bm = std::max(bm, s[c]);
    }
    if (bm == -INFINITY) {
        return;  // nothing of this block is visible to the query
    }
    float & m = w.m[r];
    const float m_new = std::max(m, bm);
    const float alpha = m == -INFINITY ? 0.0f : std::exp(m - m_new);
    const __m256 mv_new = _mm256_set1_ps(m_new), neg_inf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    __m256 acc = zero;
    for (int64_t g = 0; g < ng; ++g) {
        const __m256 x = _mm256_loadu_ps(s + g * GROUP);
        const __m256 p = _mm256_blendv_ps(dspark_exp8(_mm256_sub_ps(x, mv_new)), zero, _mm256_cmp_ps(x, neg_inf, _CMP_EQ_OQ));
        _mm256_storeu_ps(s + g * GROUP, p);
        acc = _mm256_add_ps(acc, p);
    }
    accumulate_values(s, w.v.data(), nc, D, alpha, w.o.data() + r * D);
    w.l[r] = w.l[r] * alpha + dspark_hsum8(acc);
    m = m_new;
}

// The queries of tokens [t0, t1) over KV head hkv, block by block.
void attend(ggml_tensor * dst, int64_t hkv, int64_t t0, int64_t t1, float scale, work_buffers & w) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    const int64_t D = q->ne[0], H = q->ne[1], n_kv = k->ne[1], Hkv = k->ne[2], G = H / Hkv;
    const int64_t R = (t1 - t0) * G;  // query rows: token-major, then the heads of the group
    w.k.resize((size_t) (BLOCK * D));
    w.v.resize((size_t) (BLOCK * D));
    w.s.resize((size_t) BLOCK);
    w.mask.resize((size_t) BLOCK);
    w.o.assign((size_t) (R * D), 0.0f);
    w.m.assign((size_t) R, -INFINITY);
    w.l.assign((size_t) R, 0.0f);
    for (int64_t c0 = 0; c0 < n_kv; c0 += BLOCK) {
        const int64_t nc = std::min(BLOCK, n_kv - c0);
        bool loaded = false;
        for (int64_t t = t0; t < t1; ++t) {
            const ggml_fp16_t * mrow = mask ? (const ggml_fp16_t *) ((const char *) mask->data + t * mask->nb[1]) : nullptr;
            bool visible = !mrow;
            for (int64_t c = 0; c < nc && !visible; ++c) {
                visible = mrow[c0 + c] != F16_NEG_INF;
            }
            if (!visible) {
                continue;  // a block this token sees nothing of changes none of its sums
            }
            if (!loaded) {
                load_block(k, hkv, c0, nc, w.k.data());
                load_block(v, hkv, c0, nc, w.v.data());
                loaded = true;
            }
            for (int64_t g = 0; g < nc; g += GROUP) {
                _mm256_storeu_ps(w.mask.data() + g, mask8(mrow ? mrow + c0 : nullptr, g, nc));
            }
            for (int64_t g = 0; g < G; ++g) {
                const float * qv = (const float *) ((const char *) q->data + t * q->nb[2] + (hkv * G + g) * q->nb[1]);
                fold_row(qv, nc, D, scale, w, (t - t0) * G + g);
            }
        }
    }
    for (int64_t t = t0; t < t1; ++t) {
        for (int64_t g = 0; g < G; ++g) {
            const int64_t r = (t - t0) * G + g;
            float * out = (float *) ((char *) dst->data + t * dst->nb[2] + (hkv * G + g) * dst->nb[1]);
            const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;  // a query that sees no cell: zeros
            for (int64_t d = 0; d < D; ++d) {
                out[d] = w.o[(size_t) (r * D + d)] * inv;
            }
        }
    }
}

// Thread ith of nth takes every nth (KV head, tokens) item: which thread computes a query changes
// nothing in how it is computed.
void attention_task(ggml_tensor * dst, int ith, int nth, void * userdata) {
    static thread_local work_buffers w;
    const int64_t T = dst->src[0]->ne[2], Hkv = dst->src[1]->ne[2];
    const int64_t n_chunks = (T + TOKENS - 1) / TOKENS;
    for (int64_t item = ith; item < Hkv * n_chunks; item += nth) {
        const int64_t hkv = item % Hkv, chunk = item / Hkv;
        attend(dst, hkv, chunk * TOKENS, std::min(T, (chunk + 1) * TOKENS), unpack_scale(userdata), w);
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
    return cache_type_ok(k) && cache_type_ok(v) && k->ne[0] % GROUP == 0 && v->ne[0] == k->ne[0] &&
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
