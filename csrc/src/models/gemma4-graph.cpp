// One Gemma-4 decoder layer and the per-layer embedding inputs, as the model defines them:
//   a = x + post_attn_norm(attn(attn_norm(x)))
//   f = post_ffw_norm(ffn(ffn_norm(a)))                                  dense layers
//   f = post_ffw_norm(post_norm_1(ffn(ffn_norm(a))) + post_norm_2(moe(pre_norm_2(a))))   MoE layers
//   y = a + f;   y = y + post_norm(proj(gelu(inp_gate · y) ⊙ ple_l))      with per-layer embeddings
//   out = y · layer_output_scale
#include "models/target-graph.h"

#include <cmath>

ggml_tensor * dspark_gemma4_per_layer_inputs(const dspark_graph & g, const target_model & m, ggml_tensor * tokens, ggml_tensor * x) {
    ggml_context * ctx = g.ctx;
    const target_hparams & hp = m.hp;
    const int64_t P = hp.n_embd_per_layer, L = hp.n_layer, T = x->ne[1];
    // token identity: its own embedding table, scaled by sqrt(P)
    ggml_tensor * ident = ggml_get_rows(ctx, m.per_layer_tok_embd, tokens);               // [P·L, T]
    ident = ggml_scale(ctx, ggml_reshape_3d(ctx, ident, P, L, T), sqrtf((float) P));
    // context: a projection of the (scaled) token embedding, normed per layer
    ggml_tensor * proj = ggml_scale(ctx, g.mm(m.per_layer_model_proj, x), 1.0f / sqrtf((float) hp.n_embd));
    proj = g.rms_norm(ggml_reshape_3d(ctx, proj, P, L, T), m.per_layer_proj_norm, hp.rms_eps);
    ggml_tensor * both = ggml_scale(ctx, ggml_add(ctx, proj, ident), 1.0f / sqrtf(2.0f));  // [P, L, T]
    return ggml_cont(ctx, ggml_permute(ctx, both, 0, 2, 1, 3));                           // [P, T, L]
}

// The layer's FFN on the attention output a [E, T]: the dense GELU FFN, plus experts in MoE layers.
static ggml_tensor * gemma4_ffn(const target_layer_io & c, int il, ggml_tensor * a) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.m.layers[il];
    const dspark_graph & g = c.g;
    ggml_context * ctx = g.ctx;
    ggml_tensor * dense = g.ffn(g.rms_norm(a, l.ffn_norm, hp.rms_eps), l.ffn_gate, l.ffn_up, l.ffn_down, true);
    if (!l.is_moe()) {
        return dense;
    }
    // the router sees a, normed without weight, times its own scale and 1/sqrt(E)
    ggml_tensor * r = ggml_scale(ctx, g.rms_norm(a, nullptr, hp.rms_eps), 1.0f / sqrtf((float) hp.n_embd));
    r = ggml_mul(ctx, r, l.ffn_gate_inp_s);
    ggml_tensor * experts = dspark_target_moe(c, il, g.rms_norm(a, l.ffn_pre_norm_2, hp.rms_eps), r, true);
    return ggml_add(ctx, g.rms_norm(dense, l.ffn_post_norm_1, hp.rms_eps), g.rms_norm(experts, l.ffn_post_norm_2, hp.rms_eps));
}

ggml_tensor * dspark_gemma4_layer(const target_layer_io & c, int il, ggml_tensor * x, ggml_tensor * per_layer_inp) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.m.layers[il];
    const dspark_graph & g = c.g;
    ggml_context * ctx = g.ctx;

    ggml_tensor * attn = dspark_target_attention(c, il, g.rms_norm(x, l.attn_norm, hp.rms_eps));
    ggml_tensor * a = ggml_add(ctx, x, g.rms_norm(attn, l.attn_post_norm, hp.rms_eps));
    ggml_tensor * y = ggml_add(ctx, a, g.rms_norm(gemma4_ffn(c, il, a), l.ffn_post_norm, hp.rms_eps));

    if (per_layer_inp) {
        const int64_t P = per_layer_inp->ne[0], T = per_layer_inp->ne[1];
        ggml_tensor * ple = ggml_view_2d(ctx, per_layer_inp, P, T, per_layer_inp->nb[1], (size_t) il * per_layer_inp->nb[2]);
        ggml_tensor * h = ggml_mul(ctx, ggml_gelu(ctx, g.mm(l.per_layer_inp_gate, y)), ple);  // [P, T]
        y = ggml_add(ctx, y, g.rms_norm(g.mm(l.per_layer_proj, h), l.per_layer_post_norm, hp.rms_eps));
    }
    return l.out_scale ? ggml_mul(ctx, y, l.out_scale) : y;
}
