#include "models/target.h"

#include "dspark-impl.h"

bool dspark_is_target_arch(const std::string & arch) {
    return arch == "qwen3" || arch == "qwen2" || arch == "llama";
}

static void load_hparams(target_hparams & hp, const dspark_gguf & f) {
    static_cast<dspark_backbone &>(hp) = dspark_backbone::from_gguf(f, hp.arch, hp.arch == "llama" ? 0 : GGML_ROPE_TYPE_NEOX);
    hp.qk_norm = hp.arch == "qwen3";
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
    const int64_t nq = (int64_t) hp.head_dim * hp.n_head, nk = hp.n_embd_kv(), nv = hp.n_embd_kv();

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
            l.q_norm = w.req(name("attn_q_norm.weight"), {hp.head_dim});
            l.k_norm = w.req(name("attn_k_norm.weight"), {hp.head_dim});
        }
        l.ffn_norm = w.req(name("ffn_norm.weight"), {E});
        l.ffn_gate = w.req(name("ffn_gate.weight"), {E, F});
        l.ffn_up   = w.req(name("ffn_up.weight"), {E, F});
        l.ffn_down = w.req(name("ffn_down.weight"), {F, E});
    }
}
