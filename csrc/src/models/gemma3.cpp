// Gemma-3 text models (GGUF arch "gemma3", keys and tensors as llama.cpp's converter writes them).
//
// Layers are sliding-window or global by attention.sliding_window_pattern: a bool per layer, or a
// period n whose last layer in every n is global (llama.cpp's default: 6); without a sliding
// window every layer is global. Sliding layers rope with rope.freq_base_swa (10000 when absent)
// and no scaling, global layers with rope.freq_base and the file's rope scaling. Every layer has
// the same head size and KV heads.
//
// One layer, as the model defines it (RMSNorm weights already hold Gemma's 1 + w):
//   a = x + post_attn_norm(attn(attn_norm(x)))      q/k RMS-normed per head, logits · kq_scale
//   y = a + post_ffw_norm(ffn(ffn_norm(a)))         GELU-gated FFN
// Around the layers: token embeddings times sqrt(E), logits soft-capped when
// final_logit_softcapping is given.
#include "models/target-graph.h"

#include "dspark-impl.h"

#include <cmath>

struct gemma3_model : target_arch_data {
    float kq_scale = 0.0f;  // attention logits times this
    std::vector<ggml_tensor *> attn_post_norm, ffn_post_norm;
};

static const gemma3_model & gemma3_of(const target_model & m) {
    return static_cast<const gemma3_model &>(*m.arch_data);
}

// Which layers slide: the pattern key as an array (one bool per layer) or as a period.
static std::vector<bool> sliding_layers(const dspark_gguf & f, const std::string & a, int n_layer) {
    const std::string key = a + ".attention.sliding_window_pattern";
    const int64_t ki = f.find_key(key);
    if (ki >= 0 && gguf_get_kv_type(f.gguf, ki) == GGUF_TYPE_ARRAY) {
        std::vector<bool> pattern = f.get_bool_array(key);
        if ((int) pattern.size() != n_layer) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.sliding_window_pattern has " + std::to_string(pattern.size()) +
                   " entries for " + std::to_string(n_layer) + " layers");
        }
        return pattern;
    }
    const int64_t period = f.get_int(key, 6);
    if (period < 0 || period > (1 << 16)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.sliding_window_pattern (" + std::to_string(period) +
               ") must be a layer period >= 0");
    }
    std::vector<bool> pattern(n_layer);
    for (int il = 0; il < n_layer; ++il) {
        pattern[il] = period == 0 || il % period < period - 1;  // period 0: every layer slides
    }
    return pattern;
}

// Each layer's kind and rope, and the window the sliding ones see.
static void load_layer_kinds(target_model & m, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    const std::string a = m.arch->name;
    const std::string window_key = a + ".attention.sliding_window";
    hp.n_swa = f.has_key(window_key) ? (int) f.get_int(window_key) : 0;
    if (f.has_key(window_key) && (hp.n_swa <= 0 || hp.n_swa > (1 << 24))) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "attention.sliding_window (" + std::to_string(hp.n_swa) +
               ") must be positive; leave the key out for a model without sliding layers");
    }
    const std::vector<bool> sliding = hp.n_swa > 0 ? sliding_layers(f, a, hp.n_layer) : std::vector<bool>(hp.n_layer);
    dspark_rope rope_swa = hp.rope;
    rope_swa.freq_base  = (float) f.get_float(a + ".rope.freq_base_swa", 10000.0);
    rope_swa.freq_scale = 1.0f;
    if (!(rope_swa.freq_base > 0.0f) || !std::isfinite(rope_swa.freq_base)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "rope.freq_base_swa must be positive and finite");
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        target_layer & l = m.layers[il];
        l.swa  = sliding[il];
        l.rope = l.swa ? rope_swa : hp.rope;
    }
}

static void load_hparams(target_model & m, gemma3_model & g3, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    dspark_target_load_gemma_scales(m, f);
    // The query scale is 1/sqrt(head size), except in the 27B model (62 layers), which scales by
    // 1/sqrt(E / heads); the GGUF carries no key for it, so llama.cpp decides by the layer count too.
    const bool is_27b = hp.n_layer == 62;
    g3.kq_scale = 1.0f / sqrtf(is_27b ? (float) hp.n_embd / (float) hp.n_head : (float) hp.head_dim);
}

static void load_gemma3(target_model & m, dspark_weights & w) {
    const target_hparams & hp = m.hp;
    gemma3_model * g3 = new gemma3_model();
    m.arch_data.reset(g3);
    load_hparams(m, *g3, *w.file);
    dspark_target_uniform_layers(m, w);
    load_layer_kinds(m, *w.file);
    for (int il = 0; il < hp.n_layer; ++il) {
        auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
        dspark_target_load_attention(m, w, il, /*qkv_bias =*/ false, /*qk_norm =*/ true);
        dspark_target_load_ffn(m, w, il, hp.n_ff);
        g3->attn_post_norm.push_back(w.req(name("post_attention_norm.weight"), {hp.n_embd}));
        g3->ffn_post_norm.push_back(w.req(name("post_ffw_norm.weight"), {hp.n_embd}));
    }
}

static ggml_tensor * gemma3_layer_graph(const target_layer_io & c, int il, ggml_tensor * x) {
    const target_layer & l = c.layer(il);
    const gemma3_model & g3 = gemma3_of(c.m);
    ggml_context * ctx = c.g.ctx;
    const target_attn_opts attn_opts = {/*.kq_scale =*/ g3.kq_scale, /*.v_norm =*/ false};

    ggml_tensor * attn = dspark_target_attention(c, il, c.norm(x, l.attn_norm), attn_opts);
    ggml_tensor * a = ggml_add(ctx, x, c.norm(attn, g3.attn_post_norm[il]));
    ggml_tensor * f = c.g.ffn(c.norm(a, l.ffn_norm), l.ffn_gate, l.ffn_up, l.ffn_down, /*gelu =*/ true);
    return ggml_add(ctx, a, c.norm(f, g3.ffn_post_norm[il]));
}

extern const target_arch_info dspark_arch_gemma3 = {
    /*.arch         =*/ target_arch::GEMMA3,
    /*.name         =*/ "gemma3",
    /*.rope_mode    =*/ GGML_ROPE_TYPE_NEOX,
    /*.load         =*/ load_gemma3,
    /*.layer_inputs =*/ nullptr,
    /*.layer        =*/ gemma3_layer_graph,
};
