// Llama (GGUF arch "llama"): pre-norm decoder layers with grouped-query attention, normal
// (interleaved-pair) rope, optionally Llama-3.1's per-pair rope_freqs, and a SwiGLU FFN:
//   x = x + attn(attn_norm(x))
//   x = x + ffn_down(silu(ffn_gate · h) ⊙ (ffn_up · h)),   h = ffn_norm(x)
// qwen2 and qwen3 are this layer with more tensors (models/qwen2.cpp, models/qwen3.cpp).
#include "models/target-graph.h"

void dspark_load_llama_layers(target_model & m, dspark_weights & w, bool qkv_bias, bool qk_norm) {
    dspark_target_uniform_layers(m, w);
    for (int il = 0; il < m.hp.n_layer; ++il) {
        dspark_target_load_attention(m, w, il, qkv_bias, qk_norm);
        dspark_target_load_ffn(m, w, il, m.hp.n_ff);
    }
}

ggml_tensor * dspark_llama_layer(const target_layer_io & c, int il, ggml_tensor * x) {
    const target_layer & l = c.layer(il);
    ggml_context * ctx = c.g.ctx;
    x = ggml_add(ctx, x, dspark_target_attention(c, il, c.norm(x, l.attn_norm)));
    ggml_tensor * h = c.norm(x, l.ffn_norm);
    return ggml_add(ctx, x, c.g.ffn(h, l.ffn_gate, l.ffn_up, l.ffn_down, /*gelu =*/ false));
}

static void load_llama(target_model & m, dspark_weights & w) {
    dspark_load_llama_layers(m, w, /*qkv_bias =*/ false, /*qk_norm =*/ false);
}

extern const target_arch_info dspark_arch_llama = {
    /*.arch         =*/ target_arch::LLAMA,
    /*.name         =*/ "llama",
    /*.rope_mode    =*/ 0,
    /*.load         =*/ load_llama,
    /*.layer_inputs =*/ nullptr,
    /*.layer        =*/ dspark_llama_layer,
};
