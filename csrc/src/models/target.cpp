#include "models/target.h"

#include "dspark-impl.h"

bool dspark_is_target_arch(const std::string & arch) {
    return arch == "qwen3" || arch == "qwen2" || arch == "llama";
}

static void load_hparams(target_hparams & hp, const dspark_gguf & f) {
    const std::string & a = hp.arch;
    hp.n_embd      = (int) f.get_int(a + ".embedding_length");
    hp.n_layer     = (int) f.get_int(a + ".block_count");
    hp.n_ctx_train = (int) f.get_int(a + ".context_length");
    hp.n_ff        = (int) f.get_int(a + ".feed_forward_length");
    hp.n_head      = (int) f.get_int(a + ".attention.head_count");
    hp.n_head_kv   = (int) f.get_int(a + ".attention.head_count_kv", hp.n_head);
    hp.rms_eps     = (float) f.get_float(a + ".attention.layer_norm_rms_epsilon");
    if (hp.n_embd <= 0 || hp.n_layer <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_ff <= 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "embedding_length, block_count, feed_forward_length and head counts must be positive");
    }
    if (hp.n_head % hp.n_head_kv != 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "head_count must be a multiple of head_count_kv");
    }
    hp.head_dim_k = (int) f.get_int(a + ".attention.key_length", hp.n_embd / hp.n_head);
    hp.head_dim_v = (int) f.get_int(a + ".attention.value_length", hp.n_embd / hp.n_head);
    if (hp.head_dim_k != hp.head_dim_v) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "key_length != value_length is not supported");
    }
    const int mode = a == "llama" ? 0 : GGML_ROPE_TYPE_NEOX;
    hp.rope = dspark_rope::from_gguf(f, a, mode, hp.head_dim_k, hp.n_ctx_train);
    if (hp.rope.n_rot > hp.head_dim_k || hp.rope.n_rot % 2 != 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "rope.dimension_count must be even and at most key_length");
    }
    hp.qk_norm = a == "qwen3";
}

void target_model::load(dspark_weights & w) {
    const dspark_gguf & f = *w.file;
    hp.arch = f.get_str("general.architecture");
    load_hparams(hp, f);

    ggml_tensor * emb = f.find_tensor("token_embd.weight");
    if (!emb) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "missing required tensor 'token_embd.weight'");
    }
    hp.n_vocab = (int) emb->ne[1];
    const int64_t E = hp.n_embd, V = hp.n_vocab, F = hp.n_ff;
    const int64_t nq = (int64_t) hp.head_dim_k * hp.n_head, nk = hp.n_embd_k_gqa(), nv = hp.n_embd_v_gqa();

    tok_embd    = w.req("token_embd.weight", {E, V});
    output_norm = w.req("output_norm.weight", {E});
    output      = w.opt("output.weight", {E, V});
    if (!output) {
        output = tok_embd;  // tied embeddings
    }
    rope_freqs = w.opt("rope_freqs.weight", {hp.rope.n_rot / 2});

    const bool bias = hp.arch == "qwen2";
    layers.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; ++il) {
        target_layer & l = layers[il];
        auto name = [il](const char * t) { return "blk." + std::to_string(il) + "." + t; };
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
            l.q_norm = w.req(name("attn_q_norm.weight"), {hp.head_dim_k});
            l.k_norm = w.req(name("attn_k_norm.weight"), {hp.head_dim_k});
        }
        l.ffn_norm = w.req(name("ffn_norm.weight"), {E});
        l.ffn_gate = w.req(name("ffn_gate.weight"), {E, F});
        l.ffn_up   = w.req(name("ffn_up.weight"), {E, F});
        l.ffn_down = w.req(name("ffn_down.weight"), {F, E});
    }
}
