// Gemma-4 text models (GGUF arch "gemma4", keys and tensors as llama.cpp's converter writes them).
//
// Layers come in two kinds, by the bool array attention.sliding_window_pattern: sliding layers
// (window attention.sliding_window, head size key_length_swa, rope base rope.freq_base_swa over
// rope.dimension_count_swa dims) and global layers (head size key_length, rope base rope.freq_base,
// "proportional" rope through rope_freqs). The last attention.shared_kv_layers layers have no K/V
// of their own: each reads the cache of the last earlier layer of its kind that has one.
#include "models/target.h"

#include "dspark-impl.h"

#include <cmath>

static std::string layer_name(int il, const char * t) {
    return "blk." + std::to_string(il) + "." + t;
}

static void load_layer_geometry(target_model & m, const dspark_gguf & f) {
    target_hparams & hp = m.hp;
    const std::string a = "gemma4";
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

    const int64_t n_shared = f.get_int(a + ".attention.shared_kv_layers", 0);
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

static void load_layer_tensors(target_model & m, dspark_weights & w, int il, const dspark_gguf & f) {
    const target_hparams & hp = m.hp;
    target_layer & l = m.layers[il];
    auto name = [il](const char * t) { return layer_name(il, t); };
    const int64_t E = hp.n_embd, D = l.head_dim, F = hp.n_ff_l[il];
    const int64_t nq = D * hp.n_head, nk = D * l.n_head_kv;
    const bool own_kv = l.kv_src == il;

    l.attn_norm = w.req(name("attn_norm.weight"), {E});
    l.wq = w.req(name("attn_q.weight"), {E, nq});
    l.q_norm = w.req(name("attn_q_norm.weight"), {D});
    if (own_kv) {
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
    l.attn_post_norm = w.req(name("post_attention_norm.weight"), {E});
    l.out_scale = w.opt(name("layer_output_scale.weight"), {1});
    if (!l.swa) {
        l.rope_freqs = m.rope_freqs;
    }

    l.ffn_norm = w.req(name("ffn_norm.weight"), {E});
    l.ffn_gate = w.req(name("ffn_gate.weight"), {E, F});
    l.ffn_up   = w.req(name("ffn_up.weight"), {E, F});
    l.ffn_down = w.req(name("ffn_down.weight"), {F, E});
    l.ffn_post_norm = w.req(name("post_ffw_norm.weight"), {E});
    if (f.find_tensor(name("ffn_gate_inp.weight"))) {
        if (hp.n_expert == 0) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, name("ffn_gate_inp.weight") + " exists but gemma4.expert_count is missing");
        }
        dspark_load_experts(m, w, il, true);
    }

    if (hp.n_embd_per_layer > 0) {
        const int64_t P = hp.n_embd_per_layer;
        l.per_layer_inp_gate  = w.req(name("inp_gate.weight"), {E, P});
        l.per_layer_proj      = w.req(name("proj.weight"), {P, E});
        l.per_layer_post_norm = w.req(name("post_norm.weight"), {E});
    }
}

void dspark_load_gemma4(target_model & m, dspark_weights & w) {
    target_hparams & hp = m.hp;
    const dspark_gguf & f = *w.file;
    const std::string a = "gemma4";
    hp.gemma = true;
    hp.qk_norm = true;
    hp.embd_scale = sqrtf((float) hp.n_embd);
    hp.logit_softcap = (float) f.get_float(a + ".final_logit_softcapping", 0.0);
    if (!std::isfinite(hp.logit_softcap) || hp.logit_softcap < 0.0f) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "final_logit_softcapping must be finite and non-negative");
    }
    hp.n_embd_per_layer = (int) f.get_int(a + ".embedding_length_per_layer_input", 0);
    if (hp.n_embd_per_layer < 0 || hp.n_embd_per_layer > (1 << 16)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "embedding_length_per_layer_input is out of range");
    }
    if (f.has_key(a + ".expert_count")) {
        hp.n_expert      = (int) f.get_int(a + ".expert_count");
        hp.n_expert_used = (int) f.get_int(a + ".expert_used_count");
        if (hp.n_expert < 1 || hp.n_expert > 4096 || hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "expert_count and expert_used_count must satisfy 1 <= expert_used_count <= expert_count");
        }
    }
    load_layer_geometry(m, f);

    // proportional rope of the global layers: one factor per rotated pair
    m.rope_freqs = w.opt("rope_freqs.weight", {hp.rope.n_rot / 2});
    if (hp.n_embd_per_layer > 0) {
        const int64_t P = hp.n_embd_per_layer, L = hp.n_layer;
        m.per_layer_tok_embd   = w.req("per_layer_token_embd.weight", {P * L, hp.n_vocab});
        m.per_layer_model_proj = w.req("per_layer_model_proj.weight", {hp.n_embd, P * L});
        m.per_layer_proj_norm  = w.req("per_layer_proj_norm.weight", {P});
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        load_layer_tensors(m, w, il, f);
    }
}
