// Gemma-4 text models (GGUF arch "gemma4", keys and tensors as llama.cpp's converter writes them).
//
// Layers come in two kinds, by the bool array attention.sliding_window_pattern: sliding layers
// (window attention.sliding_window, head size key_length_swa, rope base rope.freq_base_swa over
// rope.dimension_count_swa dims) and global layers (head size key_length, rope base rope.freq_base,
// "proportional" rope through rope_freqs). The last attention.shared_kv_layers layers have no K/V
// of their own: each reads the cache of the last earlier layer of its kind that has one.
//
// One layer, as the model defines it:
//   a = x + post_attn_norm(attn(attn_norm(x)))          V RMS-normalised, no 1/sqrt(D) (q/k norms set it)
//   f = post_ffw_norm(ffn(ffn_norm(a)))                                  dense layers (GELU FFN)
//   f = post_ffw_norm(post_norm_1(ffn(ffn_norm(a))) + post_norm_2(moe(pre_norm_2(a))))   MoE layers
//   y = a + f;   y = y + post_norm(proj(gelu(inp_gate · y) ⊙ ple_l))      with per-layer embeddings
//   out = y · layer_output_scale
// Around the layers: token embeddings times sqrt(E), logits soft-capped (final_logit_softcapping).
#include "models/target-graph.h"

#include "dspark-impl.h"

#include <cmath>

// Gemma-4's tensors of one layer beyond the shared ones (target_layer).
struct gemma4_layer {
    ggml_tensor * attn_post_norm = nullptr;
    ggml_tensor * ffn_post_norm  = nullptr;
    ggml_tensor * out_scale      = nullptr;  // {1}: the layer's output times this
    // MoE layers: the router input's scale {E} and the norms around the dense and expert branches
    ggml_tensor * ffn_gate_inp_s = nullptr;
    ggml_tensor * ffn_pre_norm_2 = nullptr, * ffn_post_norm_1 = nullptr, * ffn_post_norm_2 = nullptr;
    // per-layer embeddings: {E, P}, {P, E}, {E}
    ggml_tensor * per_layer_inp_gate = nullptr, * per_layer_proj = nullptr, * per_layer_post_norm = nullptr;
};

struct gemma4_model : target_arch_data {
    int n_embd_per_layer = 0;  // P: width of the per-layer token embeddings (0: none)
    // per-layer embeddings: {P·L, V}, {E, P·L}, {P}
    ggml_tensor * per_layer_tok_embd = nullptr, * per_layer_model_proj = nullptr, * per_layer_proj_norm = nullptr;
    std::vector<gemma4_layer> layers;
};

static gemma4_model & gemma4_of(target_model & m) {
    return static_cast<gemma4_model &>(*m.arch_data);
}
static const gemma4_model & gemma4_of(const target_model & m) {
    return static_cast<const gemma4_model &>(*m.arch_data);
}

// Each layer's kind (sliding or global) and, by it, its head size, KV heads and rope.
static void load_layer_geometry(target_model & m, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    const std::string a = m.arch->name;
    const std::vector<bool> pattern = f.get_bool_array(a + ".attention.sliding_window_pattern");
    if ((int) pattern.size() != hp.n_layer) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.sliding_window_pattern has " + std::to_string(pattern.size()) +
               " entries for " + std::to_string(hp.n_layer) + " layers");
    }
    hp.n_swa = (int) f.get_int(a + ".attention.sliding_window");
    const int64_t head_dim_swa = f.get_int(a + ".attention.key_length_swa");
    if (f.get_int(a + ".attention.value_length_swa", head_dim_swa) != head_dim_swa) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "key_length_swa != value_length_swa is not supported");
    }
    if (head_dim_swa <= 0 || head_dim_swa > 4096 || head_dim_swa % 2 != 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.key_length_swa must be positive and even");
    }
    dspark_rope rope_swa = hp.rope;
    rope_swa.n_rot     = (int) f.get_int(a + ".rope.dimension_count_swa", head_dim_swa);
    rope_swa.freq_base = (float) f.get_float(a + ".rope.freq_base_swa", hp.rope.freq_base);
    if (rope_swa.n_rot <= 0 || rope_swa.n_rot > head_dim_swa || rope_swa.n_rot % 2 != 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "rope.dimension_count_swa must be even and at most key_length_swa");
    }
    bool any_swa = false;
    for (int il = 0; il < hp.n_layer; ++il) {
        target_layer & l = m.layers[il];
        l.swa       = pattern[il];
        l.head_dim  = l.swa ? (int) head_dim_swa : hp.head_dim;
        l.n_head_kv = hp.n_head_kv_l[il];
        l.rope      = l.swa ? rope_swa : hp.rope;
        any_swa = any_swa || l.swa;
    }
    if (any_swa && hp.n_swa <= 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.sliding_window must be positive when sliding layers exist");
    }
}

// Which layer's cache each layer reads: its own, except the last attention.shared_kv_layers ones.
static void load_kv_sharing(target_model & m, const dspark_gguf & f) {
    const target_hparams & hp = m.hp;
    const int64_t n_shared = f.get_int(std::string(m.arch->name) + ".attention.shared_kv_layers", 0);
    if (n_shared < 0 || n_shared >= hp.n_layer) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.shared_kv_layers (" + std::to_string(n_shared) +
               ") must be below block_count (" + std::to_string(hp.n_layer) + ")");
    }
    const int first_shared = hp.n_layer - (int) n_shared;
    for (int il = 0; il < hp.n_layer; ++il) {
        target_layer & l = m.layers[il];
        l.kv_src = il;
        if (il < first_shared) {
            continue;
        }
        l.kv_src = -1;
        for (int j = first_shared - 1; j >= 0 && l.kv_src < 0; --j) {
            if (m.layers[j].swa == l.swa) {
                l.kv_src = j;
            }
        }
        if (l.kv_src < 0) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "layer " + std::to_string(il) + " shares the KV of an earlier " +
                   (l.swa ? "sliding" : "global") + " layer, but there is none (attention.shared_kv_layers)");
        }
        const target_layer & src = m.layers[l.kv_src];
        if (src.head_dim != l.head_dim || src.n_head_kv != l.n_head_kv) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "layer " + std::to_string(il) + " shares the KV of layer " +
                   std::to_string(l.kv_src) + ", whose head size or KV head count differs");
        }
    }
}

static void load_attention(target_model & m, dspark_weights & w, int il) {
    const target_hparams & hp = m.hp;
    target_layer & l = m.layers[il];
    gemma4_layer & gl = gemma4_of(m).layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    const int64_t E = hp.n_embd, D = l.head_dim;
    const int64_t nq = D * hp.n_head, nk = D * l.n_head_kv;

    l.attn_norm = w.req(name("attn_norm.weight"), {E});
    l.wq = w.req(name("attn_q.weight"), {E, nq});
    l.q_norm = w.req(name("attn_q_norm.weight"), {D});
    if (l.kv_src == il) {
        l.wk = w.req(name("attn_k.weight"), {E, nk});
        l.wv = w.opt(name("attn_v.weight"), {E, nk});  // absent: V is K's projection (attention_k_eq_v)
        l.k_norm = w.req(name("attn_k_norm.weight"), {D});
    } else {
        // checkpoints may still carry the unused K/V of a sharing layer: accepted and left unread
        w.opt(name("attn_k.weight"), {E, nk});
        w.opt(name("attn_v.weight"), {E, nk});
        w.opt(name("attn_k_norm.weight"), {D});
    }
    l.wo = w.req(name("attn_output.weight"), {nq, E});
    gl.attn_post_norm = w.req(name("post_attention_norm.weight"), {E});
    gl.out_scale = w.opt(name("layer_output_scale.weight"), {1});
    if (!l.swa) {
        l.rope_freqs = m.rope_freqs;
    }
}

// The dense FFN, and the experts next to it in MoE layers.
static void load_ffn(target_model & m, dspark_weights & w, int il) {
    const target_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    target_layer & l = m.layers[il];
    gemma4_layer & gl = gemma4_of(m).layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    const int64_t E = hp.n_embd;

    dspark_target_load_ffn(m, w, il, hp.n_ff_l[il]);
    gl.ffn_post_norm = w.req(name("post_ffw_norm.weight"), {E});
    if (!f.find_tensor(name("ffn_gate_inp.weight"))) {
        return;
    }
    if (hp.n_expert == 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, name("ffn_gate_inp.weight") + " exists but gemma4.expert_count is missing");
    }
    dspark_target_load_experts(m, w, il, /*fused_gate_up =*/ true);
    gl.ffn_gate_inp_s  = w.req(name("ffn_gate_inp.scale"), {E});
    l.ffn_down_exps_s  = w.opt(name("ffn_down_exps.scale"), {hp.n_expert});
    gl.ffn_pre_norm_2  = w.req(name("pre_ffw_norm_2.weight"), {E});
    gl.ffn_post_norm_1 = w.req(name("post_ffw_norm_1.weight"), {E});
    gl.ffn_post_norm_2 = w.req(name("post_ffw_norm_2.weight"), {E});
}

static void load_per_layer_embd(target_model & m, dspark_weights & w, int il) {
    gemma4_model & g4 = gemma4_of(m);
    if (g4.n_embd_per_layer == 0) {
        return;
    }
    gemma4_layer & gl = g4.layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    const int64_t E = m.hp.n_embd, P = g4.n_embd_per_layer;
    gl.per_layer_inp_gate  = w.req(name("inp_gate.weight"), {E, P});
    gl.per_layer_proj      = w.req(name("proj.weight"), {P, E});
    gl.per_layer_post_norm = w.req(name("post_norm.weight"), {E});
}

// Scalars around the layers: embedding scale, logit soft-capping, per-layer embedding width, experts.
static void load_hparams(target_model & m, gemma4_model & g4, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    const std::string a = m.arch->name;
    dspark_target_load_gemma_scales(m, f);
    g4.n_embd_per_layer = (int) f.get_int(a + ".embedding_length_per_layer_input", 0);
    if (g4.n_embd_per_layer < 0 || g4.n_embd_per_layer > (1 << 16)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "embedding_length_per_layer_input is out of range");
    }
    if (f.has_key(a + ".expert_count")) {
        dspark_target_load_expert_counts(m, f);
    }
}

static void load_gemma4(target_model & m, dspark_weights & w) {
    const target_hparams & hp = m.hp;
    gemma4_model * g4 = new gemma4_model();
    m.arch_data.reset(g4);
    g4->layers.assign(hp.n_layer, gemma4_layer());
    load_hparams(m, *g4, *w.file);
    load_layer_geometry(m, *w.file);
    load_kv_sharing(m, *w.file);

    // proportional rope of the global layers: one factor per rotated pair
    m.rope_freqs = w.opt("rope_freqs.weight", {hp.rope.n_rot / 2});
    if (g4->n_embd_per_layer > 0) {
        const int64_t P = g4->n_embd_per_layer, L = hp.n_layer;
        g4->per_layer_tok_embd   = w.req("per_layer_token_embd.weight", {P * L, hp.n_vocab});
        g4->per_layer_model_proj = w.req("per_layer_model_proj.weight", {hp.n_embd, P * L});
        g4->per_layer_proj_norm  = w.req("per_layer_proj_norm.weight", {P});
        m.lookup_tables.push_back("per_layer_token_embd.weight");
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        load_attention(m, w, il);
        load_ffn(m, w, il);
        load_per_layer_embd(m, w, il);
    }
}

// The per-layer embedding inputs [P, T, L] of tokens whose scaled embeddings are x [E, T]; null
// for models without per-layer embeddings.
static ggml_tensor * per_layer_inputs(const dspark_graph & g, const target_model & m, ggml_tensor * tokens, ggml_tensor * x) {
    const gemma4_model & g4 = gemma4_of(m);
    if (!g4.per_layer_tok_embd) {
        return nullptr;
    }
    ggml_context * ctx = g.ctx;
    const target_hparams & hp = m.hp;
    const int64_t P = g4.n_embd_per_layer, L = hp.n_layer, T = x->ne[1];
    // token identity: its own embedding table, scaled by sqrt(P)
    ggml_tensor * ident = ggml_get_rows(ctx, g4.per_layer_tok_embd, tokens);               // [P·L, T]
    ident = ggml_scale(ctx, ggml_reshape_3d(ctx, ident, P, L, T), sqrtf((float) P));
    // context: a projection of the (scaled) token embedding, normed per layer
    ggml_tensor * proj = ggml_scale(ctx, g.mm(g4.per_layer_model_proj, x), 1.0f / sqrtf((float) hp.n_embd));
    proj = g.rms_norm(ggml_reshape_3d(ctx, proj, P, L, T), g4.per_layer_proj_norm, hp.rms_eps);
    ggml_tensor * both = ggml_scale(ctx, ggml_add(ctx, proj, ident), 1.0f / sqrtf(2.0f));  // [P, L, T]
    return ggml_cont(ctx, ggml_permute(ctx, both, 0, 2, 1, 3));                           // [P, T, L]
}

// The layer's FFN on the attention output a [E, T]: the dense GELU FFN, plus experts in MoE layers.
static ggml_tensor * ffn(const target_layer_io & c, int il, ggml_tensor * a) {
    const target_layer & l = c.layer(il);
    const gemma4_layer & gl = gemma4_of(c.m).layers[il];
    ggml_context * ctx = c.g.ctx;
    ggml_tensor * dense = c.g.ffn(c.norm(a, l.ffn_norm), l.ffn_gate, l.ffn_up, l.ffn_down, /*gelu =*/ true);
    if (!l.is_moe()) {
        return dense;
    }
    // the router sees a, normed without weight, times its own scale and 1/sqrt(E)
    ggml_tensor * r = ggml_scale(ctx, c.norm(a, nullptr), 1.0f / sqrtf((float) c.m.hp.n_embd));
    r = ggml_mul(ctx, r, gl.ffn_gate_inp_s);
    ggml_tensor * experts = dspark_target_moe(c, il, c.norm(a, gl.ffn_pre_norm_2), r, /*gelu =*/ true);
    return ggml_add(ctx, c.norm(dense, gl.ffn_post_norm_1), c.norm(experts, gl.ffn_post_norm_2));
}

// y + post_norm(proj(gelu(inp_gate · y) ⊙ ple_l)): the layer's slice of the per-layer inputs.
static ggml_tensor * add_per_layer_input(const target_layer_io & c, int il, ggml_tensor * y) {
    const gemma4_layer & gl = gemma4_of(c.m).layers[il];
    ggml_context * ctx = c.g.ctx;
    ggml_tensor * inp = c.layer_inp;  // [P, T, L]
    const int64_t P = inp->ne[0], T = inp->ne[1];
    ggml_tensor * ple = ggml_view_2d(ctx, inp, P, T, inp->nb[1], (size_t) il * inp->nb[2]);
    ggml_tensor * h = ggml_mul(ctx, ggml_gelu(ctx, c.g.mm(gl.per_layer_inp_gate, y)), ple);  // [P, T]
    return ggml_add(ctx, y, c.norm(c.g.mm(gl.per_layer_proj, h), gl.per_layer_post_norm));
}

static ggml_tensor * gemma4_layer_graph(const target_layer_io & c, int il, ggml_tensor * x) {
    const target_layer & l = c.layer(il);
    const gemma4_layer & gl = gemma4_of(c.m).layers[il];
    ggml_context * ctx = c.g.ctx;
    // no 1/sqrt(D): the q/k norms set the logit scale; V is RMS-normalised too
    const target_attn_opts attn_opts = {/*.kq_scale =*/ 1.0f, /*.v_norm =*/ true};

    ggml_tensor * attn = dspark_target_attention(c, il, c.norm(x, l.attn_norm), attn_opts);
    ggml_tensor * a = ggml_add(ctx, x, c.norm(attn, gl.attn_post_norm));
    ggml_tensor * y = ggml_add(ctx, a, c.norm(ffn(c, il, a), gl.ffn_post_norm));
    if (c.layer_inp) {
        y = add_per_layer_input(c, il, y);
    }
    return gl.out_scale ? ggml_mul(ctx, y, gl.out_scale) : y;
}

extern const target_arch_info dspark_arch_gemma4 = {
    /*.arch         =*/ target_arch::GEMMA4,
    /*.name         =*/ "gemma4",
    /*.rope_mode    =*/ GGML_ROPE_TYPE_NEOX,
    /*.load         =*/ load_gemma4,
    /*.layer_inputs =*/ per_layer_inputs,
    /*.layer        =*/ gemma4_layer_graph,
};
