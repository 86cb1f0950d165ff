// The blocks kernel's AVX2 build (dspark-matmul-blocks-isa.h), for x86-64 CPUs without AVX-512
// VNNI (AMD Zen 1-3, Intel client cores up to Alder Lake's). Built with AVX2 + FMA + F16C flags of
// its own (csrc/CMakeLists.txt); nothing here runs unless dspark-matmul-blocks.cpp sent the call.
//
// The same exact integers and the same float chain as the VNNI build, per (row, column) and block:
//     acc = fma(float(i_b), d_w·d_x, acc)        (and for q4_1, q5_1:  acc = fma(m_w, s_x, acc))
// with eight rows in the lanes of a vector. Without VNNI the integers come from VPMADDUBSW
// (unsigned x signed bytes, pairs summed into 16 bits) and VPMADDWD (pairs of those into 32 bits),
// which are exact while no 16-bit sum overflows:
//   nibble types: codes 0..31 times column codes of at most 127: a pair is at most 7,874, and four
//                 pairs (a dword's share of four products) add to at most 31,496 in 16 bits;
//   q8_0:         the weight's magnitude (0..128) times the column code with the weight's sign:
//                 a pair is at most 32,512 and goes to 32 bits at once.
//
// The packed layout: a group of 16 rows is two halves of 8, each one stream of its blocks, and each
// block of a half the 8 rows' bytes rearranged (the same count) so that lane i holds row i:
//     codes  q8_0: 8 vectors, dword j of lane i = codes 4j..4j+3 (signed)
//            nibble types: 4 vectors, dword q of lane i = qs bytes 4q..4q+3 (values 4q.. low,
//            16 + 4q.. high)
//     qh     (q5) lane i = the row's 32 fifth bits reordered: bit m of byte k = the bit of value
//            4m + k, so that the bits of vector j's four values are one shift away from bit 4
//     d, m   8 f16 each (m: q4_1, q5_1)
// The plain layout is packed a group at a time on the spot, into the same form.
#include "dspark-matmul-blocks-isa.h"
#include "dspark-column-passes.h"

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef DSPARK_BLOCKS_KERNELS
#    include <immintrin.h>

namespace {

using column_block = dspark_blocks_column;

constexpr int HALF = 8;         // rows in a vector's lanes
constexpr int MAX_COLUMNS = 16; // columns per pass over a half's blocks (their sums stay in L1)

// A block of 8 rows made ready: the codes (value + OFFSET, or q8_0's magnitudes), and the scales.
struct rows_block {
    __m256i w[8];
    const char * signs;  // q8_0: the signed codes, vector j at signs + 32 j
    __m256  d, m;
};

inline int32_t dword(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// Byte k of a dword: the four values' bits, bit m of byte k = bit 4m + k of the row's qh.
inline uint32_t reorder_fifth_bits(uint32_t qh) {
    uint32_t out = 0;
    for (int v = 0; v < 32; ++v) {
        out |= ((qh >> v) & 1u) << (8 * (v % 4) + v / 4);
    }
    return out;
}

// Vector j's fifth bits at bit 4 of each byte: bit j of each byte of the reordered qh (a shift
// within the byte, no bit from a neighbour reaching bit 4).
template <int J>
inline __m256i fifth_bits(__m256i qh) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    if constexpr (J <= 4) {
        return _mm256_and_si256(_mm256_slli_epi32(qh, 4 - J), bit4);
    } else {
        return _mm256_and_si256(_mm256_srli_epi32(qh, J - 4), bit4);
    }
}

// Σ value·code per lane for q8_0's signed codes (w.w their magnitudes, w.signs the codes): |w| times the column code carrying w's sign, two products to 16 bits, then to 32 at once
// (a pair may reach 32,512).
inline __m256i signed_products(const rows_block & w, const column_block & x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();
    for (int j = 0; j < 8; j += 2) {
        const __m256i s0 = _mm256_sign_epi8(_mm256_set1_epi32(dword(x.qs + 4 * j)),
                                            _mm256_loadu_si256((const __m256i *) (w.signs + 32 * j)));
        const __m256i s1 = _mm256_sign_epi8(_mm256_set1_epi32(dword(x.qs + 4 * j + 4)),
                                            _mm256_loadu_si256((const __m256i *) (w.signs + 32 * j + 32)));
        i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(w.w[j], s0), ones));
        i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(_mm256_maddubs_epi16(w.w[j + 1], s1), ones));
    }
    return _mm256_add_epi32(i0, i1);
}

struct w_q8_0 {
    static constexpr size_t BYTES = 34, CODE_BYTES = 256;
    static constexpr int32_t OFFSET = 0;
    static constexpr bool HAS_MIN = false, HAS_QH = false;
    static void pack_codes(const char * const row[HALF], size_t off, char * codes, char *) {
        for (int j = 0; j < 8; ++j) {
            for (int i = 0; i < HALF; ++i) {
                memcpy(codes + 32 * j + 4 * i, row[i] + off + 2 + 4 * j, 4);
            }
        }
    }
    static void unpack_codes(const char * codes, const char *, rows_block & w) {
        for (int j = 0; j < 8; ++j) {
            w.w[j] = _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *) (codes + 32 * j)));
        }
        w.signs = codes;
    }
    static __m256i products(const rows_block & w, const column_block & x) {
        return signed_products(w, x);
    }
};

template <size_t BYTES_, size_t QS, size_t QH_, bool MIN>
struct w_nibbles {
    static constexpr size_t BYTES = BYTES_, QH = QH_, CODE_BYTES = 128;
    static constexpr int32_t OFFSET = MIN ? 0 : QH_ ? 16 : 8;  // q4_0 codes are value + 8, q5_0's value + 16
    static constexpr bool HAS_MIN = MIN, HAS_QH = QH_ != 0;
    static void pack_codes(const char * const row[HALF], size_t off, char * codes, char * qh) {
        for (int q = 0; q < 4; ++q) {
            for (int i = 0; i < HALF; ++i) {
                memcpy(codes + 32 * q + 4 * i, row[i] + off + QS + 4 * q, 4);
            }
        }
        if constexpr (HAS_QH) {
            for (int i = 0; i < HALF; ++i) {
                uint32_t bits;
                memcpy(&bits, row[i] + off + QH, 4);
                bits = reorder_fifth_bits(bits);
                memcpy(qh + 4 * i, &bits, 4);
            }
        }
    }
    // w[q] the low nibbles (values 4q..4q+3), w[q + 4] the high ones (16 + 4q..): value j always
    // sits against the column's dword j / 4
    static void unpack_codes(const char * codes, const char * qh, rows_block & w) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        for (int q = 0; q < 4; ++q) {
            const __m256i t = _mm256_loadu_si256((const __m256i *) (codes + 32 * q));
            w.w[q] = _mm256_and_si256(t, low4);
            w.w[q + 4] = _mm256_and_si256(_mm256_srli_epi16(t, 4), low4);
        }
        if constexpr (HAS_QH) {
            const __m256i h = _mm256_loadu_si256((const __m256i *) qh);
            w.w[0] = _mm256_or_si256(w.w[0], fifth_bits<0>(h));
            w.w[1] = _mm256_or_si256(w.w[1], fifth_bits<1>(h));
            w.w[2] = _mm256_or_si256(w.w[2], fifth_bits<2>(h));
            w.w[3] = _mm256_or_si256(w.w[3], fifth_bits<3>(h));
            w.w[4] = _mm256_or_si256(w.w[4], fifth_bits<4>(h));
            w.w[5] = _mm256_or_si256(w.w[5], fifth_bits<5>(h));
            w.w[6] = _mm256_or_si256(w.w[6], fifth_bits<6>(h));
            w.w[7] = _mm256_or_si256(w.w[7], fifth_bits<7>(h));
        }
        w.signs = nullptr;
    }
    // Σ code·code per lane: four products of each half of the block to 16 bits, then to 32.
    static __m256i products(const rows_block & w, const column_block & x) {
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i lo = _mm256_maddubs_epi16(w.w[0], _mm256_set1_epi32(dword(x.qs)));
        __m256i hi = _mm256_maddubs_epi16(w.w[4], _mm256_set1_epi32(dword(x.qs + 16)));
        for (int j = 1; j < 4; ++j) {
            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(w.w[j], _mm256_set1_epi32(dword(x.qs + 4 * j))));
            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(w.w[j + 4], _mm256_set1_epi32(dword(x.qs + 16 + 4 * j))));
        }
        const __m256i i = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        return _mm256_sub_epi32(i, _mm256_set1_epi32(OFFSET * x.sum));
    }
};
using w_q4_0 = w_nibbles<18, 2, 0, false>;   // d, qs[16]
using w_q4_1 = w_nibbles<20, 4, 0, true>;    // d, m, qs[16]
using w_q5_0 = w_nibbles<22, 6, 2, false>;   // d, qh[4], qs[16]
using w_q5_1 = w_nibbles<24, 8, 4, true>;    // d, m, qh[4], qs[16]


// A half's block b, in the packed stream of its blocks: codes | fifth bits | d | m.
template <class W>
struct block_layout {
    static constexpr size_t QH_AT = W::CODE_BYTES, D_AT = QH_AT + (W::HAS_QH ? 32 : 0), M_AT = D_AT + 16;
    static constexpr size_t BYTES = HALF * W::BYTES;  // the plain rows' bytes
    static_assert(M_AT + (W::HAS_MIN ? 16 : 0) == BYTES, "a packed block holds the plain bytes");
};

// Rows r0 .. r0 + 8 of the plain layout packed into one half (past n_valid: the last row again).
template <class W>
void pack_half(const char * data, size_t stride, int64_t r0, int n_valid, int64_t nb, char * out) {
    using L = block_layout<W>;
    const char * row[HALF];
    for (int i = 0; i < HALF; ++i) {
        row[i] = data + (r0 + std::min(i, n_valid - 1)) * (int64_t) stride;
    }
    for (int64_t b = 0; b < nb; ++b) {
        const size_t off = (size_t) b * W::BYTES;
        char * blk = out + (size_t) b * L::BYTES;
        W::pack_codes(row, off, blk, blk + L::QH_AT);
        for (int i = 0; i < HALF; ++i) {
            memcpy(blk + L::D_AT + 2 * i, row[i] + off, 2);                 // d
            if constexpr (W::HAS_MIN) {
                memcpy(blk + L::M_AT + 2 * i, row[i] + off + 2, 2);         // m
            }
        }
    }
}

template <class W>
inline void unpack_block(const char * blk, rows_block & w) {
    using L = block_layout<W>;
    _mm_prefetch(blk + 8 * L::BYTES, _MM_HINT_T0);  // a few blocks ahead in the half's stream
    W::unpack_codes(blk, blk + L::QH_AT, w);
    w.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (blk + L::D_AT)));
    w.m = W::HAS_MIN ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (blk + L::M_AT))) : _mm256_setzero_ps();
}

// y[c][r0 + i] for i < n_valid: n_cols (≤ MAX_COLUMNS) columns over one packed half, block by block,
// each column's chain the header's.
template <class W>
void half_pass(const char * half, int64_t nb, const column_block * const * cols, int n_cols, float * const * y, int64_t r0,
               int n_valid) {
    __m256 acc[MAX_COLUMNS];
    for (int c = 0; c < n_cols; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    rows_block w;
    for (int64_t b = 0; b < nb; ++b) {
        unpack_block<W>(half + (size_t) b * block_layout<W>::BYTES, w);
        for (int c = 0; c < n_cols; ++c) {
            const column_block & x = cols[c][b];
            const __m256i i = W::products(w, x);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(w.d, _mm256_set1_ps(x.d)), acc[c]);
            if constexpr (W::HAS_MIN) {
                acc[c] = _mm256_fmadd_ps(w.m, _mm256_set1_ps(x.s), acc[c]);
            }
        }
    }
    for (int c = 0; c < n_cols; ++c) {
        if (n_valid == HALF) {
            _mm256_storeu_ps(y[c] + r0, acc[c]);
        } else {
            alignas(32) float lanes[HALF];
            _mm256_store_ps(lanes, acc[c]);
            memcpy(y[c] + r0, lanes, sizeof(float) * (size_t) n_valid);
        }
    }
}

// y[c][r] for n_rows rows and n_cols columns; half(h) gives half h packed (from the packed weights,
// or packed on the spot from the plain ones).
template <class W, class Half>
void rows(Half && half, int64_t K, int64_t n_rows, const column_block * const * cols, float * const * y, int n_cols) {
    const int64_t nb = K / 32;
    for (int64_t r0 = 0; r0 < n_rows; r0 += HALF) {
        const int n_valid = (int) std::min<int64_t>(HALF, n_rows - r0);
        const char * at = half(r0 / HALF);
        dspark_balanced_passes(n_cols, MAX_COLUMNS, [&](int, int c0, int n) {
            half_pass<W>(at, nb, cols + c0, n, y + c0, r0, n_valid);
        });
    }
}

size_t half_bytes(size_t row_bytes) {
    return HALF * row_bytes;
}

template <class W>
void rows_plain(const char * data, size_t stride, int64_t K, int64_t n_rows, const column_block * const * cols, float * const * y,
                int n_cols) {
    const int64_t nb = K / 32;
    static thread_local std::vector<char> scratch;
    scratch.resize(half_bytes((size_t) nb * W::BYTES));
    rows<W>([&](int64_t h) {
        pack_half<W>(data, stride, HALF * h, (int) std::min<int64_t>(HALF, n_rows - HALF * h), nb, scratch.data());
        return (const char *) scratch.data();
    }, K, n_rows, cols, y, n_cols);
}

template <class W>
void rows_packed(const char * packed, int64_t K, int64_t n_rows, const column_block * const * cols, float * const * y, int n_cols) {
    const size_t bytes = half_bytes((size_t) (K / 32) * W::BYTES);
    rows<W>([&](int64_t h) { return packed + (size_t) h * bytes; }, K, n_rows, cols, y, n_cols);
}

// Whole groups of 16 rows (a last group's missing rows repeat its last row), as the VNNI build's.
template <class W>
void pack(const char * data, size_t stride, int64_t K, int64_t n_rows, char * out) {
    const int64_t nb = K / 32;
    const size_t bytes = half_bytes((size_t) nb * W::BYTES);
    const int64_t n_halves = 2 * ((n_rows + 15) / 16);
    for (int64_t h = 0; h < n_halves; ++h) {
        const int64_t r0 = std::min<int64_t>(HALF * h, n_rows - 1);
        pack_half<W>(data, stride, r0, (int) std::min<int64_t>(HALF, n_rows - r0), nb, out + (size_t) h * bytes);
    }
}

// f(dspark_blocks_tag<W>{}) for the type's W.
template <class F>
void with_type(ggml_type type, F && f) {
    dspark_blocks_with_type<w_q8_0, w_q4_0, w_q4_1, w_q5_0, w_q5_1>(type, f);
}

}  // namespace

void dspark_blocks_avx2_pack(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows, void * packed) {
    with_type(type, [&](auto tag) { pack<typename decltype(tag)::type>(rows, row_stride, K, n_rows, (char *) packed); });
}

void dspark_blocks_avx2_rows(ggml_type type, const char * data, size_t row_stride, int64_t K, int64_t n_rows,
                             const column_block * const * cols, float * const * y, int n_cols) {
    with_type(type, [&](auto tag) { rows_plain<typename decltype(tag)::type>(data, row_stride, K, n_rows, cols, y, n_cols); });
}

void dspark_blocks_avx2_rows_packed(ggml_type type, const void * packed, int64_t K, int64_t n_rows, const column_block * const * cols,
                                    float * const * y, int n_cols) {
    with_type(type, [&](auto tag) { rows_packed<typename decltype(tag)::type>((const char *) packed, K, n_rows, cols, y, n_cols); });
}

#endif  // DSPARK_BLOCKS_KERNELS
