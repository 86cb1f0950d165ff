#include "models/target-graph.h"

#include <algorithm>
#include <cmath>

ggml_tensor * dspark_target_attention(const target_layer_io & c, int il, ggml_tensor * h, const target_attn_opts & opts) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.layer(il);
    const dspark_graph & g = c.g;
    ggml_context * ctx = g.ctx;
    const int64_t T = h->ne[1], D = l.head_dim;

    ggml_tensor * q = ggml_reshape_3d(ctx, g.add(g.mm(l.wq, h), l.bq), D, hp.n_head, T);  // [D, H, T]
    if (l.q_norm) {
        q = c.norm(q, l.q_norm);
    }
    q = g.rope(q, c.io.pos, l.rope, l.rope_freqs);
    if (l.has_kv()) {
        ggml_tensor * k_proj = g.add(g.mm(l.wk, h), l.bk);
        ggml_tensor * k = ggml_reshape_3d(ctx, k_proj, D, l.n_head_kv, T);  // [D, Hkv, T]
        // a layer without its own V projection takes V from K's (before K's norm and rope)
        ggml_tensor * v = l.wv ? ggml_reshape_3d(ctx, g.add(g.mm(l.wv, h), l.bv), D, l.n_head_kv, T) : k;
        if (l.k_norm) {
            k = c.norm(k, l.k_norm);
        }
        if (opts.v_norm) {
            v = c.norm(v, nullptr);
        }
        k = g.rope(k, c.io.pos, l.rope, l.rope_freqs);
        g.store_kv(c.kv, il, k, v, c.io.kv_idx);
    }
    const float scale = opts.kq_scale != 0.0f ? opts.kq_scale : 1.0f / sqrtf((float) D);
    ggml_tensor * a;  // [D·H, T]
    const target_in_order & o = c.io.in_order;
    if (o.n > 0 && (o.host_too || !dspark_graph_cache_on_host(c.kv.k[l.kv_src]))) {
        a = g.attention_in_order(c.kv, l.kv_src, q, o.layer(l.n_head_kv, l.swa), (int) D, l.n_head_kv, scale);
    } else {
        ggml_tensor * mask = l.swa ? c.io.mask_swa : c.io.mask;
        a = g.attention(c.kv, l.kv_src, q, mask, c.n_kv, (int) D, l.n_head_kv, scale, c.flash);
    }
    return g.add(g.mm(l.wo, a), l.bo);
}

ggml_tensor * dspark_target_moe(const target_layer_io & c, int il, ggml_tensor * h, ggml_tensor * router_in, bool gelu) {
    const target_hparams & hp = c.m.hp;
    const target_layer & l = c.layer(il);
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

dspark_in_order_io target_in_order::layer(int n_head_kv, bool sliding) const {
    dspark_in_order_io io;
    io.n = n;
    io.n_v = n_v;
    io.per_slot = per_slot;
    io.cells_k = cells_k;
    io.cells_v = cells_v;
    io.mask = sliding ? mask_swa : mask;
    io.columns = columns;
    io.rows = rows;
    for (const auto & h : heads) {
        io.heads = h.first == n_head_kv ? h.second : io.heads;
    }
    return io;
}

static target_in_order in_order_inputs(ggml_context * ctx, const target_model & m, int n_tokens,
                                       const target_in_order_shape & shape) {
    target_in_order o;
    o.n = shape.cells;
    o.n_v = shape.per_slot > 0 ? o.n : std::max(shape.cells, 1024);  // see dspark_graph::attention_in_order
    o.slots = shape.slots;
    o.per_slot = shape.per_slot;
    o.host_too = shape.host_too;
    o.cells_k = dspark_graph_input(ctx, GGML_TYPE_I32, o.n * o.slots, 0, "inp_in_order_cells_k");
    if (o.per_slot == 0) {
        o.cells_v = dspark_graph_input(ctx, GGML_TYPE_I32, o.n_v * o.slots, 0, "inp_in_order_cells_v");
    }
    const int64_t queries = o.per_slot > 0 ? o.slots * o.per_slot : n_tokens;  // the mask's rows
    o.mask = dspark_graph_input(ctx, GGML_TYPE_F32, o.n, queries, "inp_in_order_mask");
    if (m.has_swa()) {
        o.mask_swa = dspark_graph_input(ctx, GGML_TYPE_F32, o.n, queries, "inp_in_order_mask_swa");
    }
    if (o.per_slot > 0) {
        if (!shape.batch_order) {
            o.columns = dspark_graph_input(ctx, GGML_TYPE_I32, queries, 0, "inp_in_order_columns");
            o.rows = dspark_graph_input(ctx, GGML_TYPE_I32, n_tokens, 0, "inp_in_order_rows");
        }
        return o;
    }
    for (const target_layer & l : m.layers) {
        if (!o.layer(l.n_head_kv, false).heads) {
            ggml_tensor * h = dspark_graph_input(ctx, GGML_TYPE_I32, (int64_t) m.hp.n_head * n_tokens, 1, "inp_in_order_heads");
            o.heads.emplace_back(l.n_head_kv, h);
        }
    }
    return o;
}

// The graph's inputs, filled on the host after allocation.
static target_graph graph_inputs(ggml_context * ctx, const target_model & m, int n_tokens, int n_outputs, int n_kv) {
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
    return io;
}

// The draft's features [len(capture)·E, T]: the residual streams entering the requested layers
// (layer_inp[id]), concatenated; null when nothing is captured.
static ggml_tensor * captured_features(const dspark_graph & g, const std::vector<ggml_tensor *> & layer_inp,
                                       const std::vector<int32_t> & capture) {
    ggml_tensor * out = nullptr;
    for (int32_t id : capture) {
        out = out ? ggml_concat(g.ctx, out, layer_inp[id], 0) : layer_inp[id];
    }
    if (!out) {
        return nullptr;
    }
    if (capture.size() == 1) {
        out = ggml_cont(g.ctx, out);  // its own buffer, not a reused intermediate
    }
    ggml_set_name(out, "captured");
    ggml_set_output(out);
    g.expand(out);
    return out;
}

// The logits [V, n_outputs] of the final residual stream x [E, T]: output norm and lm head on the
// output rows only, then the optional soft-capping c · tanh(logits / c).
static ggml_tensor * output_logits(const dspark_graph & g, const target_model & m, ggml_tensor * x, ggml_tensor * out_ids) {
    ggml_context * ctx = g.ctx;
    const target_hparams & hp = m.hp;
    if (out_ids) {
        x = ggml_get_rows(ctx, x, out_ids);  // only output rows reach the (large) lm head
    }
    x = g.rms_norm(x, m.output_norm, hp.rms_eps);
    ggml_tensor * logits = g.mm(m.output, x);
    if (hp.logit_softcap > 0.0f) {
        logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits, 1.0f / hp.logit_softcap)), hp.logit_softcap);
    }
    ggml_set_name(logits, "logits");
    return logits;
}

// In-graph sampling of io.logits, one sampler per output row: only the sampled ids (and the
// probed probabilities) leave the backend.
static void sample_in_graph(const dspark_graph & g, target_graph & io, const dspark_sampler_shape & sampling) {
    io.sampler = dspark_build_sampler(g.ctx, io.logits, sampling);
    for (ggml_tensor * t : {io.sampler.tokens, io.sampler.probed}) {
        if (t) {
            ggml_set_output(t);
            g.expand(t);
        }
    }
    if (sampling.probe) {
        ggml_set_output(io.logits);  // kept on the backend: a rejection reads one row back
    }
}

target_graph build_target_graph(const dspark_graph & g, const target_model & m, const dspark_kv_cache & kv,
                                int n_tokens, int n_outputs, int n_kv, const std::vector<int32_t> & capture,
                                bool flash_attn, const dspark_sampler_shape * sampling,
                                const target_in_order_shape & in_order) {
    ggml_context * ctx = g.ctx;
    const target_hparams & hp = m.hp;
    target_graph io = graph_inputs(ctx, m, n_tokens, n_outputs, n_kv);
    if (in_order.cells > 0) {
        io.in_order = in_order_inputs(ctx, m, n_tokens, in_order);
    }

    ggml_tensor * x = ggml_get_rows(ctx, m.tok_embd, io.tokens);  // [E, T]
    if (hp.embd_scale != 1.0f) {
        x = ggml_scale(ctx, x, hp.embd_scale);
    }
    target_layer_io c = {g, m, kv, io, n_kv, flash_attn};
    if (m.arch->layer_inputs) {
        c.layer_inp = m.arch->layer_inputs(g, m, io.tokens, x);
    }
    std::vector<ggml_tensor *> layer_inp(hp.n_layer + 1, nullptr);  // the residual stream entering each layer
    for (int il = 0; il < hp.n_layer; ++il) {
        layer_inp[il] = x;
        x = m.arch->layer(c, il, x);
    }
    layer_inp[hp.n_layer] = x;

    io.captured = captured_features(g, layer_inp, capture);
    io.logits = output_logits(g, m, x, io.out_ids);
    if (sampling) {
        sample_in_graph(g, io, *sampling);
        return io;
    }
    ggml_set_output(io.logits);
    g.expand(io.logits);
    return io;
}
