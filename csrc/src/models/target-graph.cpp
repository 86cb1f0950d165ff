#include "models/target-graph.h"

#include <cmath>

// One decoder layer: pre-norm attention and SwiGLU FFN, each added to the residual stream x [E, T].
static ggml_tensor * decoder_layer(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv, int il,
                                   ggml_tensor * x, const target_graph & io, int n_kv, bool flash) {
    const target_hparams & hp = m.hp;
    const target_layer & l = m.layers[il];
    ggml_context * ctx = g.ctx;
    const int64_t T = x->ne[1];

    // attention
    ggml_tensor * h = g.rms_norm(x, l.attn_norm, hp.rms_eps);
    ggml_tensor * q = ggml_reshape_3d(ctx, g.add(g.mm(l.wq, h), l.bq), hp.head_dim, hp.n_head, T);
    ggml_tensor * k = ggml_reshape_3d(ctx, g.add(g.mm(l.wk, h), l.bk), hp.head_dim, hp.n_head_kv, T);
    ggml_tensor * v = ggml_reshape_3d(ctx, g.add(g.mm(l.wv, h), l.bv), hp.head_dim, hp.n_head_kv, T);
    if (hp.qk_norm) {
        q = g.rms_norm(q, l.q_norm, hp.rms_eps);
        k = g.rms_norm(k, l.k_norm, hp.rms_eps);
    }
    q = g.rope(q, io.pos, hp.rope, m.rope_freqs);
    k = g.rope(k, io.pos, hp.rope, m.rope_freqs);
    g.store_kv(kv, il, k, v, io.kv_idx);
    const float scale = 1.0f / sqrtf((float) hp.head_dim);
    ggml_tensor * a = g.attention(kv, il, q, io.mask, n_kv, hp.head_dim, hp.n_head_kv, scale, flash);
    x = ggml_add(ctx, x, g.add(g.mm(l.wo, a), l.bo));

    // feed-forward
    h = g.rms_norm(x, l.ffn_norm, hp.rms_eps);
    return ggml_add(ctx, x, g.ffn(h, l.ffn_gate, l.ffn_up, l.ffn_down, false));
}

target_graph build_target_graph(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv,
                                int n_tokens, int n_outputs, int n_kv, const std::vector<int32_t> & capture,
                                bool flash_attn, const std::vector<target_sampling_group> * sampling) {
    ggml_context * ctx = g.ctx;
    target_graph io;
    io.tokens = dspark_graph_input(ctx, GGML_TYPE_I32, n_tokens, 0, "inp_tokens");
    io.pos    = dspark_graph_input(ctx, GGML_TYPE_I32, n_tokens, 0, "inp_pos");
    io.kv_idx = dspark_graph_input(ctx, GGML_TYPE_I64, n_tokens, 0, "inp_kv_idx");
    io.mask   = dspark_graph_input(ctx, GGML_TYPE_F16, n_kv, n_tokens, "inp_mask");
    if (n_outputs < n_tokens) {
        io.out_ids = dspark_graph_input(ctx, GGML_TYPE_I32, n_outputs, 0, "inp_out_ids");
    }

    const int n_layer = m.hp.n_layer;
    std::vector<ggml_tensor *> layer_inp(n_layer + 1, nullptr);
    ggml_tensor * x = ggml_get_rows(ctx, m.tok_embd, io.tokens);  // [E, T]
    for (int il = 0; il < n_layer; ++il) {
        layer_inp[il] = x;
        x = decoder_layer(g, m, kv, il, x, io, n_kv, flash_attn);
    }
    layer_inp[n_layer] = x;

    // the draft's features: the residual streams entering the requested layers, concatenated
    for (int32_t id : capture) {
        io.captured = io.captured ? ggml_concat(ctx, io.captured, layer_inp[id], 0) : layer_inp[id];
    }
    if (io.captured) {
        if (capture.size() == 1) {
            io.captured = ggml_cont(ctx, io.captured);  // its own buffer, not a reused intermediate
        }
        ggml_set_name(io.captured, "captured");
        ggml_set_output(io.captured);
        g.expand(io.captured);
    }

    if (io.out_ids) {
        x = ggml_get_rows(ctx, x, io.out_ids);  // only output rows reach the (large) lm head
    }
    x = g.rms_norm(x, m.output_norm, m.hp.rms_eps);
    io.logits = g.mm(m.output, x);
    ggml_set_name(io.logits, "logits");
    if (sampling && !sampling->empty()) {
        // only the sampled ids leave the backend
        io.uniforms = dspark_graph_input(ctx, GGML_TYPE_F32, 1, n_outputs, "inp_uniforms");
        for (const target_sampling_group & sg : *sampling) {
            ggml_tensor * rows = ggml_view_2d(ctx, io.logits, io.logits->ne[0], sg.count, io.logits->nb[1], io.logits->nb[1] * sg.begin);
            ggml_tensor * u = ggml_view_2d(ctx, io.uniforms, 1, sg.count, io.uniforms->nb[1], io.uniforms->nb[1] * sg.begin);
            ggml_tensor * ids = dspark_build_sampler(ctx, rows, u, sg.params);
            ggml_set_output(ids);
            g.expand(ids);
            io.sampled.push_back(ids);
        }
        return io;
    }
    ggml_set_output(io.logits);
    g.expand(io.logits);
    return io;
}
