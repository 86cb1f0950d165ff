#include "models/target.h"

#include "dspark-impl.h"

#include <cmath>

bool dspark_is_target_arch(const std::string & arch) {
    return arch == "qwen3" || arch == "qwen2" || arch == "llama" || arch == "qwen3moe" || arch == "gemma4";
}

bool target_model::has_swa() const {
    for (const target_layer & l : layers) {
        if (l.swa) {
            return true;
        }
    }
    return false;
}

std::vector<int64_t> target_model::kv_widths() const {
    std::vector<int64_t> w;
    for (const target_layer & l : layers) {
        w.push_back(l.has_kv() ? (int64_t) l.head_dim * l.n_head_kv : 0);
    }
    return w;
}

static std::string layer_name(int il, const char * t) {
    return "blk." + std::to_string(il) + "." + t;
}

void dspark_load_experts(target_model & m, dspark_weights & w, int il, bool gemma) {
    const target_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    target_layer & l = m.layers[il];
    const int64_t E = hp.n_embd, X = hp.n_expert;
    l.ffn_gate_inp = w.req(layer_name(il, "ffn_gate_inp.weight"), {E, X});
    // the experts' width comes from the tensor; the key (when present) must agree
    ggml_tensor * down = f.find_tensor(layer_name(il, "ffn_down_exps.weight"));
    const int64_t F = down ? down->ne[0] : 0;
    const std::string a = hp.arch;
    if (f.has_key(a + ".expert_feed_forward_length")) {
        const std::vector<int> ff = f.get_int_per_layer(a + ".expert_feed_forward_length", hp.n_layer);
        if (down && ff[il] != F) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_feed_forward_length (" + std::to_string(ff[il]) + ") does not match " +
                   layer_name(il, "ffn_down_exps.weight") + " (" + std::to_string(F) + ")");
        }
    }
    l.ffn_down_exps = w.req(layer_name(il, "ffn_down_exps.weight"), {F, E, X});
    l.ffn_gate_up_exps = gemma ? w.opt(layer_name(il, "ffn_gate_up_exps.weight"), {E, 2 * F, X}) : nullptr;
    if (!l.ffn_gate_up_exps) {
        l.ffn_gate_exps = w.req(layer_name(il, "ffn_gate_exps.weight"), {E, F, X});
        l.ffn_up_exps   = w.req(layer_name(il, "ffn_up_exps.weight"), {E, F, X});
    }
    if (gemma) {
        l.ffn_gate_inp_s  = w.req(layer_name(il, "ffn_gate_inp.scale"), {E});
        l.ffn_down_exps_s = w.opt(layer_name(il, "ffn_down_exps.scale"), {X});
        l.ffn_pre_norm_2  = w.req(layer_name(il, "pre_ffw_norm_2.weight"), {E});
        l.ffn_post_norm_1 = w.req(layer_name(il, "post_ffw_norm_1.weight"), {E});
        l.ffn_post_norm_2 = w.req(layer_name(il, "post_ffw_norm_2.weight"), {E});
        return;
    }
    // shared expert: its width comes from the tensor too
    ggml_tensor * sh = f.find_tensor(layer_name(il, "ffn_down_shexp.weight"));
    if (sh) {
        const int64_t Fs = sh->ne[0];
        l.ffn_gate_shexp = w.req(layer_name(il, "ffn_gate_shexp.weight"), {E, Fs});
        l.ffn_up_shexp   = w.req(layer_name(il, "ffn_up_shexp.weight"), {E, Fs});
        l.ffn_down_shexp = w.req(layer_name(il, "ffn_down_shexp.weight"), {Fs, E});
        l.ffn_gate_inp_shexp = w.opt(layer_name(il, "ffn_gate_inp_shexp.weight"), {E});
    }
}

// Router keys of a mixture-of-experts model: counts that must fit the tensors, checked here.
static void load_expert_hparams(target_hparams & hp, const dspark_gguf & f) {
    const std::string & a = hp.arch;
    hp.n_expert      = (int) f.get_int(a + ".expert_count");
    hp.n_expert_used = (int) f.get_int(a + ".expert_used_count");
    if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_count (" + std::to_string(hp.n_expert) + ") and expert_used_count (" +
               std::to_string(hp.n_expert_used) + ") must satisfy 1 <= expert_used_count <= expert_count");
    }
    hp.expert_weights_norm  = f.get_bool(a + ".expert_weights_norm", true);
    hp.expert_weights_scale = (float) f.get_float(a + ".expert_weights_scale", 1.0);
    if (!(hp.expert_weights_scale > 0.0f) || !std::isfinite(hp.expert_weights_scale)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_weights_scale must be positive and finite");
    }
}

// qwen3 / qwen2 / llama / qwen3moe: every layer alike.
static void load_llama_family(target_model & m, dspark_weights & w) {
    target_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    const bool moe = hp.arch == "qwen3moe";
    hp.qk_norm = hp.arch == "qwen3" || moe;
    if (moe) {
        load_expert_hparams(hp, f);
    }
    const int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
    const int64_t nq = D * hp.n_head, nk = hp.n_embd_kv(), nv = hp.n_embd_kv();
    for (int il = 0; il < hp.n_layer; ++il) {
        if (hp.n_head_kv_l[il] != hp.n_head_kv || hp.n_ff_l[il] != hp.n_ff) {
            f.fail(DSPARK_STATUS_UNSUPPORTED, "per-layer head_count_kv / feed_forward_length arrays are not supported for " + hp.arch);
        }
    }
    m.rope_freqs = w.opt("rope_freqs.weight", {hp.rope.n_rot / 2});

    const bool bias = hp.arch == "qwen2";
    for (int il = 0; il < hp.n_layer; ++il) {
        target_layer & l = m.layers[il];
        auto name = [il](const char * t) { return layer_name(il, t); };
        l.head_dim = hp.head_dim;
        l.n_head_kv = hp.n_head_kv;
        l.kv_src = il;
        l.rope = hp.rope;
        l.rope_freqs = m.rope_freqs;
        l.attn_norm = w.req(name("attn_norm.weight"), {E});
        l.wq = w.req(name("attn_q.weight"), {E, nq});
        l.wk = w.req(name("attn_k.weight"), {E, nk});
        l.wv = w.req(name("attn_v.weight"), {E, nv});
        l.wo = w.req(name("attn_output.weight"), {nq, E});
        if (bias) {
            l.bq = w.req(name("attn_q.bias"), {nq});
            l.bk = w.req(name("attn_k.bias"), {nk});
            l.bv = w.req(name("attn_v.bias"), {nv});
        }
        l.bo = w.opt(name("attn_output.bias"), {E});
        if (hp.qk_norm) {
            l.q_norm = w.req(name("attn_q_norm.weight"), {D});
            l.k_norm = w.req(name("attn_k_norm.weight"), {D});
        }
        l.ffn_norm = w.req(name("ffn_norm.weight"), {E});
        if (moe) {
            dspark_load_experts(m, w, il, false);
            continue;
        }
        l.ffn_gate = w.req(name("ffn_gate.weight"), {E, F});
        l.ffn_up   = w.req(name("ffn_up.weight"), {E, F});
        l.ffn_down = w.req(name("ffn_down.weight"), {F, E});
    }
}

void target_model::load(dspark_weights & w) {
    const dspark_gguf & f = *w.file;
    hp.arch = f.get_str("general.architecture");
    if (!dspark_is_target_arch(hp.arch)) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "architecture '" + hp.arch + "' is not a supported target");
    }
    static_cast<dspark_backbone &>(hp) = dspark_backbone::from_gguf(f, hp.arch, hp.arch == "llama" ? 0 : GGML_ROPE_TYPE_NEOX);

    ggml_tensor * emb = f.find_tensor("token_embd.weight");
    if (!emb) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "missing required tensor 'token_embd.weight'");
    }
    hp.n_vocab = (int) emb->ne[1];
    const int64_t E = hp.n_embd, V = hp.n_vocab;
    tok_embd    = w.req("token_embd.weight", {E, V});
    output_norm = w.req("output_norm.weight", {E});
    output      = w.opt("output.weight", {E, V});
    if (!output) {
        output = tok_embd;  // tied embeddings
    }

    layers.assign(hp.n_layer, target_layer());
    if (hp.arch == "gemma4") {
        dspark_load_gemma4(*this, w);
    } else {
        load_llama_family(*this, w);
    }
}
