#include "models/target-graph.h"

#include <cmath>

ggml_tensor * dspark_target_attention(const target_layer_io & c, int il, ggml_tensor * h) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.m.layers[il];
    const dspark_graph & g = c.g;
    ggml_context * ctx = g.ctx;
    const int64_t T = h->ne[1], D = l.head_dim;

    ggml_tensor * q = ggml_reshape_3d(ctx, g.add(g.mm(l.wq, h), l.bq), D, hp.n_head, T);
    if (l.q_norm) {
        q = g.rms_norm(q, l.q_norm, hp.rms_eps);
    }
    q = g.rope(q, c.io.pos, l.rope, l.rope_freqs);
    if (l.has_kv()) {
        ggml_tensor * k_proj = g.add(g.mm(l.wk, h), l.bk);
        ggml_tensor * k = ggml_reshape_3d(ctx, k_proj, D, l.n_head_kv, T);
        // Gemma-4 global layers without attn_v take V from K's projection (attention_k_eq_v)
        ggml_tensor * v = l.wv ? ggml_reshape_3d(ctx, g.add(g.mm(l.wv, h), l.bv), D, l.n_head_kv, T) : k;
        if (l.k_norm) {
            k = g.rms_norm(k, l.k_norm, hp.rms_eps);
        }
        if (hp.gemma) {
            v = g.rms_norm(v, nullptr, hp.rms_eps);  // Gemma-4 normalises V (no weight, no rope)
        }
        k = g.rope(k, c.io.pos, l.rope, l.rope_freqs);
        g.store_kv(c.kv, il, k, v, c.io.kv_idx);
    }
    // Gemma-4 scales nothing: its q/k norms set the logit scale
    const float scale = hp.gemma ? 1.0f : 1.0f / sqrtf((float) D);
    ggml_tensor * mask = l.swa ? c.io.mask_swa : c.io.mask;
    ggml_tensor * a = g.attention(c.kv, l.kv_src, q, mask, c.n_kv, (int) D, l.n_head_kv, scale, c.flash);
    return g.add(g.mm(l.wo, a), l.bo);
}

ggml_tensor * dspark_target_moe(const target_layer_io & c, int il, ggml_tensor * h, ggml_tensor * router_in, bool gelu) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.m.layers[il];
    const dspark_graph & g = c.g;
    dspark_moe e;
    e.gate = l.ffn_gate_exps;
    e.up = l.ffn_up_exps;
    e.gate_up = l.ffn_gate_up_exps;
    e.down = l.ffn_down_exps;
    e.expert_scale = l.ffn_down_exps_s;
    e.n_used = hp.n_expert_used;
    e.renorm = hp.expert_weights_norm;
    e.scale = hp.expert_weights_scale;
    e.gelu = gelu;
    ggml_tensor * y = g.moe_ffn(h, g.mm(l.ffn_gate_inp, router_in), e);
    if (l.ffn_down_shexp) {
        ggml_tensor * s = g.ffn(h, l.ffn_gate_shexp, l.ffn_up_shexp, l.ffn_down_shexp, gelu);
        if (l.ffn_gate_inp_shexp) {
            s = ggml_mul(g.ctx, s, ggml_sigmoid(g.ctx, g.mm(l.ffn_gate_inp_shexp, h)));  // [E, T] · [1, T]
        }
        y = ggml_add(g.ctx, y, s);
    }
    return y;
}

// One llama-family decoder layer: pre-norm attention and FFN (SwiGLU or experts), each added to
// the residual stream x [E, T].
static ggml_tensor * decoder_layer(const target_layer_io & c, int il, ggml_tensor * x) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.m.layers[il];
    const dspark_graph & g = c.g;
    x = ggml_add(g.ctx, x, dspark_target_attention(c, il, g.rms_norm(x, l.attn_norm, hp.rms_eps)));
    ggml_tensor * h = g.rms_norm(x, l.ffn_norm, hp.rms_eps);
    ggml_tensor * y = l.is_moe() ? dspark_target_moe(c, il, h, h, false) : g.ffn(h, l.ffn_gate, l.ffn_up, l.ffn_down, false);
    return ggml_add(g.ctx, x, y);
}

target_graph build_target_graph(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv,
                                int n_tokens, int n_outputs, int n_kv, const std::vector<int32_t> & capture,
                                bool flash_attn, const dspark_sampler_shape * sampling) {
    ggml_context * ctx = g.ctx;
    target_graph io;
    io.tokens = dspark_graph_input(ctx, GGML_TYPE_I32, n_tokens, 0, "inp_tokens");
    io.pos    = dspark_graph_input(ctx, GGML_TYPE_I32, n_tokens, 0, "inp_pos");
    io.kv_idx = dspark_graph_input(ctx, GGML_TYPE_I64, n_tokens, 0, "inp_kv_idx");
    io.mask   = dspark_graph_input(ctx, GGML_TYPE_F16, n_kv, n_tokens, "inp_mask");
    if (m.has_swa()) {
        io.mask_swa = dspark_graph_input(ctx, GGML_TYPE_F16, n_kv, n_tokens, "inp_mask_swa");
    }
    if (n_outputs < n_tokens) {
        io.out_ids = dspark_graph_input(ctx, GGML_TYPE_I32, n_outputs, 0, "inp_out_ids");
    }

    const target_hparams & hp = m.hp;
    const target_layer_io c = {g, m, kv, io, n_kv, flash_attn};
    std::vector<ggml_tensor *> layer_inp(hp.n_layer + 1, nullptr);
    ggml_tensor * x = ggml_get_rows(ctx, m.tok_embd, io.tokens);  // [E, T]
    if (hp.embd_scale != 1.0f) {
        x = ggml_scale(ctx, x, hp.embd_scale);
    }
    ggml_tensor * per_layer = m.per_layer_tok_embd ? dspark_gemma4_per_layer_inputs(g, m, io.tokens, x) : nullptr;
    for (int il = 0; il < hp.n_layer; ++il) {
        layer_inp[il] = x;
        x = hp.gemma ? dspark_gemma4_layer(c, il, x, per_layer) : decoder_layer(c, il, x);
    }
    layer_inp[hp.n_layer] = x;

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
    x = g.rms_norm(x, m.output_norm, hp.rms_eps);
    io.logits = g.mm(m.output, x);
    if (hp.logit_softcap > 0.0f) {
        io.logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, io.logits, 1.0f / hp.logit_softcap)), hp.logit_softcap);
    }
    ggml_set_name(io.logits, "logits");
    if (sampling) {
        // only the sampled ids (and probabilities) leave the backend
        io.sampler = dspark_build_sampler(ctx, io.logits, *sampling);
        for (ggml_tensor * t : {io.sampler.tokens, io.sampler.probed}) {
            if (t) {
                ggml_set_output(t);
                g.expand(t);
            }
        }
        if (sampling->probe) {
            ggml_set_output(io.logits);  // kept on the backend: a rejection reads one row back
        }
        return io;
    }
    ggml_set_output(io.logits);
    g.expand(io.logits);
    return io;
}
