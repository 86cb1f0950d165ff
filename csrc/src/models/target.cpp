#include "models/target.h"

#include "dspark-impl.h"

#include <cmath>

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

std::string dspark_target_tensor_name(int il, const char * t) {
    return "blk." + std::to_string(il) + "." + t;
}

void dspark_target_uniform_layers(target_model & m, dspark_weights & w) {
    const target_hparams & hp = m.hp;
    for (int il = 0; il < hp.n_layer; ++il) {
        if (hp.n_head_kv_l[il] != hp.n_head_kv || hp.n_ff_l[il] != hp.n_ff) {
            w.file->fail(DSPARK_STATUS_UNSUPPORTED, "per-layer head_count_kv / feed_forward_length arrays are not supported for " +
                                                        std::string(m.arch->name));
        }
    }
    m.rope_freqs = w.opt("rope_freqs.weight", {hp.rope.n_rot / 2});
    for (int il = 0; il < hp.n_layer; ++il) {
        target_layer & l = m.layers[il];
        l.head_dim   = hp.head_dim;
        l.n_head_kv  = hp.n_head_kv;
        l.kv_src     = il;
        l.rope       = hp.rope;
        l.rope_freqs = m.rope_freqs;
    }
}

void dspark_target_load_attention(target_model & m, dspark_weights & w, int il, bool qkv_bias, bool qk_norm) {
    const target_hparams & hp = m.hp;
    target_layer & l = m.layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    const int64_t E = hp.n_embd, D = l.head_dim;
    const int64_t nq = D * hp.n_head, nk = D * l.n_head_kv, nv = nk;
    l.attn_norm = w.req(name("attn_norm.weight"), {E});
    l.wq = w.req(name("attn_q.weight"), {E, nq});
    l.wk = w.req(name("attn_k.weight"), {E, nk});
    l.wv = w.req(name("attn_v.weight"), {E, nv});
    l.wo = w.req(name("attn_output.weight"), {nq, E});
    if (qkv_bias) {
        l.bq = w.req(name("attn_q.bias"), {nq});
        l.bk = w.req(name("attn_k.bias"), {nk});
        l.bv = w.req(name("attn_v.bias"), {nv});
    }
    l.bo = w.opt(name("attn_output.bias"), {E});
    if (qk_norm) {
        l.q_norm = w.req(name("attn_q_norm.weight"), {D});
        l.k_norm = w.req(name("attn_k_norm.weight"), {D});
    }
}

void dspark_target_load_ffn(target_model & m, dspark_weights & w, int il, int64_t F) {
    target_layer & l = m.layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    const int64_t E = m.hp.n_embd;
    l.ffn_norm = w.req(name("ffn_norm.weight"), {E});
    l.ffn_gate = w.req(name("ffn_gate.weight"), {E, F});
    l.ffn_up   = w.req(name("ffn_up.weight"), {E, F});
    l.ffn_down = w.req(name("ffn_down.weight"), {F, E});
}

void dspark_target_load_expert_counts(target_model & m, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    const std::string a = m.arch->name;
    hp.n_expert      = (int) f.get_int(a + ".expert_count");
    hp.n_expert_used = (int) f.get_int(a + ".expert_used_count");
    if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_count (" + std::to_string(hp.n_expert) + ") and expert_used_count (" +
               std::to_string(hp.n_expert_used) + ") must satisfy 1 <= expert_used_count <= expert_count");
    }
}

void dspark_target_load_experts(target_model & m, dspark_weights & w, int il, bool fused_gate_up) {
    const target_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    target_layer & l = m.layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    const int64_t E = hp.n_embd, X = hp.n_expert;
    l.ffn_gate_inp = w.req(name("ffn_gate_inp.weight"), {E, X});
    // the experts' width comes from the tensor; the key (when present) must agree
    ggml_tensor * down = f.find_tensor(name("ffn_down_exps.weight"));
    const int64_t F = down ? down->ne[0] : 0;
    const std::string key = std::string(m.arch->name) + ".expert_feed_forward_length";
    if (f.has_key(key)) {
        const std::vector<int> ff = f.get_int_per_layer(key, hp.n_layer);
        if (down && ff[il] != F) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_feed_forward_length (" + std::to_string(ff[il]) + ") does not match " +
                   name("ffn_down_exps.weight") + " (" + std::to_string(F) + ")");
        }
    }
    l.ffn_down_exps = w.req(name("ffn_down_exps.weight"), {F, E, X});
    l.ffn_gate_up_exps = fused_gate_up ? w.opt(name("ffn_gate_up_exps.weight"), {E, 2 * F, X}) : nullptr;
    if (!l.ffn_gate_up_exps) {
        l.ffn_gate_exps = w.req(name("ffn_gate_exps.weight"), {E, F, X});
        l.ffn_up_exps   = w.req(name("ffn_up_exps.weight"), {E, F, X});
    }
}

void dspark_target_load_shared_expert(target_model & m, dspark_weights & w, int il) {
    target_layer & l = m.layers[il];
    auto name = [il](const char * t) { return dspark_target_tensor_name(il, t); };
    ggml_tensor * sh = w.file->find_tensor(name("ffn_down_shexp.weight"));
    if (!sh) {
        return;
    }
    const int64_t E = m.hp.n_embd, Fs = sh->ne[0];
    l.ffn_gate_shexp = w.req(name("ffn_gate_shexp.weight"), {E, Fs});
    l.ffn_up_shexp   = w.req(name("ffn_up_shexp.weight"), {E, Fs});
    l.ffn_down_shexp = w.req(name("ffn_down_shexp.weight"), {Fs, E});
    l.ffn_gate_inp_shexp = w.opt(name("ffn_gate_inp_shexp.weight"), {E});
}

void dspark_target_load_gemma_scales(target_model & m, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    hp.embd_scale = sqrtf((float) hp.n_embd);
    hp.logit_softcap = (float) f.get_float(std::string(m.arch->name) + ".final_logit_softcapping", 0.0);
    if (!std::isfinite(hp.logit_softcap) || hp.logit_softcap < 0.0f) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "final_logit_softcapping must be finite and non-negative");
    }
}

void target_model::load(dspark_weights & w) {
    const dspark_gguf & f = *w.file;
    const std::string name = f.get_str("general.architecture");
    arch = dspark_target_arch_find(name);
    if (!arch) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "architecture '" + name + "' is not a supported target");
    }
    static_cast<dspark_backbone &>(hp) = dspark_backbone::from_gguf(f, name, arch->rope_mode);

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
    arch->load(*this, w);
}
