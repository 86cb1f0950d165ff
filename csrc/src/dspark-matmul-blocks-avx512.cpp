// The blocks kernel's AVX-512 VNNI build (dspark-matmul-blocks-isa.h), with AMX-INT8 tiles for
// batches of 12 columns and more. Built with instruction flags of its own (csrc/CMakeLists.txt),
// whatever the rest of the library targets: nothing here runs unless dspark-matmul-blocks.cpp sent
// the call here, on a CPU that has the instructions.
#include "dspark-matmul-blocks-isa.h"
#include "dspark-cpu-isa.h"
#include "dspark-amx-tiles.h"
#include "dspark-column-passes.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#ifdef DSPARK_BLOCKS_KERNELS
// GCC 12's AVX-512 intrinsics start results from _mm512_undefined_*(), which its flow analysis
// reports as uninitialized once they are inlined here: a known false alarm.
#    if defined(__GNUC__) && !defined(__clang__)
#        pragma GCC diagnostic ignored "-Wuninitialized"
#        pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#    endif
#    include <immintrin.h>

namespace {

using column_block = dspark_blocks_column;

// Which weight row each vector lane holds after a type's transpose (see the loads below).
constexpr int lane_row_pairs(int i) { return 8 * (i / 8) + 2 * (i % 4) + (i / 4) % 2; }  // 32-byte rows
constexpr int lane_row_quads(int i) { return 4 * (i % 4) + i / 4; }                       // 16-byte rows

// 16 rows of 32 bytes (rows 2p and 2p+1 in a[p]) → w[j], lane i = dword j of row lane_row_pairs(i).
inline void transpose_pairs(const __m512i a[8], __m512i w[8]) {
    __m512i b[2][4];
    for (int g = 0; g < 2; ++g) {  // a 4x4 transpose of dwords in each 128-bit lane of a[4g..4g+3]
        const __m512i t0 = _mm512_unpacklo_epi32(a[4 * g], a[4 * g + 1]), t1 = _mm512_unpackhi_epi32(a[4 * g], a[4 * g + 1]);
        const __m512i t2 = _mm512_unpacklo_epi32(a[4 * g + 2], a[4 * g + 3]), t3 = _mm512_unpackhi_epi32(a[4 * g + 2], a[4 * g + 3]);
        b[g][0] = _mm512_unpacklo_epi64(t0, t2);
        b[g][1] = _mm512_unpackhi_epi64(t0, t2);
        b[g][2] = _mm512_unpacklo_epi64(t1, t3);
        b[g][3] = _mm512_unpackhi_epi64(t1, t3);
    }
    for (int q = 0; q < 4; ++q) {  // 128-bit lanes 0, 2 hold dword q of even / odd rows, 1, 3 dword q + 4
        w[q] = _mm512_shuffle_i64x2(b[0][q], b[1][q], 0x88);
        w[q + 4] = _mm512_shuffle_i64x2(b[0][q], b[1][q], 0xDD);
    }
}

// 16 rows of 16 bytes (rows 4p..4p+3 in a[p]) → w[q], lane i = dword q of row lane_row_quads(i).
inline void transpose_quads(const __m512i a[4], __m512i w[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    w[0] = _mm512_unpacklo_epi64(t0, t2);
    w[1] = _mm512_unpackhi_epi64(t0, t2);
    w[2] = _mm512_unpacklo_epi64(t1, t3);
    w[3] = _mm512_unpackhi_epi64(t1, t3);
}

inline __m512i load_pairs_row(const char * r0, const char * r1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) r0)),
                              _mm256_loadu_si256((const __m256i *) r1), 1);
}

inline __m512i load_quads_row(const char * r0, const char * r1, const char * r2, const char * r3) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *) r0));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *) r1), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *) r2), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *) r3), 3);
}

// q5's fifth bits: bit j of the 32-bit qh (per lane) goes to bit 4 of code j.
inline void add_fifth_bits(__m512i qh, __m512i w[8]) {
    alignas(64) static const int32_t SPREAD[16] = {  // 4 bits → bit 4 of each of 4 bytes
        0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000, 0x00100010, 0x00101000, 0x00101010,
        0x10000000, 0x10000010, 0x10001000, 0x10001010, 0x10100000, 0x10100010, 0x10101000, 0x10101010};
    const __m512i spread = _mm512_load_si512(SPREAD);
    for (int j = 0; j < 8; ++j) {
        const __m512i t = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * j), _mm512_set1_epi32(0xF));
        w[j] = _mm512_or_si512(w[j], _mm512_permutexvar_epi32(t, spread));
    }
}

// The packed layout (dspark-matmul-blocks.h): each group of 16 rows is one contiguous record of
// sections, every block's part of a section together,
//     codes [nb][CODE_BYTES] | fifth bits [nb][64] (q5) | d [nb][16 f16] | m [nb][16 f16] (q4_1, q5_1)
// where a block's codes are the transposed vectors the passes multiply (q8_0: 8 vectors of the
// codes plus 128, unsigned; nibble types: 4 vectors of the 16 rows' raw qs bytes, split at run time)
// and lane i of every section holds row lane_row(LANES, i). A group is 16 x the type's row bytes:
// the plain layout's size, read as one stream, with no transpose and no gather per call.
template <class W>
struct group_layout {
    int64_t nb;
    size_t codes(int64_t b) const { return (size_t) b * W::CODE_BYTES; }
    size_t qh(int64_t b) const { return (size_t) nb * W::CODE_BYTES + (size_t) b * 64; }
    size_t d(int64_t b) const { return (size_t) nb * (W::CODE_BYTES + (W::HAS_QH ? 64 : 0)) + (size_t) b * 32; }
    size_t m(int64_t b) const { return (size_t) nb * (W::CODE_BYTES + (W::HAS_QH ? 64 : 0) + 32) + (size_t) b * 32; }
    size_t bytes() const { return (size_t) nb * 16 * W::BYTES; }
};

// The weight types. Each packs a block of its 16 rows (row[], the lanes' byte offsets from row[0]
// in gather_idx) into the layout's sections, and unpacks them into the unsigned codes as 8 vectors
// (dword j of lane i: codes 4j..4j+3 of the lane's row). A code is the value plus OFFSET (what
// VNNI's unsigned operand needs; OFFSET times the column's sum takes it off).
struct w_q8_0 {
    static constexpr size_t BYTES = 34, CODE_BYTES = 512;
    static constexpr int32_t OFFSET = 128;
    static constexpr bool HAS_MIN = false, HAS_QH = false;
    static constexpr int LANES = 0;  // lane_row_pairs
    static void pack_codes(const char * const row[16], size_t off, __m512i, const char *, char * codes, char *) {
        __m512i a[8], w[8];
        for (int p = 0; p < 8; ++p) {
            a[p] = load_pairs_row(row[2 * p] + off + 2, row[2 * p + 1] + off + 2);
        }
        transpose_pairs(a, w);
        for (int j = 0; j < 8; ++j) {
            _mm512_storeu_si512(codes + 64 * j, _mm512_xor_si512(w[j], _mm512_set1_epi8((char) 0x80)));  // int8 → value + 128
        }
    }
    static void unpack_codes(const char * codes, const char *, __m512i w[8]) {
        for (int j = 0; j < 8; ++j) {
            w[j] = _mm512_loadu_si512(codes + 64 * j);
        }
    }
};

template <size_t BYTES_, size_t QS, size_t QH_, bool MIN>
struct w_nibbles {
    static constexpr size_t BYTES = BYTES_, QH = QH_, CODE_BYTES = 256;
    static constexpr int32_t OFFSET = MIN ? 0 : QH_ ? 16 : 8;  // q4_0 codes are value + 8, q5_0's value + 16
    static constexpr bool HAS_MIN = MIN, HAS_QH = QH_ != 0;
    static constexpr int LANES = 1;  // lane_row_quads
    static void pack_codes(const char * const row[16], size_t off, __m512i gather_idx, const char * base, char * codes, char * qh) {
        __m512i a[4], t[4];
        for (int p = 0; p < 4; ++p) {
            a[p] = load_quads_row(row[4 * p] + off + QS, row[4 * p + 1] + off + QS, row[4 * p + 2] + off + QS,
                                  row[4 * p + 3] + off + QS);
        }
        transpose_quads(a, t);
        for (int q = 0; q < 4; ++q) {
            _mm512_storeu_si512(codes + 64 * q, t[q]);
        }
        if constexpr (HAS_QH) {
            _mm512_storeu_si512(qh, _mm512_i32gather_epi32(gather_idx, base + off + QH, 1));
        }
    }
    // w[q] the low nibbles (values 4q..4q+3), w[q + 4] the high ones (16 + 4q..): value j always
    // sits against the column's dword j / 4
    static void unpack_codes(const char * codes, const char * qh, __m512i w[8]) {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        for (int q = 0; q < 4; ++q) {
            const __m512i t = _mm512_loadu_si512(codes + 64 * q);
            w[q] = _mm512_and_si512(t, low4);
            w[q + 4] = _mm512_and_si512(_mm512_srli_epi16(t, 4), low4);
        }
        if constexpr (HAS_QH) {
            add_fifth_bits(_mm512_loadu_si512(qh), w);
        }
    }
};
using w_q4_0 = w_nibbles<18, 2, 0, false>;   // d, qs[16]
using w_q4_1 = w_nibbles<20, 4, 0, true>;    // d, m, qs[16]
using w_q5_0 = w_nibbles<22, 6, 2, false>;   // d, qh[4], qs[16]
using w_q5_1 = w_nibbles<24, 8, 4, true>;    // d, m, qh[4], qs[16]

inline int lane_row(int lanes, int i) { return lanes == 0 ? lane_row_pairs(i) : lane_row_quads(i); }

// Rows r0 .. r0 + n_valid of the plain layout (row_stride bytes apart) packed into one group
// (past the end: the last row again), while the next group's rows are fetched into the cache (16
// short streams are more than the hardware prefetcher follows).
template <class W>
void pack_group(const char * data, size_t stride, int64_t r0, int n_valid, int64_t nb, char * out) {
    const char * row[16];
    alignas(64) int32_t offsets[16];
    for (int k = 0; k < 16; ++k) {
        row[k] = data + (r0 + std::min(k, n_valid - 1)) * stride;
        offsets[k] = (int32_t) (std::min(lane_row(W::LANES, k), n_valid - 1) * (int64_t) stride);  // lane k's row
    }
    const __m512i gather_idx = _mm512_load_si512(offsets);
    const char * base = row[0];
    const size_t group_bytes = 16 * stride, ahead = (group_bytes + nb - 1) / nb;  // of the next group, per block
    const group_layout<W> g{nb};
    for (int64_t b = 0; b < nb; ++b) {
        for (size_t o = (size_t) b * ahead; o < (size_t) (b + 1) * ahead; o += 64) {
            _mm_prefetch(base + group_bytes + o, _MM_HINT_T0);
        }
        const size_t off = (size_t) b * W::BYTES;
        W::pack_codes(row, off, gather_idx, base, out + g.codes(b), out + g.qh(b));
        const __m512i head = _mm512_i32gather_epi32(gather_idx, base + off, 1);  // d (and m) of each row
        _mm256_storeu_si256((__m256i *) (out + g.d(b)), _mm512_cvtepi32_epi16(head));
        if constexpr (W::HAS_MIN) {
            _mm256_storeu_si256((__m256i *) (out + g.m(b)), _mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
        }
    }
}

// A block of 16 rows made ready for the columns: the codes transposed (lane = row) and the scales.
struct rows_block {
    __m512i w[8];
    __m512  d, m;
};

// Block b of a packed group made ready, while a share of the group `next` (if any) is fetched
// (all of it at once would stall on the cache's outstanding misses).
template <class W>
inline void unpack_block(const char * group, int64_t nb, int64_t b, const char * next, rows_block & out) {
    const group_layout<W> g{nb};
    const size_t ahead = (g.bytes() + nb - 1) / nb;
    for (size_t o = (size_t) b * ahead; next && o < (size_t) (b + 1) * ahead; o += 64) {
        _mm_prefetch(next + o, _MM_HINT_T0);
    }
    W::unpack_codes(group + g.codes(b), group + g.qh(b), out.w);
    out.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (group + g.d(b))));
    out.m = W::HAS_MIN ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (group + g.m(b)))) : _mm512_setzero_ps();
}

// One block's float step for one column (lanes = the 16 rows), from its exact integer i (the
// codes' offset already taken off): the chain of the header, the same for the VNNI and tile passes.
template <bool HAS_MIN>
inline __m512 chain_step(__m512 acc, __m512i i, const rows_block & w, float d_x, float s_x) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(w.d, _mm512_set1_ps(d_x)), acc);
    if constexpr (HAS_MIN) {
        acc = _mm512_fmadd_ps(w.m, _mm512_set1_ps(s_x), acc);
    }
    return acc;
}

// acc[c] (lanes = the 16 rows) for N columns over nb blocks, block(b) giving each made ready: the
// float steps of the header.
template <int32_t OFFSET, bool HAS_MIN, int N, class Blocks>
void columns_pass(int64_t nb, const column_block * const * cols, __m512 acc[N], Blocks && block) {
    for (int c = 0; c < N; ++c) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const rows_block & w = block(b);
        for (int c = 0; c < N; ++c) {
            const column_block & x = cols[c][b];
            __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();  // two chains: the products' latency
            for (int j = 0; j < 8; j += 2) {
                int32_t x0, x1;
                memcpy(&x0, x.qs + 4 * j, 4);
                memcpy(&x1, x.qs + 4 * j + 4, 4);
                i0 = _mm512_dpbusd_epi32(i0, w.w[j], _mm512_set1_epi32(x0));
                i1 = _mm512_dpbusd_epi32(i1, w.w[j + 1], _mm512_set1_epi32(x1));
            }
            const __m512i i = _mm512_sub_epi32(_mm512_add_epi32(i0, i1), _mm512_set1_epi32(OFFSET * x.sum));
            acc[c] = chain_step<HAS_MIN>(acc[c], i, w, x.d, x.s);
        }
    }
}

// columns per pass over a group of rows: the accumulators stay in registers (16 of the 32 with
// the block made ready), and a verify block of 9..16 rows is one pass over the packed group, not
// two over a copy of its ready blocks (9 rows of q8_0 on Zen 4: 15.7 -> 11.8 ms)
constexpr int MAX_COLUMNS = 16;

// y[c][r0 + row] = the lane of acc[c] that holds the row, for the first n_valid rows of the group.
template <int N>
void store_rows(const __m512 acc[N], int lanes, float * const * y, int64_t r0, int n_valid) {
    alignas(64) int32_t to_lane[16];  // row → its lane
    for (int i = 0; i < 16; ++i) {
        to_lane[lane_row(lanes, i)] = i;
    }
    const __m512i unshuffle = _mm512_load_si512(to_lane);
    const __mmask16 valid = (__mmask16) ((1u << n_valid) - 1);
    for (int c = 0; c < N; ++c) {
        _mm512_mask_storeu_ps(y[c] + r0, valid, _mm512_permutexvar_ps(unshuffle, acc[c]));
    }
}

// One pass of N columns over a group of rows (VNNI): y[c][r0 + row] for its first n_valid rows.
template <int32_t OFFSET, bool HAS_MIN, int N>
void pass(const rows_block * blocks, int64_t nb, int lanes, const column_block * const * cols, float * const * y, int64_t r0,
          int n_valid) {
    __m512 acc[N];
    columns_pass<OFFSET, HAS_MIN, N>(nb, cols, acc, [&](int64_t b) -> const rows_block & { return blocks[b]; });
    store_rows<N>(acc, lanes, y, r0, n_valid);
}

// The same pass straight from a packed group, each block made ready in registers as it comes:
// for a group's only pass (a decode step, a few columns) no copy of the ready blocks is kept.
template <class W, int N>
void pass_from_group(const char * group, const char * next, int64_t nb, const column_block * const * cols, float * const * y,
                     int64_t r0, int n_valid) {
    __m512 acc[N];
    rows_block w;
    columns_pass<W::OFFSET, W::HAS_MIN, N>(nb, cols, acc, [&](int64_t b) -> const rows_block & {
        unpack_block<W>(group, nb, b, next, w);
        return w;
    });
    store_rows<N>(acc, W::LANES, y, r0, n_valid);
}

#ifdef DSPARK_AMX_KERNELS
// ---- AMX: the integer products of up to 16 columns at once ---------------------------------------
//
// One tile instruction (TDPBSUD: signed column codes x unsigned weight codes) gives the exact
// integer of every (column, row) pair of a block: A holds a block of up to 16 columns (a row per
// column, 32 codes), B the block's transposed weight codes as the columns pass reads them (8
// dwords x 16 lanes = rows), C a row of 16 int32 per column, lanes = rows. The integers are the
// VNNI pass's, and the float chain that follows is its chain step for step, so a column gets the
// same bits from either (and a decode step, one column, keeps the VNNI pass).

constexpr int AMX_COLUMNS = 16;      // the most rows of an A tile
// Fewer columns take the VNNI pass, faster there since it takes 16 columns a pass (SmolLM2-135M on
// 2 Xeon cores: a 9-row verify 5-10 % faster on VNNI, 12-14 rows about equal, 16 rows 0-20 % faster
// on the tiles).
constexpr int AMX_MIN_COLUMNS = 12;
constexpr int AMX_CHUNK = 4;         // blocks whose products are in flight together (C tiles 4..7)

// A block of one pass's columns laid out for the A tile, with what their float steps read.
struct amx_columns_block {
    int8_t  qs[AMX_COLUMNS][32];  // rows past the pass's columns are zero
    int32_t offset_sum[AMX_COLUMNS];  // OFFSET x Σ codes: taken off the integer, as the VNNI pass does
    float   d[AMX_COLUMNS], s[AMX_COLUMNS];
};

// Tiles 0-1: A (n_rows columns of 32 codes), 2-3: B (8 rows of 64 bytes), 4-7: C (n_rows x 16 int32).
inline void amx_configure(int n_rows) {
    dspark_tile_config cfg;
    for (int t = 0; t < 8; ++t) {
        const bool a = t < 2, b = t == 2 || t == 3;
        cfg.rows[t] = (uint8_t) (b ? 8 : n_rows);
        cfg.colsb[t] = (uint16_t) (a ? 32 : 64);
    }
    _tile_loadconfig(&cfg);
}

// The columns cols[c0 .. c0 + n) of every block, for the A tile (done once per call, for all row groups).
template <int32_t OFFSET>
void amx_pack(const column_block * const * cols, int c0, int n, int64_t nb, amx_columns_block * out) {
    for (int64_t b = 0; b < nb; ++b) {
        amx_columns_block & p = out[b];
        memset(&p, 0, sizeof(p));
        for (int c = 0; c < n; ++c) {
            const column_block & x = cols[c0 + c][b];
            memcpy(p.qs[c], x.qs, 32);
            p.offset_sum[c] = OFFSET * x.sum;
            p.d[c] = x.d;
            p.s[c] = x.s;
        }
    }
}

// A block's products into C tile 4 + T (A tile T % 2, B tile 2 + T % 2): C[c][lane] = Σ column c's
// codes x the lane's row codes. (GCC's tile intrinsics take the tile numbers as literal text.)
#    define DSPARK_AMX_PRODUCTS(T, A, B, columns, weights) \
        do {                                    \
            _tile_loadd(A, (columns).qs, 32);   \
            _tile_loadd(B, (weights).w, 64);    \
            _tile_zero(T);                      \
            _tile_dpbsud(T, A, B);              \
        } while (0)

template <bool HAS_MIN, int N>
inline void amx_float_steps(const int32_t (*products)[16], const amx_columns_block & x, const rows_block & w, __m512 acc[N]) {
    for (int c = 0; c < N; ++c) {
        const __m512i i = _mm512_sub_epi32(_mm512_load_si512(products[c]), _mm512_set1_epi32(x.offset_sum[c]));
        acc[c] = chain_step<HAS_MIN>(acc[c], i, w, x.d[c], x.s[c]);
    }
}

// The AMX pass: N columns (packed) over nb prepared blocks, AMX_CHUNK blocks' products at a time,
// while a share of the next group's `next_bytes` at `next` (if any) is fetched: the memory stays
// busy while the tiles work (a verify's first pass over a group; the blocks were made ready
// without fetching).
template <bool HAS_MIN, int N>
void amx_pass(const rows_block * blocks, int64_t nb, int lanes, const amx_columns_block * cols, float * const * y, int64_t r0,
              int n_valid, const char * next, size_t next_bytes) {
    const size_t ahead = (next_bytes + nb - 1) / nb;  // per block
    __m512 acc[N];
    for (int c = 0; c < N; ++c) {
        acc[c] = _mm512_setzero_ps();
    }
    alignas(64) int32_t products[AMX_CHUNK][AMX_COLUMNS][16];
    for (int64_t b0 = 0; b0 < nb; b0 += AMX_CHUNK) {
        const int64_t n = std::min<int64_t>(AMX_CHUNK, nb - b0);
        for (size_t o = (size_t) b0 * ahead; next && o < (size_t) (b0 + n) * ahead; o += 64) {
            _mm_prefetch(next + o, _MM_HINT_T0);
        }
        DSPARK_AMX_PRODUCTS(4, 0, 2, cols[b0], blocks[b0]);
        if (n > 1) DSPARK_AMX_PRODUCTS(5, 1, 3, cols[b0 + 1], blocks[b0 + 1]);
        if (n > 2) DSPARK_AMX_PRODUCTS(6, 0, 2, cols[b0 + 2], blocks[b0 + 2]);
        if (n > 3) DSPARK_AMX_PRODUCTS(7, 1, 3, cols[b0 + 3], blocks[b0 + 3]);
        _tile_stored(4, products[0], 64);
        if (n > 1) _tile_stored(5, products[1], 64);
        if (n > 2) _tile_stored(6, products[2], 64);
        if (n > 3) _tile_stored(7, products[3], 64);
        for (int64_t k = 0; k < n; ++k) {  // block order: the chain of the VNNI pass
            amx_float_steps<HAS_MIN, N>(products[k], cols[b0 + k], blocks[b0 + k], acc);
        }
    }
    store_rows<N>(acc, lanes, y, r0, n_valid);
}
#endif  // DSPARK_AMX_KERNELS

// y[c][r] for n_rows rows (groups of 16) and n_cols columns; group(g) gives group g packed (from
// the packed weights, or packed on the spot from the plain ones) and the next one to fetch, if any.
template <class W, class Group>
void rows(Group && group, int64_t K, int64_t n_rows, const column_block * const * cols, float * const * y, int n_cols) {
    if (n_cols < 1) {
        return;
    }
    using pass_fn = void (*)(const rows_block *, int64_t, int, const column_block * const *, float * const *, int64_t, int);
    constexpr int32_t O = W::OFFSET;
    constexpr bool M = W::HAS_MIN;
    static const pass_fn passes[MAX_COLUMNS] = {
        pass<O, M, 1>,  pass<O, M, 2>,  pass<O, M, 3>,  pass<O, M, 4>,  pass<O, M, 5>,  pass<O, M, 6>,
        pass<O, M, 7>,  pass<O, M, 8>,  pass<O, M, 9>,  pass<O, M, 10>, pass<O, M, 11>, pass<O, M, 12>,
        pass<O, M, 13>, pass<O, M, 14>, pass<O, M, 15>, pass<O, M, 16>};
    const int64_t nb = K / 32;
#ifdef DSPARK_AMX_KERNELS
    using amx_pass_fn = void (*)(const rows_block *, int64_t, int, const amx_columns_block *, float * const *, int64_t, int,
                                 const char *, size_t);
    static const amx_pass_fn amx_passes[AMX_COLUMNS] = {
        amx_pass<M, 1>,  amx_pass<M, 2>,  amx_pass<M, 3>,  amx_pass<M, 4>,  amx_pass<M, 5>,  amx_pass<M, 6>,
        amx_pass<M, 7>,  amx_pass<M, 8>,  amx_pass<M, 9>,  amx_pass<M, 10>, amx_pass<M, 11>, amx_pass<M, 12>,
        amx_pass<M, 13>, amx_pass<M, 14>, amx_pass<M, 15>, amx_pass<M, 16>};
    const bool amx = n_cols >= AMX_MIN_COLUMNS && dspark_cpu_isa_in_use() >= dspark_isa::amx_int8;
    static thread_local std::vector<amx_columns_block> packed;  // every pass's columns, once for all row groups
    if (amx) {
        const int rows_a = std::min(n_cols, AMX_COLUMNS);
        packed.resize((size_t) (nb * ((n_cols + AMX_COLUMNS - 1) / AMX_COLUMNS)));
        dspark_balanced_passes(n_cols, AMX_COLUMNS, [&](int p, int c0, int n) { amx_pack<O>(cols, c0, n, nb, packed.data() + p * nb); });
        amx_configure(rows_a);
    }
#else
    const bool amx = false;
#endif
    using group_pass_fn = void (*)(const char *, const char *, int64_t, const column_block * const *, float * const *, int64_t, int);
    static const group_pass_fn group_passes[MAX_COLUMNS] = {
        pass_from_group<W, 1>,  pass_from_group<W, 2>,  pass_from_group<W, 3>,  pass_from_group<W, 4>,
        pass_from_group<W, 5>,  pass_from_group<W, 6>,  pass_from_group<W, 7>,  pass_from_group<W, 8>,
        pass_from_group<W, 9>,  pass_from_group<W, 10>, pass_from_group<W, 11>, pass_from_group<W, 12>,
        pass_from_group<W, 13>, pass_from_group<W, 14>, pass_from_group<W, 15>, pass_from_group<W, 16>};
    static thread_local std::vector<rows_block> ready;  // one group of rows, made ready once for every pass
    ready.resize((size_t) nb);
    for (int64_t r0 = 0; r0 < n_rows; r0 += 16) {
        const int n_valid = (int) std::min<int64_t>(16, n_rows - r0);
        const auto [at, next] = group(r0 / 16);
        if (!amx && n_cols <= MAX_COLUMNS) {  // one pass
            group_passes[n_cols - 1](at, next, nb, cols, y, r0, n_valid);
            continue;
        }
        for (int64_t b = 0; b < nb; ++b) {
            unpack_block<W>(at, nb, b, amx ? nullptr : next, ready[(size_t) b]);  // the tile pass fetches
        }
        if (!amx) {
            dspark_balanced_passes(n_cols, MAX_COLUMNS, [&](int, int c0, int n) {
                passes[n - 1](ready.data(), nb, W::LANES, cols + c0, y + c0, r0, n_valid);
            });
            continue;
        }
#ifdef DSPARK_AMX_KERNELS
        dspark_balanced_passes(n_cols, AMX_COLUMNS, [&](int p, int c0, int n) {
            amx_passes[n - 1](ready.data(), nb, W::LANES, packed.data() + p * nb, y + c0, r0, n_valid, p == 0 ? next : nullptr,
                              group_layout<W>{nb}.bytes());
        });
#endif
    }
#ifdef DSPARK_AMX_KERNELS
    if (amx) {
        _tile_release();  // the tiles' state need not be saved at the next context switch
    }
#endif
}

// The plain layout: each group packed on the spot.
template <class W>
void rows_plain(const char * data, size_t stride, int64_t K, int64_t n_rows, const column_block * const * cols, float * const * y,
                int n_cols) {
    const int64_t nb = K / 32;
    static thread_local std::vector<char> scratch;
    scratch.resize(group_layout<W>{nb}.bytes());
    rows<W>([&](int64_t g) {
        pack_group<W>(data, stride, 16 * g, (int) std::min<int64_t>(16, n_rows - 16 * g), nb, scratch.data());
        return std::pair<const char *, const char *>(scratch.data(), nullptr);  // (pack_group fetches the next)
    }, K, n_rows, cols, y, n_cols);
}

// The packed layout: the groups as they lie, the next one fetched while this one is multiplied.
template <class W>
void rows_packed(const char * packed, int64_t K, int64_t n_rows, const column_block * const * cols, float * const * y, int n_cols) {
    const size_t group_bytes = group_layout<W>{K / 32}.bytes();
    const int64_t n_groups = (n_rows + 15) / 16;
    rows<W>([&](int64_t g) {
        const char * at = packed + (size_t) g * group_bytes;
        return std::pair<const char *, const char *>(at, g + 1 < n_groups ? at + group_bytes : nullptr);
    }, K, n_rows, cols, y, n_cols);
}

template <class W>
void pack(const char * data, size_t stride, int64_t K, int64_t n_rows, char * out) {
    const int64_t nb = K / 32;
    const size_t group_bytes = group_layout<W>{nb}.bytes();
    for (int64_t r0 = 0; r0 < n_rows; r0 += 16) {
        pack_group<W>(data, stride, r0, (int) std::min<int64_t>(16, n_rows - r0), nb, out + (size_t) (r0 / 16) * group_bytes);
    }
}

// f(dspark_blocks_tag<W>{}) for the type's W.
template <class F>
void with_type(ggml_type type, F && f) {
    dspark_blocks_with_type<w_q8_0, w_q4_0, w_q4_1, w_q5_0, w_q5_1>(type, f);
}

}  // namespace

void dspark_blocks_avx512_pack(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows, void * packed) {
    with_type(type, [&](auto tag) { pack<typename decltype(tag)::type>(rows, row_stride, K, n_rows, (char *) packed); });
}

void dspark_blocks_avx512_rows(ggml_type type, const char * data, size_t row_stride, int64_t K, int64_t n_rows,
                               const column_block * const * cols, float * const * y, int n_cols) {
    with_type(type, [&](auto tag) { rows_plain<typename decltype(tag)::type>(data, row_stride, K, n_rows, cols, y, n_cols); });
}

void dspark_blocks_avx512_rows_packed(ggml_type type, const void * packed, int64_t K, int64_t n_rows, const column_block * const * cols,
                                      float * const * y, int n_cols) {
    with_type(type, [&](auto tag) { rows_packed<typename decltype(tag)::type>((const char *) packed, K, n_rows, cols, y, n_cols); });
}

#endif  // DSPARK_BLOCKS_KERNELS
