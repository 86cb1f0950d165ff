// What each backend's ggml_mul_mat_id requires of its ids (ggml 0.25.3), checked on the values a
// graph computes. An id that breaks a rule aborts the process inside ggml on that backend, so the
// tests run graphs on the CPU as a device would get them (DSPARK_DEVICE_RULES=cuda / vulkan) under
// DSPARK_CHECK_MUL_MAT_ID=cuda (or vulkan, or 1: the running device's own rules): a rule broken
// there is an error naming the node, not an abort on a GPU.
//   every backend  each id names an expert: 0 <= id < the experts' count.
//   CUDA           no id twice within one token's row, unless ggml-cuda computes the node with
//                  mmvq (quantized experts and at most 4 tokens: get_mmvq_mmid_max_batch is 4 or
//                  more for every type and NVIDIA GPU): its other paths sort the (token, slot)
//                  pairs by expert counting each expert once per token, and then assert that
//                  every pair was counted (ggml-cuda.cu, ggml_cuda_mul_mat_id).
#pragma once

#include "dspark-backend.h"

#include "ggml.h"

#include <cstdint>
#include <string>

// Whether DSPARK_CHECK_MUL_MAT_ID asks for the check (read on every call: a compute reads it once,
// when it is made), and by whose rules:
// `own` for "1" (the running device's), else the backend it names.
bool dspark_mul_mat_id_check_on(dspark_device_rules own, dspark_device_rules & rules);

// The first rule the ids [U, T] of mul_mat_id node `node` break on a backend with `rules`, in words
// naming the node, or "" when they break none.
std::string dspark_mul_mat_id_violation(const ggml_tensor * node, const int32_t * ids, dspark_device_rules rules);
