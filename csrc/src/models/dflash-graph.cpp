#include "models/dflash-graph.h"

#include <algorithm>
#include <cmath>

// ---- injection --------------------------------------------------------------------------------

// Raw K [D, Hkv, T] (before k_norm and rope) and V of rows h [E, T] in layer il.
static void project_kv(const dspark_graph & g, const dflash_model & m, int il, ggml_tensor * h,
                       ggml_tensor ** k_raw, ggml_tensor ** v) {
    const dflash_hparams & hp = m.hp;
    const dflash_layer & l = m.layers[il];
    const int64_t T = h->ne[1];
    *k_raw = ggml_reshape_3d(g.ctx, g.mm(l.wk, h, l.wk_s), hp.head_dim, hp.n_head_kv, T);
    if (l.wv) {
        *v = ggml_reshape_3d(g.ctx, g.mm(l.wv, h, l.wv_s), hp.head_dim, hp.n_head_kv, T);
    } else {
        *v = g.rms_norm(*k_raw, nullptr, hp.rms_eps);  // shared K/V: V is the normalised raw K
    }
}

dflash_inject_graph build_dflash_inject(const dspark_graph & g, const dflash_model & m, const dspark_kv_cache & kv,
                                        int n_rows) {
    const dflash_hparams & hp = m.hp;
    dflash_inject_graph io;
    io.feat   = dspark_graph_input(g.ctx, GGML_TYPE_F32, hp.feature_width(), n_rows, "inp_feat");
    io.pos    = dspark_graph_input(g.ctx, GGML_TYPE_I32, n_rows, 0, "inp_feat_pos");
    io.kv_idx = dspark_graph_input(g.ctx, GGML_TYPE_I64, n_rows, 0, "inp_feat_kv_idx");

    ggml_tensor * ctx_h = g.rms_norm(g.mm(m.fc, io.feat, m.fc_s), m.enc_norm, hp.rms_eps);  // [E, T]
    for (int il = 0; il < hp.n_layer; ++il) {
        ggml_tensor * k, * v;
        project_kv(g, m, il, ctx_h, &k, &v);
        k = g.rms_norm(k, m.layers[il].k_norm, hp.rms_eps);
        k = g.rope(k, io.pos, hp.rope, m.rope_freqs);
        g.store_kv(kv, il, k, v, io.kv_idx);
    }
    return io;
}

// ---- block decoder ----------------------------------------------------------------------------

static ggml_tensor * block_layer(const dspark_graph & g, const dflash_model & m, const dspark_kv_cache & kv, int il,
                                 ggml_tensor * x, const dflash_block_graph & io, int n_kv, bool flash) {
    const dflash_hparams & hp = m.hp;
    const dflash_layer & l = m.layers[il];
    ggml_context * ctx = g.ctx;
    const int64_t T = x->ne[1];

    ggml_tensor * h = g.rms_norm(x, l.attn_norm, hp.rms_eps);
    ggml_tensor * q = ggml_reshape_3d(ctx, g.mm(l.wq, h, l.wq_s), hp.head_dim, hp.n_head, T);
    ggml_tensor * k, * v;
    project_kv(g, m, il, h, &k, &v);
    q = g.rope(g.rms_norm(q, l.q_norm, hp.rms_eps), io.pos, hp.rope, m.rope_freqs);
    k = g.rope(g.rms_norm(k, l.k_norm, hp.rms_eps), io.pos, hp.rope, m.rope_freqs);
    g.store_kv(kv, il, k, v, io.kv_idx);  // the block attends to itself through the cache

    const float scale = hp.attn_scale != 0.0f ? hp.attn_scale : 1.0f / sqrtf((float) hp.head_dim);
    ggml_tensor * mask = hp.is_swa(il) ? io.mask_swa : io.mask;
    ggml_tensor * a = g.attention(kv, il, q, mask, n_kv, hp.head_dim, hp.n_head_kv, scale, flash, l.sinks);
    a = g.mm(l.wo, a, l.wo_s);
    if (hp.value_scale != 0.0f) {
        a = ggml_scale(ctx, a, hp.value_scale);
    }
    if (l.post_attn_norm) {
        a = g.rms_norm(a, l.post_attn_norm, hp.rms_eps);
    }
    x = ggml_add(ctx, x, a);

    ggml_tensor * y = g.ffn(g.rms_norm(x, l.ffn_norm, hp.rms_eps), l.ffn_gate, l.ffn_up, l.ffn_down, hp.gelu);
    if (l.post_ffw_norm) {
        y = g.rms_norm(y, l.post_ffw_norm, hp.rms_eps);
    }
    x = ggml_add(ctx, x, y);
    return l.out_scale ? ggml_mul(ctx, x, l.out_scale) : x;
}

// Column j of every block: a strided [ne0, n_blocks] view of a block-major [ne0, P·n_blocks] tensor.
static ggml_tensor * slot_view(ggml_context * ctx, ggml_tensor * t, int j, int P, int n_blocks) {
    return ggml_view_2d(ctx, t, t->ne[0], n_blocks, t->nb[1] * P, t->nb[1] * j);
}

// Draft-vocab ids [n] -> target ids [n] through d2t (identity without d2t).
static ggml_tensor * to_target_ids(ggml_context * ctx, ggml_tensor * ids, ggml_tensor * d2t_i32) {
    if (!d2t_i32) {
        return ids;
    }
    ggml_tensor * t = ggml_get_rows(ctx, d2t_i32, ids);  // [1, n]
    return ggml_reshape_1d(ctx, t, t->ne[1]);
}

// The token each column of logits [Vd, n] proposes: the argmax, or the sequence's sampler chain
// (dspark-sampler.h) with the columns' inputs [DSPARK_SAMPLER_N_INPUTS, n] when sampling. Sampling
// also gives each pick's probability (the q of rejection sampling) and, for want_logits, the
// logits as the chain's filters left them (what q is read from on a rejection).
static ggml_tensor * pick_tokens(dflash_block_graph & io, const dflash_pick & pick, ggml_context * ctx, ggml_tensor * logits,
                                 ggml_tensor * inputs, bool want_logits, ggml_tensor ** picked_from) {
    *picked_from = logits;
    if (!io.sampler) {
        return ggml_argmax(ctx, logits);
    }
    dspark_sampler_graph s = dspark_build_sampler(ctx, logits, pick.sampler, inputs, want_logits);
    ggml_set_output(s.prob);
    io.prob_out.push_back(s.prob);
    if (want_logits) {
        *picked_from = s.logits;
    }
    return s.tokens;
}

// What W2 multiplies for one slot, from e = W1[prev] [R, n_blocks], the slot's final hidden state
// h [E, n_blocks] and the RNN state s [R, n_blocks] (updated in place for the rnn head):
//   vanilla: e;  gated: σ(Wg [h; e] + bg) ⊙ e;
//   rnn: [g, c, o] = Wj [s; e; h] + bj, s' = σ(g) s + σ(-g) tanh(c), tanh(o).
static ggml_tensor * markov_input(const dspark_graph & g, const dflash_model & m, ggml_tensor * e, ggml_tensor * h,
                                  ggml_tensor ** s) {
    ggml_context * ctx = g.ctx;
    const int64_t R = m.hp.markov_rank;
    if (m.hp.markov == markov_head::gated) {
        ggml_tensor * gate = ggml_sigmoid(ctx, ggml_add(ctx, g.mm(m.markov_gate, ggml_concat(ctx, h, e, 0)), m.markov_gate_b));
        return ggml_mul(ctx, gate, e);
    }
    if (m.hp.markov == markov_head::rnn) {
        ggml_tensor * z = ggml_add(ctx, g.mm(m.markov_joint, ggml_concat(ctx, ggml_concat(ctx, *s, e, 0), h, 0)),
                                   m.markov_joint_b);
        auto part = [&](int k) { return ggml_cont(ctx, ggml_view_2d(ctx, z, R, z->ne[1], z->nb[1], k * R * ggml_element_size(z))); };
        ggml_tensor * gt = part(0), * ct = part(1), * ot = part(2);
        *s = ggml_add(ctx, ggml_mul(ctx, ggml_sigmoid(ctx, gt), *s),
                      ggml_mul(ctx, ggml_sigmoid(ctx, ggml_neg(ctx, gt)), ggml_tanh(ctx, ct)));
        return ggml_tanh(ctx, ot);
    }
    return e;
}

// The chain's start: each block's anchor (token 0), a strided view of the token input gathered to
// [n_blocks].
static ggml_tensor * chain_anchors(ggml_context * ctx, const dflash_block_graph & io, int n_blocks, int block_len) {
    ggml_tensor * prev = ggml_view_2d(ctx, io.tokens, 1, n_blocks, sizeof(int32_t) * block_len, 0);
    return ggml_reshape_1d(ctx, ggml_cont(ctx, prev), n_blocks);
}

// The RNN state at the first predicting slot: zeros shaped like e = W1[anchor] [R, n_blocks], as
// e · 0 (W1's rows are finite), rather than a fill of an unallocated tensor, a pattern that
// corrupted memory on Vulkan (see dflash_vocab_maps).
static ggml_tensor * chain_state(ggml_context * ctx, const dflash_model & m, ggml_tensor * e) {
    return m.hp.markov == markov_head::rnn ? ggml_scale(ctx, e, 0.0f) : nullptr;
}

// confidence of slot j = σ((w · [h; e] + b) / T_j), [1, n_blocks] (T_j: the calibrated temperature)
static ggml_tensor * confidence(const dspark_graph & g, const dflash_model & m, ggml_tensor * h, ggml_tensor * e, int j) {
    ggml_tensor * logit = g.add(g.mm(m.conf_w, ggml_concat(g.ctx, h, e, 0)), m.conf_b);
    if (!m.hp.confidence_temperatures.empty()) {
        logit = ggml_scale(g.ctx, logit, 1.0f / m.hp.confidence_temperatures[j]);
    }
    ggml_tensor * c = ggml_sigmoid(g.ctx, logit);
    ggml_set_output(c);
    return c;
}

// Slot j's candidates restricted to its top-k base candidates cj (I32 [K, n_blocks], draft ids):
// the bias W2·r for those k rows of W2 only (a batched [R, k] x [R, 1] product per block).
static ggml_tensor * top_k_biased(const dspark_graph & g, const dflash_model & m, ggml_tensor * cand_logits,
                                  ggml_tensor * cj, ggml_tensor * r, int j, int P, int n_blocks) {
    ggml_context * ctx = g.ctx;
    const int64_t R = m.hp.markov_rank, K = cj->ne[0];
    ggml_tensor * rows = ggml_get_rows(ctx, m.markov_w2, ggml_reshape_1d(ctx, cj, K * n_blocks));
    rows = ggml_reshape_3d(ctx, rows, R, K, n_blocks);                                       // [R, K, n_blocks]
    ggml_tensor * bias = ggml_reshape_2d(ctx, ggml_mul_mat(ctx, rows, ggml_reshape_3d(ctx, r, R, 1, n_blocks)), K, n_blocks);
    if (m.markov_w2_s) {
        bias = ggml_mul(ctx, bias, m.markov_w2_s);
    }
    return ggml_add(ctx, ggml_cont(ctx, slot_view(ctx, cand_logits, j, P, n_blocks)), bias);  // [K, n_blocks]
}

// The P slot tensors [V, n_blocks] as one block-major [V, P·n_blocks]. Built from copies, never by
// writing into the base logits in place: those may be computed by another backend (a head on the
// target's device), and an in-place op on a tensor of another backend's split writes through a
// pointer that is not its own buffer (a segfault on Vulkan).
static ggml_tensor * stack_slots(ggml_context * ctx, const std::vector<ggml_tensor *> & slots, int n_blocks) {
    ggml_tensor * all = slots[0];
    for (size_t j = 1; j < slots.size(); ++j) {
        all = ggml_concat(ctx, all, slots[j], 1);                                    // [V, n_blocks·(j+1)], slot-major
    }
    const int64_t V = all->ne[0], P = (int64_t) slots.size();
    ggml_tensor * t = ggml_reshape_3d(ctx, all, V, n_blocks, P);
    t = ggml_cont(ctx, ggml_permute(ctx, t, 0, 2, 1, 3));                             // [V, P, n_blocks]
    return ggml_reshape_2d(ctx, t, V, P * n_blocks);
}

// DSpark chain over the P predicting slots: slot j's logits get W2·W1[prev] (head-dependent), and
// prev becomes the token picked from the biased logits. prev starts at each block's anchor, read
// as a strided view of the token input. With top_k > 0 (argmax drafting) the bias goes to each
// slot's top-k base candidates only (vLLM's dspark_draft_topk): k rows of W2 per slot instead of
// all. Returns the biased logits (when asked for, top_k 0 only; filtered by the samplers when
// sampling) [Vd, P·n_blocks].
static ggml_tensor * markov_chain(const dspark_graph & g, const dflash_model & m, dflash_block_graph & io,
                                  const dflash_pick & pick, ggml_tensor * logits, ggml_tensor * hid, ggml_tensor * d2t_i32, int P,
                                  int n_blocks, int block_len, bool want_logits, int top_k) {
    ggml_context * ctx = g.ctx;
    ggml_tensor * cand = top_k > 0 ? ggml_top_k(ctx, logits, top_k) : nullptr;        // I32 [K, P·n_blocks]
    ggml_tensor * cand_logits = cand ? dspark_gather_cols(ctx, logits, cand) : nullptr;  // [K, P·n_blocks]
    ggml_tensor * prev = chain_anchors(ctx, io, n_blocks, block_len);
    ggml_tensor * s = nullptr;
    std::vector<ggml_tensor *> biased_slots;
    for (int j = 0; j < P; ++j) {
        ggml_tensor * e = ggml_get_rows(ctx, m.markov_w1, prev);  // [R, n_blocks]
        if (j == 0) {
            s = chain_state(ctx, m, e);
        }
        ggml_tensor * h = ggml_cont(ctx, slot_view(ctx, hid, j, P, n_blocks));
        ggml_tensor * r = markov_input(g, m, e, h, &s);
        if (m.conf_w) {
            io.conf_out.push_back(confidence(g, m, h, e, j));
        }
        ggml_tensor * ids;  // the slot's pick in draft ids [n_blocks]
        if (cand) {
            ggml_tensor * cj = ggml_cont(ctx, slot_view(ctx, cand, j, P, n_blocks));  // I32 [K, n_blocks]
            ggml_tensor * local = ggml_argmax(ctx, top_k_biased(g, m, cand_logits, cj, r, j, P, n_blocks));
            ids = ggml_reshape_1d(ctx, dspark_gather_cols(ctx, cj, ggml_reshape_2d(ctx, local, 1, n_blocks)), n_blocks);
        } else {
            ggml_tensor * biased = ggml_add(ctx, slot_view(ctx, logits, j, P, n_blocks), g.mm(m.markov_w2, r, m.markov_w2_s));
            ggml_tensor * inputs = io.sampler ? ggml_cont(ctx, slot_view(ctx, io.sampler, j, P, n_blocks)) : nullptr;
            ggml_tensor * picked_from = nullptr;
            ids = pick_tokens(io, pick, ctx, biased, inputs, want_logits, &picked_from);
            biased_slots.push_back(picked_from);
        }
        ggml_tensor * tok = to_target_ids(ctx, ids, d2t_i32);  // [n_blocks]
        ggml_set_output(tok);
        io.tokens_out.push_back(tok);
        prev = tok;
    }
    return want_logits ? stack_slots(ctx, biased_slots, n_blocks) : logits;
}

// Draft-vocab logits [Vd, n] -> target-vocab logits [V, n]: rows the draft cannot produce are -inf.
static ggml_tensor * to_full_vocab(ggml_context * ctx, ggml_tensor * logits, const dflash_vocab_maps & maps) {
    ggml_tensor * lt = ggml_cont(ctx, ggml_transpose(ctx, logits));  // [n, Vd]
    ggml_tensor * full = ggml_get_rows(ctx, lt, maps.t2d);           // [n, V]
    return ggml_add(ctx, ggml_cont(ctx, ggml_transpose(ctx, full)), maps.mask);
}

dflash_block_graph build_dflash_block(const dspark_graph & g, const dflash_model & m, const dspark_kv_cache & kv,
                                      const dflash_vocab_maps & maps, int n_blocks, int block_len, int n_kv, bool flash,
                                      bool want_logits, const dflash_pick & pick) {
    const dflash_hparams & hp = m.hp;
    ggml_context * ctx = g.ctx;
    const int n_tok = n_blocks * block_len;
    const int first = hp.first_pred_slot();
    const int P = block_len - first;
    const bool markov = hp.markov != markov_head::none;

    dflash_block_graph io;
    io.tokens = dspark_graph_input(ctx, GGML_TYPE_I32, n_tok, 0, "inp_block_tokens");
    io.pos    = dspark_graph_input(ctx, GGML_TYPE_I32, n_tok, 0, "inp_block_pos");
    io.kv_idx = dspark_graph_input(ctx, GGML_TYPE_I64, n_tok, 0, "inp_block_kv_idx");
    io.mask   = dspark_graph_input(ctx, GGML_TYPE_F16, n_kv, n_tok, "inp_block_mask");
    if (hp.n_swa > 0) {
        io.mask_swa = dspark_graph_input(ctx, GGML_TYPE_F16, n_kv, n_tok, "inp_block_mask_swa");
    }
    if (pick.sampler.sample) {
        io.sampler = dspark_graph_input(ctx, GGML_TYPE_F32, DSPARK_SAMPLER_N_INPUTS, (int64_t) P * n_blocks, "inp_draft_sampler");
    }

    ggml_tensor * x = ggml_get_rows(ctx, m.tok_embd, io.tokens);  // [E, n_tok]
    if (hp.embedding_scale != 0.0f) {
        x = ggml_scale(ctx, x, hp.embedding_scale);
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        x = block_layer(g, m, kv, il, x, io, n_kv, flash);
    }
    // only the predicting slots go through the head: [E, B, n_blocks] -> [E, P·n_blocks]
    ggml_tensor * x3 = ggml_reshape_3d(ctx, x, hp.n_embd, block_len, n_blocks);
    ggml_tensor * xp = ggml_view_3d(ctx, x3, hp.n_embd, P, n_blocks, x3->nb[1], x3->nb[2], x3->nb[1] * first);
    ggml_tensor * hid = g.rms_norm(ggml_reshape_2d(ctx, ggml_cont(ctx, xp), hp.n_embd, (int64_t) P * n_blocks),
                                   m.output_norm, hp.rms_eps);  // [E, P·n_blocks]
    ggml_tensor * logits = g.mm(m.output, hid, m.output_s);       // [Vd, P·n_blocks]
    if (hp.logit_softcap > 0.0f) {  // on the base logits, before the Markov bias (DeepSpec's order)
        logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits, 1.0f / hp.logit_softcap)), hp.logit_softcap);
    }

    const int top_k = std::min<int>(pick.markov_top_k, hp.n_vocab_draft);
    if (markov) {
        const bool restricted = top_k > 0 && !io.sampler && !want_logits;  // argmax drafting only
        logits = markov_chain(g, m, io, pick, logits, hid, maps.d2t, P, n_blocks, block_len, want_logits, restricted ? top_k : 0);
    } else {
        // every slot of every block at once: columns block-major (b·P + j), as the sampler's inputs
        ggml_tensor * picked_from = nullptr;
        ggml_tensor * ids = pick_tokens(io, pick, ctx, logits, io.sampler, want_logits, &picked_from);
        logits = picked_from;
        ggml_tensor * tok = to_target_ids(ctx, ids, maps.d2t);  // [P·n_blocks]
        ggml_set_output(tok);
        io.tokens_out.push_back(tok);
    }
    for (ggml_tensor * t : io.tokens_out) {
        g.expand(t);
    }
    for (ggml_tensor * t : io.conf_out) {
        g.expand(t);
    }
    for (ggml_tensor * t : io.prob_out) {
        g.expand(t);
    }
    if (want_logits) {
        io.logits = maps.t2d ? to_full_vocab(ctx, logits, maps) : logits;
        ggml_set_name(io.logits, "draft_logits");
        ggml_set_output(io.logits);
        g.expand(io.logits);
    }
    return io;
}
