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

// One pick per column of logits [Vd, n]: the argmax where greedy is 1, elsewhere an inverse-CDF
// draw from softmax(logits · inv_temp) at the column's uniform u: the first candidate whose
// cumulative probability reaches u times the total (the total, not 1, so rounding can never pick a
// candidate of probability 0). u, inv_temp, greedy: F32 [1, n]. Returns draft ids I32 [n] and, in
// *prob, each pick's probability under the distribution it was drawn from [1, n].
static ggml_tensor * sample_columns(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * u, ggml_tensor * inv_temp,
                                    ggml_tensor * greedy, ggml_tensor ** prob) {
    const int64_t Vd = logits->ne[0], n = logits->ne[1];
    ggml_tensor * probs = ggml_soft_max(ctx, ggml_mul(ctx, logits, inv_temp));            // [Vd, n]
    ggml_tensor * cum = ggml_cumsum(ctx, probs);
    ggml_tensor * total = ggml_cont(ctx, ggml_view_2d(ctx, cum, 1, n, cum->nb[1], (Vd - 1) * ggml_element_size(cum)));
    ggml_tensor * draw = ggml_mul(ctx, u, total);                                           // [1, n]
    ggml_tensor * drawn = ggml_sum_rows(ctx, ggml_step(ctx, ggml_neg(ctx, ggml_sub(ctx, cum, draw))));  // candidates before it
    ggml_tensor * index = ggml_reshape_2d(ctx, ggml_arange(ctx, 0.0f, (float) Vd, 1.0f), 1, Vd);
    ggml_tensor * best = ggml_get_rows(ctx, index, ggml_argmax(ctx, logits));              // [1, n] as a number
    ggml_tensor * pick = ggml_add(ctx, drawn, ggml_mul(ctx, greedy, ggml_sub(ctx, best, drawn)));
    ggml_tensor * ids = ggml_reshape_1d(ctx, ggml_cast(ctx, pick, GGML_TYPE_I32), n);
    *prob = dspark_gather_cols(ctx, probs, ggml_reshape_2d(ctx, ids, 1, n));                // [1, n]
    ggml_set_output(*prob);
    return ids;
}

// The token a slot proposes, argmax or drawn (io.uniform set); u / inv_temp / greedy as above.
static ggml_tensor * pick_tokens(dflash_block_graph & io, ggml_context * ctx, ggml_tensor * logits, ggml_tensor * u,
                                 ggml_tensor * inv_temp, ggml_tensor * greedy) {
    if (!io.uniform) {
        return ggml_argmax(ctx, logits);
    }
    ggml_tensor * prob = nullptr;
    ggml_tensor * ids = sample_columns(ctx, logits, u, inv_temp, greedy, &prob);
    io.prob_out.push_back(prob);
    return ids;
}

// ---- sampler filters ----------------------------------------------------------------------------

void dflash_filter_row(float out[3], int top_k, float top_p, float min_p, int n_vocab_draft) {
    out[0] = (float) ((top_k > 0 && top_k < n_vocab_draft ? top_k : n_vocab_draft) - 1);
    out[1] = top_p < 1.0f ? top_p : 2.0f;
    out[2] = min_p > 0.0f ? logf(min_p) : -1e30f;
}

static ggml_tensor * filter_row(ggml_context * ctx, ggml_tensor * f, int i) {
    return ggml_cont(ctx, ggml_view_2d(ctx, f, 1, f->ne[1], f->nb[1], i * ggml_element_size(f)));
}

static ggml_tensor * max_of(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b) {
    return ggml_add(ctx, a, ggml_relu(ctx, ggml_sub(ctx, b, a)));
}

// Each column's sampler filters on logits [Vd, n], as the target's chain defines them (top-k, then
// top-p and min-p on the softmax at temperature 1 of the top-k), applied as one threshold per
// column: logits below it drop to -1e30. filt [3, n] holds the columns' dflash_filter_row values.
// A threshold keeps ties with the last kept candidate; q is read from the result, so the host's
// acceptance test sees exactly what was sampled.
static ggml_tensor * filter_logits(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * filt) {
    ggml_tensor * last_k = ggml_cast(ctx, filter_row(ctx, filt, 0), GGML_TYPE_I32);  // [1, n]
    ggml_tensor * top_p  = filter_row(ctx, filt, 1);
    ggml_tensor * log_mp = filter_row(ctx, filt, 2);
    ggml_tensor * sorted = dspark_gather_cols(ctx, logits, ggml_argsort(ctx, logits, GGML_SORT_ORDER_DESC));
    ggml_tensor * probs  = ggml_soft_max(ctx, sorted);
    ggml_tensor * cum    = ggml_cumsum(ctx, probs);
    ggml_tensor * before = ggml_sub(ctx, cum, probs);                       // mass before each candidate
    ggml_tensor * mass_k = dspark_gather_cols(ctx, cum, last_k);            // [1, n]: the top-k's mass
    ggml_tensor * keep_p = ggml_step(ctx, ggml_add(ctx, ggml_neg(ctx, before), ggml_mul(ctx, top_p, mass_k)));
    // the last candidate top-p keeps; clamped, so that NaN logits (a broken file) cannot index out of range
    ggml_tensor * n_p = ggml_clamp(ctx, ggml_scale_bias(ctx, ggml_sum_rows(ctx, keep_p), 1.0f, -1.0f), 0.0f,
                                   (float) (logits->ne[0] - 1));
    ggml_tensor * thr    = dspark_gather_cols(ctx, sorted, last_k);
    thr = max_of(ctx, thr, dspark_gather_cols(ctx, sorted, ggml_cast(ctx, n_p, GGML_TYPE_I32)));
    ggml_tensor * top = ggml_cont(ctx, ggml_view_2d(ctx, sorted, 1, sorted->ne[1], sorted->nb[1], 0));
    thr = max_of(ctx, thr, ggml_add(ctx, top, log_mp));                     // min_p: l >= l_max + log min_p
    ggml_tensor * drop = ggml_step(ctx, ggml_neg(ctx, ggml_sub(ctx, logits, thr)));  // 1 below the threshold
    return ggml_add(ctx, logits, ggml_scale(ctx, drop, -1e30f));
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
// [n_blocks]; and the RNN state, zero at the first predicting slot.
static ggml_tensor * chain_anchors(ggml_context * ctx, const dflash_block_graph & io, int n_blocks, int block_len) {
    ggml_tensor * prev = ggml_view_2d(ctx, io.tokens, 1, n_blocks, sizeof(int32_t) * block_len, 0);
    return ggml_reshape_1d(ctx, ggml_cont(ctx, prev), n_blocks);
}

static ggml_tensor * chain_state(ggml_context * ctx, const dflash_model & m, int n_blocks) {
    if (m.hp.markov != markov_head::rnn) {
        return nullptr;
    }
    return ggml_fill(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, m.hp.markov_rank, n_blocks), 0.0f);
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
// all. Returns the biased logits (when asked for, top_k 0 only) [Vd, P·n_blocks].
static ggml_tensor * markov_chain(const dspark_graph & g, const dflash_model & m, dflash_block_graph & io,
                                  ggml_tensor * logits, ggml_tensor * hid, ggml_tensor * d2t_i32, int P, int n_blocks,
                                  int block_len, bool want_logits, int top_k) {
    ggml_context * ctx = g.ctx;
    ggml_tensor * cand = top_k > 0 ? ggml_top_k(ctx, logits, top_k) : nullptr;        // I32 [K, P·n_blocks]
    ggml_tensor * cand_logits = cand ? dspark_gather_cols(ctx, logits, cand) : nullptr;  // [K, P·n_blocks]
    ggml_tensor * prev = chain_anchors(ctx, io, n_blocks, block_len);
    ggml_tensor * s = chain_state(ctx, m, n_blocks);
    std::vector<ggml_tensor *> biased_slots;
    for (int j = 0; j < P; ++j) {
        ggml_tensor * e = ggml_get_rows(ctx, m.markov_w1, prev);  // [R, n_blocks]
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
            if (io.filter) {
                biased = filter_logits(ctx, biased, ggml_cont(ctx, slot_view(ctx, io.filter, j, P, n_blocks)));
            }
            ggml_tensor * u = io.uniform ? ggml_cont(ctx, ggml_view_2d(ctx, io.uniform, 1, n_blocks, ggml_element_size(io.uniform),
                                                                         io.uniform->nb[1] * j)) : nullptr;
            ids = pick_tokens(io, ctx, biased, u, io.inv_temp, io.greedy);
            biased_slots.push_back(biased);
        }
        ggml_tensor * tok = to_target_ids(ctx, ids, d2t_i32);  // [n_blocks]
        ggml_set_output(tok);
        io.tokens_out.push_back(tok);
        prev = tok;
    }
    return want_logits ? stack_slots(ctx, biased_slots, n_blocks) : logits;
}

// Draft-vocab logits [Vd, n] -> target-vocab logits [V, n]: rows the draft cannot produce are -inf.
static ggml_tensor * scatter_to_vocab(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * d2t, int64_t V) {
    ggml_tensor * lt = ggml_cont(ctx, ggml_transpose(ctx, logits));                          // [n, Vd]
    ggml_tensor * full = ggml_fill(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, lt->ne[0], V), -INFINITY);  // [n, V]
    full = ggml_set_rows(ctx, full, lt, d2t);
    return ggml_cont(ctx, ggml_transpose(ctx, full));                                          // [V, n]
}

dflash_block_graph build_dflash_block(const dspark_graph & g, const dflash_model & m, const dspark_kv_cache & kv,
                                      ggml_tensor * d2t_i32, int n_blocks, int block_len, int n_kv, bool flash,
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
    if (pick.sample) {
        io.uniform  = dspark_graph_input(ctx, GGML_TYPE_F32, n_blocks, P, "inp_draft_uniform");
        io.inv_temp = dspark_graph_input(ctx, GGML_TYPE_F32, 1, n_blocks, "inp_draft_inv_temp");
        io.greedy   = dspark_graph_input(ctx, GGML_TYPE_F32, 1, n_blocks, "inp_draft_greedy");
        if (pick.filter) {
            io.filter = dspark_graph_input(ctx, GGML_TYPE_F32, 3, (int64_t) P * n_blocks, "inp_filter");
        }
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
        const bool restricted = top_k > 0 && !pick.sample && !want_logits;  // argmax drafting only
        logits = markov_chain(g, m, io, logits, hid, d2t_i32, P, n_blocks, block_len, want_logits, restricted ? top_k : 0);
    } else {
        if (io.filter) {
            logits = filter_logits(ctx, logits, io.filter);
        }
        // columns are block-major (b·P + j): the draws transposed to match, the per-block values repeated
        ggml_tensor * u = nullptr, * inv_temp = nullptr, * greedy = nullptr;
        if (io.uniform) {
            const int64_t n = (int64_t) P * n_blocks;
            u = ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_transpose(ctx, io.uniform)), 1, n);
            auto per_slot = [&](ggml_tensor * t) {
                ggml_tensor * shape = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, P, n_blocks);
                return ggml_reshape_2d(ctx, ggml_repeat(ctx, ggml_reshape_3d(ctx, t, 1, 1, n_blocks), shape), 1, n);
            };
            inv_temp = per_slot(io.inv_temp);
            greedy = per_slot(io.greedy);
        }
        ggml_tensor * tok = to_target_ids(ctx, pick_tokens(io, ctx, logits, u, inv_temp, greedy), d2t_i32);  // [P·n_blocks]
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
        io.logits = m.d2t ? scatter_to_vocab(ctx, logits, m.d2t, hp.n_vocab) : logits;
        ggml_set_name(io.logits, "draft_logits");
        ggml_set_output(io.logits);
        g.expand(io.logits);
    }
    return io;
}
