// Qwen2 (GGUF arch "qwen2"): Llama's layer (models/llama.cpp) with biases on the q, k and v
// projections and NEOX (half-split) rope:
//   q = wq · h + bq,   k = wk · h + bk,   v = wv · h + bv
#include "models/target-graph.h"

#include "ggml.h"

static void load_qwen2(target_model & m, dspark_weights & w) {
    dspark_load_llama_layers(m, w, /*qkv_bias =*/ true, /*qk_norm =*/ false);
}

extern const target_arch_info dspark_arch_qwen2 = {
    /*.arch         =*/ target_arch::QWEN2,
    /*.name         =*/ "qwen2",
    /*.rope_mode    =*/ GGML_ROPE_TYPE_NEOX,
    /*.load         =*/ load_qwen2,
    /*.layer_inputs =*/ nullptr,
    /*.layer        =*/ dspark_llama_layer,
};
