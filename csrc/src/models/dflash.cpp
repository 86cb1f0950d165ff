#include "models/dflash.h"

#include <cmath>

#include "dspark-impl.h"
#include "models/target.h"

std::string dspark_markov_head_name(markov_head h) {
    switch (h) {
        case markov_head::vanilla: return "vanilla";
        case markov_head::gated:   return "gated";
        case markov_head::rnn:     return "rnn";
        default:                   return "none";
    }
}

static void load_hparams(dflash_hparams & hp, const dspark_gguf & f) {
    const std::string a = "dflash";
    static_cast<dspark_backbone &>(hp) = dspark_backbone::from_gguf(f, a, GGML_ROPE_TYPE_NEOX);
    if (f.has_key(a + ".rope.dimension_sections")) {
        for (int64_t s : f.get_int_array(a + ".rope.dimension_sections")) {
            if (s != 0) {
                f.fail(DSPARK_STATUS_UNSUPPORTED, "M-RoPE drafts (rope.dimension_sections) are not supported");
            }
        }
    }
    hp.block_size = (int) f.get_int(a + ".block_size", 16);
    if (hp.block_size < 2 || hp.block_size > 64) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "dflash.block_size must be 2 .. 64");
    }
    if (!f.has_key(a + ".target_layers")) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "missing required key 'dflash.target_layers' (the target layers the draft reads)");
    }
    for (int64_t id : f.get_int_array(a + ".target_layers")) {
        hp.target_layers.push_back((int32_t) id);
    }
    if (hp.target_layers.empty()) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "'dflash.target_layers' is empty");
    }
    hp.mask_token_id = (int) f.get_int("tokenizer.ggml.mask_token_id", -1);
    if (hp.mask_token_id < 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "missing 'tokenizer.ggml.mask_token_id': the draft needs a MASK token to fill its blocks");
    }
    hp.causal             = f.get_bool(a + ".attention.causal", false);
    hp.attn_scale         = (float) f.get_float(a + ".attention.scale", 0.0);
    hp.value_scale        = (float) f.get_float(a + ".attention.value_scale", 0.0);
    hp.embedding_scale    = (float) f.get_float(a + ".embedding_scale", 0.0);
    const std::string act = f.get_str(a + ".hidden_activation", "silu");
    if (act == "gelu" || act == "gelu_pytorch_tanh") {
        hp.gelu = true;
    } else if (act != "silu") {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "hidden_activation '" + act + "' is not supported (silu, gelu, gelu_pytorch_tanh)");
    }
    hp.n_swa = (int) f.get_int(a + ".attention.sliding_window", 0);
    if (hp.n_swa > 0) {
        if (!f.has_key(a + ".attention.sliding_window_pattern")) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "a sliding window needs 'dflash.attention.sliding_window_pattern'");
        }
        hp.swa_layers = f.get_bool_array(a + ".attention.sliding_window_pattern");
        if ((int) hp.swa_layers.size() != hp.n_layer) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "sliding_window_pattern must have one entry per draft layer");
        }
    }
    hp.logit_softcap = (float) f.get_float(a + ".final_logit_softcapping", 0.0);
    if (!std::isfinite(hp.logit_softcap) || hp.logit_softcap < 0.0f) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "dflash.final_logit_softcapping must be finite and non-negative");
    }
}

static std::string layer_name(int il, const char * t) {
    return "blk." + std::to_string(il) + "." + t;
}

// Optional per-tensor scale "<name>.scale" of a "<name>.weight" matmul weight.
static ggml_tensor * scale_of(dspark_weights & w, const std::string & weight_name) {
    const std::string base = weight_name.substr(0, weight_name.size() - std::string(".weight").size());
    return w.opt(base + ".scale", {1});
}

static void load_layers(dflash_model & m, dspark_weights & w) {
    const dflash_hparams & hp = m.hp;
    const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
    const int64_t nq = D * hp.n_head, nk = D * hp.n_head_kv;
    m.layers.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; ++il) {
        dflash_layer & l = m.layers[il];
        l.attn_norm = w.req(layer_name(il, "attn_norm.weight"), {E});
        l.wq = w.req(layer_name(il, "attn_q.weight"), {E, nq});
        l.wk = w.req(layer_name(il, "attn_k.weight"), {E, nk});
        l.wv = w.opt(layer_name(il, "attn_v.weight"), {E, nk});
        l.wo = w.req(layer_name(il, "attn_output.weight"), {nq, E});
        l.wq_s = scale_of(w, layer_name(il, "attn_q.weight"));
        l.wk_s = scale_of(w, layer_name(il, "attn_k.weight"));
        l.wv_s = scale_of(w, layer_name(il, "attn_v.weight"));
        l.wo_s = scale_of(w, layer_name(il, "attn_output.weight"));
        l.q_norm = w.req(layer_name(il, "attn_q_norm.weight"), {D});
        l.k_norm = w.req(layer_name(il, "attn_k_norm.weight"), {D});
        l.post_attn_norm = w.opt(layer_name(il, "post_attention_norm.weight"), {E});
        l.post_ffw_norm  = w.opt(layer_name(il, "post_ffw_norm.weight"), {E});
        l.out_scale      = w.opt(layer_name(il, "layer_output_scale.weight"), {1});
        l.sinks          = w.opt(layer_name(il, "attn_sinks.weight"), {hp.n_head});
        l.ffn_norm = w.req(layer_name(il, "ffn_norm.weight"), {E});
        l.ffn_gate = w.req(layer_name(il, "ffn_gate.weight"), {E, F});
        l.ffn_up   = w.req(layer_name(il, "ffn_up.weight"), {E, F});
        l.ffn_down = w.req(layer_name(il, "ffn_down.weight"), {F, E});
    }
}

// Token embeddings and lm head: the draft's own, its own embedding tied as head, or the target's.
static void load_embeddings_and_head(dflash_model & m, dspark_weights & w, const target_model * target,
                                     const std::string & target_path) {
    dflash_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    ggml_tensor * own_embd = f.find_tensor("token_embd.weight");
    ggml_tensor * own_head = f.find_tensor("output.weight");
    ggml_tensor * d2t = f.find_tensor("d2t");

    hp.n_vocab = own_embd ? (int) own_embd->ne[1] : target ? target->hp.n_vocab : 0;
    if (!own_embd && !target) {
        f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "this draft has no token embeddings of its own: load it with its target model");
    }
    if (target && hp.n_vocab != target->hp.n_vocab) {
        f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "vocabulary mismatch: the draft's embeddings have " + std::to_string(hp.n_vocab) +
                                                   " rows, the target (" + target_path + ") has " + std::to_string(target->hp.n_vocab));
    }
    const int64_t E = hp.n_embd, V = hp.n_vocab;
    hp.n_vocab_draft = d2t ? (int) d2t->ne[0] : hp.n_vocab;
    const int64_t Vd = hp.n_vocab_draft;
    if (V < 1 || V > INT32_MAX || Vd < 1) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "the vocabulary (token_embd.weight rows, d2t length) must not be empty");
    }
    if (d2t) {
        if (d2t->type != GGML_TYPE_I64 || ggml_n_dims(d2t) != 1) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "tensor 'd2t' must be a 1-D I64 tensor of absolute target ids");
        }
        m.d2t = w.req("d2t", {Vd}, GGML_TYPE_I64);
        if (!own_head) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "a reduced-vocab draft (d2t) needs its own lm head 'output.weight' {E, Vd}; "
                                             "the target's head has the wrong rows");
        }
    }

    m.tok_embd = own_embd ? w.req("token_embd.weight", {E, V}) : target->tok_embd;
    if (own_head) {
        m.output = w.req("output.weight", {E, Vd});
        m.output_s = scale_of(w, "output.weight");
    } else if (own_embd) {
        m.output = m.tok_embd;  // tied
    } else {
        m.output = target->output;
    }
}

static void load_heads(dflash_model & m, dspark_weights & w) {
    dflash_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    const int64_t E = hp.n_embd, V = hp.n_vocab, Vd = hp.n_vocab_draft;
    ggml_tensor * w1 = f.find_tensor("markov_w1.weight");
    if (!w1) {
        if (f.has_key("dflash.markov_head_type")) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "'dflash.markov_head_type' is set but tensor 'markov_w1.weight' is missing");
        }
        return;  // DFlash: no Markov head
    }
    const int64_t R = w1->ne[0];
    if (R < 1 || R > (1 << 20)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "markov_w1.weight has rank " + std::to_string(R) + ": must be 1 .. 1048576");
    }
    hp.markov_rank = (int) R;
    m.markov_w1   = w.req("markov_w1.weight", {R, V});
    m.markov_w2   = w.req("markov_w2.weight", {R, Vd});
    m.markov_w2_s = scale_of(w, "markov_w2.weight");
    const std::string kind = f.get_str("dflash.markov_head_type", "vanilla");
    if (kind == "vanilla") {
        hp.markov = markov_head::vanilla;
    } else if (kind == "gated") {
        hp.markov = markov_head::gated;
        m.markov_gate   = w.req("markov_gate.weight", {E + R, R});
        m.markov_gate_b = w.req("markov_gate.bias", {R});
    } else if (kind == "rnn") {
        hp.markov = markov_head::rnn;
        m.markov_joint   = w.req("markov_joint.weight", {2 * R + E, 3 * R});
        m.markov_joint_b = w.req("markov_joint.bias", {3 * R});
    } else {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "markov_head_type '" + kind + "' is not supported (vanilla, gated, rnn)");
    }
    m.conf_w = w.opt("conf_proj.weight", {E + R, 1});
    m.conf_b = w.opt("conf_proj.bias", {1});
    hp.has_confidence = m.conf_w != nullptr;
    if (f.get_bool("dflash.has_confidence_head", hp.has_confidence) != hp.has_confidence) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "'dflash.has_confidence_head' disagrees with the presence of 'conf_proj.weight'");
    }

}

// DSpark's sequential temperature scaling of the confidence head (this project's key), one per
// predicting slot: read once the block layout, and so the number of predicting slots, is settled.
static void load_confidence_temperatures(dflash_hparams & hp, const dspark_gguf & f) {
    const char * temps_key = "dflash.confidence_temperatures";
    if (f.has_key(temps_key)) {
        if (!hp.has_confidence) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, std::string("'") + temps_key + "' is set but the draft has no confidence head");
        }
        for (double t : f.get_float_array(temps_key)) {
            if (!(t > 0.0 && std::isfinite(t))) {
                f.fail(DSPARK_STATUS_BAD_FORMAT, std::string("'") + temps_key + "' holds a temperature that is not positive");
            }
            hp.confidence_temperatures.push_back((float) t);
        }
        if ((int) hp.confidence_temperatures.size() != hp.max_draft()) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, std::string("'") + temps_key + "' has " +
                   std::to_string(hp.confidence_temperatures.size()) + " values for " + std::to_string(hp.max_draft()) +
                   " predicting slots");
        }
    }
}

void dflash_model::load(dspark_weights & w, const target_model * target, const std::string & target_path,
                        int sample_from_anchor, int layer_offset) {
    const dspark_gguf & f = *w.file;
    load_hparams(hp, f);
    for (int32_t & id : hp.target_layers) {
        id += layer_offset;
    }
    const int n_target_layers = target ? target->hp.n_layer : 0;
    if (target) {
        if (target->hp.n_embd != hp.n_embd) {
            f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "hidden size mismatch: the draft has n_embd " + std::to_string(hp.n_embd) +
                                                       ", the target (" + target_path + ") has " + std::to_string(target->hp.n_embd));
        }
        for (int32_t id : hp.target_layers) {
            if (id < 0 || id > n_target_layers) {
                f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "the draft reads target layer " + std::to_string(id) + " but the target (" +
                                                           target_path + ") has layers 0.." + std::to_string(n_target_layers));
            }
        }
    }
    load_embeddings_and_head(*this, w, target, target_path);
    if (hp.mask_token_id >= hp.n_vocab) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "mask_token_id " + std::to_string(hp.mask_token_id) + " is outside the vocabulary (" +
                                             std::to_string(hp.n_vocab) + ")");
    }
    const int64_t E = hp.n_embd, L = (int64_t) hp.target_layers.size();
    fc          = w.req("fc.weight", {L * E, E});
    fc_s        = scale_of(w, "fc.weight");
    enc_norm    = w.req("enc.output_norm.weight", {E});
    output_norm = w.req("output_norm.weight", {E});
    rope_freqs  = w.opt("rope_freqs.weight", {hp.rope.n_rot / 2});
    load_layers(*this, w);
    load_heads(*this, w);
    hp.sample_from_anchor = f.get_bool("dflash.sample_from_anchor", hp.markov != markov_head::none);
    if (sample_from_anchor >= 0) {
        hp.sample_from_anchor = sample_from_anchor != 0;
    }
    load_confidence_temperatures(hp, f);
}
