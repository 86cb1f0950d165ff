// Qwen3 (GGUF arch "qwen3"): Llama's layer (models/llama.cpp) with a per-head RMSNorm on q and k
// before rope, and NEOX (half-split) rope:
//   q = rope(q_norm(wq · h)),   k = rope(k_norm(wk · h))
#include "models/target-graph.h"

#include "ggml.h"

static void load_qwen3(target_model & m, dspark_weights & w) {
    dspark_load_llama_layers(m, w, /*qkv_bias =*/ false, /*qk_norm =*/ true);
}

extern const target_arch_info dspark_arch_qwen3 = {
    /*.arch         =*/ target_arch::QWEN3,
    /*.name         =*/ "qwen3",
    /*.rope_mode    =*/ GGML_ROPE_TYPE_NEOX,
    /*.load         =*/ load_qwen3,
    /*.layer_inputs =*/ nullptr,
    /*.layer        =*/ dspark_llama_layer,
};
