// The blocks kernel's front (dspark-matmul-blocks.h): the columns prepared here, each multiply
// sent to the build for the instructions the CPU runs (dspark-matmul-blocks-isa.h). Built with the
// library's own flags, so that a CPU without AVX-512 never runs an instruction it lacks.
#include "dspark-matmul-blocks.h"
#include "dspark-matmul-blocks-isa.h"

#include "ggml-cpu.h"

#include <cstring>
#include <vector>

#ifdef DSPARK_BLOCKS_KERNELS

namespace {

struct q8_0_block { ggml_fp16_t d; int8_t qs[32]; };
static_assert(sizeof(q8_0_block) == 34, "q8_0 layout");

bool avx512() {
    return dspark_cpu_isa_in_use() >= dspark_isa::avx512_vnni;
}

}  // namespace

size_t dspark_blocks_column_size(int64_t K) {
    return sizeof(dspark_blocks_column) * (size_t) (K / 32);
}

void dspark_blocks_prepare(const float * x, int64_t K, void * column) {
    const int64_t nb = K / 32;
    static thread_local std::vector<q8_0_block> q;
    q.resize((size_t) nb);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float(x, q.data(), K);  // as ggml quantizes a column
    dspark_blocks_column * out = (dspark_blocks_column *) column;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) {
            sum += q[(size_t) b].qs[i];
        }
        memcpy(out[b].qs, q[(size_t) b].qs, 32);
        out[b].d = ggml_fp16_to_fp32(q[(size_t) b].d);
        out[b].sum = sum;
        out[b].s = out[b].d * (float) sum;
        out[b].pad = 0;
    }
}

size_t dspark_blocks_packed_size(ggml_type type, int64_t K, int64_t n_rows) {
    return ggml_row_size(type, K) * (size_t) (16 * ((n_rows + 15) / 16));  // a group: 16 plain rows' bytes
}

void dspark_blocks_pack(ggml_type type, const char * rows, size_t row_stride, int64_t K, int64_t n_rows, void * packed) {
    if (avx512()) {
        dspark_blocks_avx512_pack(type, rows, row_stride, K, n_rows, packed);
    } else {
        dspark_blocks_avx2_pack(type, rows, row_stride, K, n_rows, packed);
    }
}

void dspark_blocks_rows(ggml_type type, const char * data, size_t row_stride, int64_t K, int64_t n_rows,
                        const void * const * columns, float * const * y, int n_cols) {
    const auto cols = (const dspark_blocks_column * const *) columns;
    if (avx512()) {
        dspark_blocks_avx512_rows(type, data, row_stride, K, n_rows, cols, y, n_cols);
    } else {
        dspark_blocks_avx2_rows(type, data, row_stride, K, n_rows, cols, y, n_cols);
    }
}

void dspark_blocks_rows_packed(ggml_type type, const void * packed, int64_t K, int64_t n_rows, const void * const * columns,
                               float * const * y, int n_cols) {
    const auto cols = (const dspark_blocks_column * const *) columns;
    if (avx512()) {
        dspark_blocks_avx512_rows_packed(type, packed, K, n_rows, cols, y, n_cols);
    } else {
        dspark_blocks_avx2_rows_packed(type, packed, K, n_rows, cols, y, n_cols);
    }
}

#else  // no kernels in this build: dspark_blocks_available() is false, so these are never called

size_t dspark_blocks_column_size(int64_t K) { return (size_t) K; }
void dspark_blocks_prepare(const float *, int64_t, void *) { GGML_ABORT("no blocks kernels in this build"); }
void dspark_blocks_rows(ggml_type, const char *, size_t, int64_t, int64_t, const void * const *, float * const *, int) {
    GGML_ABORT("no blocks kernels in this build");
}
size_t dspark_blocks_packed_size(ggml_type type, int64_t K, int64_t n_rows) { return ggml_row_size(type, K) * (size_t) n_rows; }
void dspark_blocks_pack(ggml_type, const char *, size_t, int64_t, int64_t, void *) { GGML_ABORT("no blocks kernels in this build"); }
void dspark_blocks_rows_packed(ggml_type, const void *, int64_t, int64_t, const void * const *, float * const *, int) {
    GGML_ABORT("no blocks kernels in this build");
}

#endif
