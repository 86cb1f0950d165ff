#include "dspark-matmul-amx-bf16.h"

#include "dspark-amx-tiles.h"
#include "dspark-cpu-isa.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef DSPARK_AMX_BF16_KERNELS
#    include <immintrin.h>

namespace {

constexpr int TILE_ROWS = 16;     // weight rows of an A tile, output rows of a C tile
constexpr int TILE_K = 32;        // values of a row in an A tile (32 bf16: 64 bytes)
constexpr int TILE_COLUMNS = 16;  // columns of a B and a C tile
constexpr int TILE_DWORDS = 256;  // a B tile: 16 pairs x 16 columns
constexpr int GROUPS = 4;         // row groups in flight: C tiles 0..3 (A tiles 4, 5; B tile 6)

// C tiles 0..3 and A tiles 4, 5 of `rows` rows (16, or a last group's fewer) x 64 bytes; B tile 6
// of 16 pairs x 16 columns.
void configure(int rows) {
    dspark_tile_config cfg;
    for (int t = 0; t < 7; ++t) {
        cfg.rows[t] = (uint8_t) (t < 6 ? rows : TILE_K / 2);
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

// Columns c0 .. c0 + 16 as B tiles, one per chunk: dword (pair, n) of chunk j is column c0 + n's
// pair 16·j + pair (zero past n_cols).
void pack_columns(const char * cols, size_t col_stride, int64_t c0, int64_t n_cols, int64_t n_chunks, uint32_t * out) {
    memset(out, 0, sizeof(uint32_t) * (size_t) (n_chunks * TILE_DWORDS));
    for (int64_t n = 0; n < std::min<int64_t>(TILE_COLUMNS, n_cols - c0); ++n) {
        const uint32_t * col = (const uint32_t *) (cols + (c0 + n) * col_stride);
        for (int64_t pair = 0; pair < n_chunks * 16; ++pair) {
            out[pair * 16 + n] = col[pair];
        }
    }
}

// G row groups of 16 (A tiles straight from the rows) times one column group (B tiles): each output
// the tile sum from zero over the chunks in order. (GCC's tile intrinsics take tile numbers as text.)
template <int G>
void bf16_groups(const char * rows, size_t row_stride, int64_t n_chunks, const uint32_t * b, float (*out)[16][16]) {
    _tile_zero(0);
    if (G > 1) _tile_zero(1);
    if (G > 2) _tile_zero(2);
    if (G > 3) _tile_zero(3);
    const size_t group = TILE_ROWS * row_stride;
    for (int64_t j = 0; j < n_chunks; ++j) {
        const char * a = rows + j * TILE_K * sizeof(ggml_bf16_t);
        _tile_loadd(6, b + j * TILE_DWORDS, 64);
        _tile_loadd(4, a, row_stride);
        _tile_dpbf16ps(0, 4, 6);
        if (G > 1) {
            _tile_loadd(5, a + group, row_stride);
            _tile_dpbf16ps(1, 5, 6);
        }
        if (G > 2) {
            _tile_loadd(4, a + 2 * group, row_stride);
            _tile_dpbf16ps(2, 4, 6);
        }
        if (G > 3) {
            _tile_loadd(5, a + 3 * group, row_stride);
            _tile_dpbf16ps(3, 5, 6);
        }
    }
    _tile_stored(0, out[0], 64);
    if (G > 1) _tile_stored(1, out[1], 64);
    if (G > 2) _tile_stored(2, out[2], 64);
    if (G > 3) _tile_stored(3, out[3], 64);
}

// The C tiles' sums of rows r0 .. r0 + n_rows into y, columns c0 .. c0 + n_cols.
void store(float (*sums)[16][16], int64_t n_rows, int64_t n_cols, float * y, size_t y_stride, int64_t r0, int64_t c0) {
    for (int64_t c = 0; c < n_cols; ++c) {
        float * out = y + (c0 + c) * y_stride + r0;
        for (int64_t r = 0; r < n_rows; ++r) {
            out[r] = sums[r / 16][r % 16][c];
        }
    }
}

// run(groups, r0, n) over n_rows rows: blocks of GROUPS whole groups, then the whole groups left as
// one smaller block, then a last group of fewer than 16 rows with tiles of that many rows.
template <class F>
void row_blocks(int64_t n_rows, F && run) {
    configure(TILE_ROWS);
    int64_t r0 = 0;
    for (; r0 + GROUPS * TILE_ROWS <= n_rows; r0 += GROUPS * TILE_ROWS) {
        run(std::integral_constant<int, GROUPS>(), r0, (int64_t) GROUPS * TILE_ROWS);
    }
    switch ((n_rows - r0) / TILE_ROWS) {
        case 3: run(std::integral_constant<int, 3>(), r0, 3 * TILE_ROWS); r0 += 3 * TILE_ROWS; break;
        case 2: run(std::integral_constant<int, 2>(), r0, 2 * TILE_ROWS); r0 += 2 * TILE_ROWS; break;
        case 1: run(std::integral_constant<int, 1>(), r0, TILE_ROWS); r0 += TILE_ROWS; break;
        default: break;
    }
    if (r0 < n_rows) {
        configure((int) (n_rows - r0));
        run(std::integral_constant<int, 1>(), r0, n_rows - r0);
    }
}

}  // namespace

bool dspark_amx_bf16_available(ggml_type type, int64_t K) {
    return type == GGML_TYPE_BF16 && K % TILE_K == 0 && dspark_cpu_has_amx_bf16();
}

void dspark_amx_bf16_matmul(const char * rows, size_t row_stride, int64_t K, int64_t n_rows, const ggml_bf16_t * cols,
                            size_t col_stride, int64_t n_cols, float * y, size_t y_stride) {
    const int64_t n_chunks = K / TILE_K;
    const int64_t n_col_groups = (n_cols + TILE_COLUMNS - 1) / TILE_COLUMNS;
    const int64_t group_dwords = n_chunks * TILE_DWORDS;
    static thread_local std::vector<uint32_t> packed;  // every column group's B tiles
    packed.resize((size_t) (n_col_groups * group_dwords));
    for (int64_t g = 0; g < n_col_groups; ++g) {
        pack_columns((const char *) cols, col_stride, g * TILE_COLUMNS, n_cols, n_chunks, packed.data() + g * group_dwords);
    }
    alignas(64) float sums[GROUPS][16][16];
    row_blocks(n_rows, [&](auto groups, int64_t r0, int64_t n) {
        for (int64_t g = 0; g < n_col_groups; ++g) {
            bf16_groups<decltype(groups)::value>(rows + r0 * row_stride, row_stride, n_chunks, packed.data() + g * group_dwords, sums);
            store(sums, n, std::min<int64_t>(TILE_COLUMNS, n_cols - g * TILE_COLUMNS), y, y_stride, r0, g * TILE_COLUMNS);
        }
    });
    _tile_release();  // the tiles' state need not be saved at the next context switch
}

#else  // no AMX-BF16 in this build

bool dspark_amx_bf16_available(ggml_type, int64_t) {
    return false;
}

void dspark_amx_bf16_matmul(const char *, size_t, int64_t, int64_t, const ggml_bf16_t *, size_t, int64_t, float *, size_t) {}

#endif
