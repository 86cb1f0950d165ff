#include "dspark-mul-mat-id-check.h"

#include <cstdlib>
#include <cstring>
#include <vector>

// The most tokens for which ggml-cuda's mul_mat_id takes mmvq on every NVIDIA GPU and type.
constexpr int64_t CUDA_MMVQ_TOKENS = 4;

bool dspark_mul_mat_id_check_on(dspark_device_rules own, dspark_device_rules & rules) {
    const char * v = getenv("DSPARK_CHECK_MUL_MAT_ID");
    if (!v || v[0] == '\0' || strcmp(v, "0") == 0) {
        return false;
    }
    rules = strcmp(v, "cuda") == 0 ? dspark_device_rules::cuda : strcmp(v, "vulkan") == 0 ? dspark_device_rules::vulkan : own;
    return true;
}

std::string dspark_mul_mat_id_violation(const ggml_tensor * node, const int32_t * ids, dspark_device_rules rules) {
    const ggml_tensor * as = node->src[0];
    const ggml_tensor * t_ids = node->src[2];
    const int64_t U = t_ids->ne[0], T = t_ids->ne[1], X = as->ne[2];
    const bool mmvq = ggml_is_quantized(as->type) && node->ne[2] <= CUDA_MMVQ_TOKENS;
    const size_t row_stride = t_ids->nb[1] / sizeof(int32_t), col_stride = t_ids->nb[0] / sizeof(int32_t);
    std::vector<int64_t> seen_in_row((size_t) X, -1);
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t u = 0; u < U; ++u) {
            const int32_t id = ids[t * row_stride + u * col_stride];
            std::string where = std::string("mul_mat_id '") + ggml_get_name(node) + "' token " + std::to_string(t) +
                                " slot " + std::to_string(u) + ": id " + std::to_string(id);
            if (id < 0 || id >= X) {
                return where + " is not one of its " + std::to_string(X) + " experts";
            }
            if (rules == dspark_device_rules::cuda && !mmvq && seen_in_row[(size_t) id] == t) {
                return where + " repeats within the token's row (" + ggml_type_name(as->type) + " experts, " +
                       std::to_string(node->ne[2]) + (node->ne[2] == 1 ? " token" : " tokens") + "), which ggml-cuda's sorting path cannot take";
            }
            seen_in_row[(size_t) id] = t;
        }
    }
    return "";
}
