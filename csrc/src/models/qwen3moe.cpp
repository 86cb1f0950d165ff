// Qwen3-MoE (GGUF arch "qwen3moe"): Qwen3's attention (per-head q/k norms, NEOX rope) and, in
// place of the dense FFN, the top-k of SwiGLU experts, plus a shared expert when the file has one:
//   x = x + attn(attn_norm(x))
//   h = ffn_norm(x);   p = softmax(ffn_gate_inp · h), top-k, renormalised (expert_weights_norm)
//   x = x + scale · Σ_k p_k · expert_k(h)  [+ sigmoid(ffn_gate_inp_shexp · h) · shexp(h)]
#include "models/target-graph.h"

#include "dspark-impl.h"

#include <cmath>

// The router's keys: how many experts, how many per token, how their weights are normalised.
static void load_router_hparams(target_model & m, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    const std::string a = m.arch->name;
    dspark_target_load_expert_counts(m, f);
    hp.expert_weights_norm  = f.get_bool(a + ".expert_weights_norm", true);
    hp.expert_weights_scale = (float) f.get_float(a + ".expert_weights_scale", 1.0);
    if (!(hp.expert_weights_scale > 0.0f) || !std::isfinite(hp.expert_weights_scale)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_weights_scale must be positive and finite");
    }
}

static void load_qwen3moe(target_model & m, dspark_weights & w) {
    load_router_hparams(m, *w.file);
    dspark_target_uniform_layers(m, w);
    for (int il = 0; il < m.hp.n_layer; ++il) {
        dspark_target_load_attention(m, w, il, /*qkv_bias =*/ false, /*qk_norm =*/ true);
        m.layers[il].ffn_norm = w.req(dspark_target_tensor_name(il, "ffn_norm.weight"), {m.hp.n_embd});
        dspark_target_load_experts(m, w, il, /*fused_gate_up =*/ false);
        dspark_target_load_shared_expert(m, w, il);
    }
}

static ggml_tensor * qwen3moe_layer(const target_layer_io & c, int il, ggml_tensor * x) {
    const target_layer & l = c.layer(il);
    ggml_context * ctx = c.g.ctx;
    x = ggml_add(ctx, x, dspark_target_attention(c, il, c.norm(x, l.attn_norm)));
    ggml_tensor * h = c.norm(x, l.ffn_norm);
    return ggml_add(ctx, x, dspark_target_moe(c, il, h, /*router_in =*/ h, /*gelu =*/ false));
}

extern const target_arch_info dspark_arch_qwen3moe = {
    /*.arch         =*/ target_arch::QWEN3MOE,
    /*.name         =*/ "qwen3moe",
    /*.rope_mode    =*/ GGML_ROPE_TYPE_NEOX,
    /*.load         =*/ load_qwen3moe,
    /*.layer_inputs =*/ nullptr,
    /*.layer        =*/ qwen3moe_layer,
};
