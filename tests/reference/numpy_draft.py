"""Plain-numpy reference of a DFlash / DSpark draft (spec §2.1-2.4), one sequence.

    ref = DraftRef(draft_weights, draft_cfg, target_weights, target_cfg)
    ref.inject(features, positions)    # target features -> context K/V cells, one per position
    out = ref.propose(anchor, pos0, n_block)
    ref.truncate(pos)                  # drop context cells at positions >= pos

Dimensions: T rows, N stored cells, B = n_block, E n_embd, V target vocab, Vd draft vocab,
L = len(target_layers), R markov rank, H/Hkv heads, D head_dim. Weights are numpy [out, in]
(tests/tiny_models.py's orientation): y = x @ W.T; ggml {in, out} is numpy [out, in].
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
from tests.tiny_models import DraftConfig, TargetConfig

from .common import RopeParams, apply_rope, attention, gelu_tanh, rms_norm, sigmoid, silu, swiglu_ffn


def features_from_layer_inputs(layer_inputs: Mapping[int, np.ndarray],
                               target_layers: List[int]) -> np.ndarray:
    """The fused feature rows [T, L*E]: captured target layer inputs in `target_layers` order."""
    return np.concatenate([layer_inputs[i] for i in target_layers], axis=-1)


class DraftRef:
    def __init__(self, draft_weights: Mapping[str, np.ndarray], draft_cfg: DraftConfig,
                 target_weights: Mapping[str, np.ndarray], target_cfg: TargetConfig):
        self.cfg = draft_cfg.resolve(target_cfg)
        self.target_cfg = target_cfg
        self.w = {n: np.asarray(t, dtype=np.float64) for n, t in draft_weights.items() if n != "d2t"}
        tw = {n: np.asarray(t, dtype=np.float64) for n, t in target_weights.items()}
        self.d2t: Optional[np.ndarray] = (np.asarray(draft_weights["d2t"], dtype=np.int64)
                                          if "d2t" in draft_weights else None)
        self.tok_embd, self.head = self._resolve_embeddings_and_head(tw)
        self.rope = RopeParams.from_metadata(
            n_dims=self.cfg.head_dim, freq_base=float(self.cfg.rope_theta), neox=True, scaling=None,
            n_ctx_train=int(self.cfg.n_ctx_train), freq_factors=draft_weights.get("rope_freqs.weight"))
        D, Hkv = self.cfg.head_dim, self.cfg.n_head_kv
        self.cells_k = [np.zeros((0, Hkv, D)) for _ in range(self.cfg.n_layer)]  # [N, Hkv, D]
        self.cells_v = [np.zeros((0, Hkv, D)) for _ in range(self.cfg.n_layer)]
        self.cells_pos = np.zeros(0, dtype=np.int64)                             # [N]

    def _resolve_embeddings_and_head(self, tw: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """The loader's fallbacks: own token_embd or the target's; head = own output, else own
        token_embd (tied), else the target's output (or the target's tied token_embd)."""
        tok_embd = self.w.get("token_embd.weight", tw["token_embd.weight"])      # [V, E]
        if "output.weight" in self.w:
            head = self.w["output.weight"]                                       # [Vd, E]
        elif "token_embd.weight" in self.w:
            head = self.w["token_embd.weight"]
        else:
            head = tw.get("output.weight", tw["token_embd.weight"])
        return tok_embd, head

    # --------------------------------------------------------------------------------------------
    # context: KV injection (spec §2.1)

    @property
    def positions(self) -> np.ndarray:
        return self.cells_pos.copy()

    def truncate(self, pos: int) -> None:
        """Drop every stored cell at position >= pos."""
        keep = self.cells_pos < pos
        self.cells_pos = self.cells_pos[keep]
        self.cells_k = [k[keep] for k in self.cells_k]
        self.cells_v = [v[keep] for v in self.cells_v]

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g = RMSNorm_enc(fc . f (* fc.scale)): [T, L*E] -> [T, E]."""
        g = np.asarray(features, dtype=np.float64) @ self.w["fc.weight"].T
        g = g * self.w["fc.scale"][0] if "fc.scale" in self.w else g
        return rms_norm(g, self.w["enc.output_norm.weight"], self.cfg.rms_eps)

    def inject(self, features: np.ndarray, positions) -> np.ndarray:
        """Store one context cell per row in every layer; returns g [T, E]."""
        positions = np.asarray(positions, dtype=np.int64)                        # [T]
        if np.intersect1d(positions, self.cells_pos).size:
            raise ValueError("a cell at that position is already stored: truncate first")
        g = self.encode(features)                                                # [T, E]
        for il in range(self.cfg.n_layer):
            k_raw, v = self._kv(il, g)
            k = rms_norm(k_raw, self._lw(il, "attn_k_norm.weight"), self.cfg.rms_eps)
            k = apply_rope(k, positions, self.rope)
            self.cells_k[il] = np.concatenate([self.cells_k[il], k])
            self.cells_v[il] = np.concatenate([self.cells_v[il], v])
        self.cells_pos = np.concatenate([self.cells_pos, positions])
        return g

    def _lw(self, il: int, name: str) -> np.ndarray:
        return self.w[f"blk.{il}.{name}"]

    def _kv(self, il: int, h: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Raw K [T, Hkv, D] (before k_norm/rope) and final V [T, Hkv, D] from rows h [T, E].
        Shared-KV drafts have no attn_v: V is the weightless per-head RMSNorm of raw K."""
        T, Hkv, D = h.shape[0], self.cfg.n_head_kv, self.cfg.head_dim
        k_raw = (h @ self._lw(il, "attn_k.weight").T).reshape(T, Hkv, D)
        if f"blk.{il}.attn_v.weight" in self.w:
            v = (h @ self._lw(il, "attn_v.weight").T).reshape(T, Hkv, D)
        else:
            v = rms_norm(k_raw, None, self.cfg.rms_eps)
        return k_raw, v

    # --------------------------------------------------------------------------------------------
    # block decoder (spec §2.2)

    def propose(self, anchor: int, pos0: int, n_block: int) -> Dict[str, Optional[np.ndarray]]:
        """Decode the block [anchor, MASK x (n_block-1)] at positions pos0.. and run the heads.

        Returns
          hidden       [B, E]  final-normed hidden states (the confidence / gate / rnn input)
          base_logits  [B, V]  head logits scattered to the full vocab (-inf on unmapped rows)
          logits       [B, V]  after the Markov bias (== base_logits for DFlash)
          tokens       [B]     argmax of logits, per slot
          confidence   [B] or None; NaN on the bonus slot 0 when sample_from_anchor is false
        The Markov head is skipped (plain logits, no confidence) when n_block > block_size, as in
        llama.cpp.
        """
        if (self.cells_pos >= pos0).any():
            raise ValueError("stored cells at positions >= pos0: truncate(pos0) first")
        cfg = self.cfg
        tokens_in = np.array([anchor] + [cfg.mask_token_id] * (n_block - 1), dtype=np.int64)  # [B]
        positions = pos0 + np.arange(n_block, dtype=np.int64)                   # [B]
        x = self.tok_embd[tokens_in]                                            # [B, E]
        if cfg.embedding_scale:
            x = x * cfg.embedding_scale
        for il in range(cfg.n_layer):
            x = self._block_layer(il, x, positions)
        hidden = rms_norm(x, self.w["output_norm.weight"], cfg.rms_eps)        # [B, E]
        head_logits = hidden @ self.head.T
        if cfg.logit_softcap:
            head_logits = cfg.logit_softcap * np.tanh(head_logits / cfg.logit_softcap)
        base_logits = self._scatter_to_vocab(head_logits, fill=-np.inf)  # [B, V]

        out: Dict[str, Optional[np.ndarray]] = {"hidden": hidden, "base_logits": base_logits}
        if cfg.is_dspark and n_block <= cfg.block_size:
            logits, confidence = self._markov_chain(anchor, base_logits, hidden)
        else:
            logits, confidence = base_logits.copy(), None
        out.update(logits=logits, tokens=np.argmax(logits, axis=-1), confidence=confidence)
        return out

    def _block_layer(self, il: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg, B = self.cfg, x.shape[0]
        H, D = cfg.n_head, cfg.head_dim

        # attention over the stored context cells + the whole block
        h = rms_norm(x, self._lw(il, "attn_norm.weight"), cfg.rms_eps)        # [B, E]
        q = (h @ self._lw(il, "attn_q.weight").T).reshape(B, H, D)             # [B, H, D]
        k_raw, v = self._kv(il, h)                                             # [B, Hkv, D]
        q = rms_norm(q, self._lw(il, "attn_q_norm.weight"), cfg.rms_eps)
        k = rms_norm(k_raw, self._lw(il, "attn_k_norm.weight"), cfg.rms_eps)
        q, k = apply_rope(q, positions, self.rope), apply_rope(k, positions, self.rope)
        keys = np.concatenate([self.cells_k[il], k])                           # [N+B, Hkv, D]
        values = np.concatenate([self.cells_v[il], v])
        key_pos = np.concatenate([self.cells_pos, positions])                  # [N+B]
        allowed = self._attention_mask(il, positions, key_pos)                 # [B, N+B]
        scale = cfg.attention_scale if cfg.attention_scale else 1.0 / math.sqrt(D)
        attn = attention(q, keys, values, allowed, scale) @ self._lw(il, "attn_output.weight").T
        if cfg.value_scale:
            attn = attn * cfg.value_scale
        if f"blk.{il}.post_attention_norm.weight" in self.w:
            attn = rms_norm(attn, self._lw(il, "post_attention_norm.weight"), cfg.rms_eps)
        x = x + attn                                                           # [B, E]

        # feed-forward
        h = rms_norm(x, self._lw(il, "ffn_norm.weight"), cfg.rms_eps)
        act = gelu_tanh if cfg.hidden_activation in ("gelu", "gelu_pytorch_tanh") else silu
        y = swiglu_ffn(h, self._lw(il, "ffn_gate.weight"), self._lw(il, "ffn_up.weight"),
                       self._lw(il, "ffn_down.weight"), act=act)
        if f"blk.{il}.post_ffw_norm.weight" in self.w:
            y = rms_norm(y, self._lw(il, "post_ffw_norm.weight"), cfg.rms_eps)
        x = x + y
        if f"blk.{il}.layer_output_scale.weight" in self.w:
            x = x * self._lw(il, "layer_output_scale.weight")[0]
        return x

    def _attention_mask(self, il: int, q_pos: np.ndarray, key_pos: np.ndarray) -> np.ndarray:
        """Non-causal within the block unless cfg.causal; SWA layers drop keys q_pos - k_pos >= window."""
        cfg = self.cfg
        allowed = np.ones((q_pos.size, key_pos.size), dtype=bool)
        if cfg.causal:
            allowed &= key_pos[None, :] <= q_pos[:, None]
        if cfg.sliding_window > 0 and cfg.sliding_window_pattern and cfg.sliding_window_pattern[il]:
            allowed &= (q_pos[:, None] - key_pos[None, :]) < cfg.sliding_window
        return allowed

    def _scatter_to_vocab(self, rows: np.ndarray, fill: float) -> np.ndarray:
        """Draft-vocab columns [.., Vd] -> full vocab [.., V] through d2t (absolute ids)."""
        if self.d2t is None:
            return rows
        out = np.full(rows.shape[:-1] + (self.target_cfg.n_vocab,), fill)
        out[..., self.d2t] = rows
        return out

    # --------------------------------------------------------------------------------------------
    # DSpark Markov head + confidence (spec §2.4)

    def _markov_chain(self, anchor: int, base_logits: np.ndarray,
                      hidden: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Left to right over the predicting slots: prev = anchor, then the argmax of the previous
        slot's biased logits. sample_from_anchor=False: slot 0 passes through unbiased."""
        cfg = self.cfg
        n_block = base_logits.shape[0]
        first = 0 if cfg.sample_from_anchor else 1
        logits = base_logits.copy()
        has_conf = "conf_proj.weight" in self.w
        confidence = np.full(n_block, np.nan) if has_conf else None
        w1 = self.w["markov_w1.weight"]                                        # [V, R]
        state = np.zeros(w1.shape[1])                                          # rnn state s [R]
        prev = anchor
        for i in range(first, n_block):
            e = w1[prev]                                                       # [R]
            bias, state = self._markov_bias(e, hidden[i], state)               # [Vd]
            logits[i] = logits[i] + self._scatter_to_vocab(bias, fill=0.0)
            if confidence is not None:
                z = np.concatenate([hidden[i], e])                             # [E+R]
                c = self.w["conf_proj.weight"] @ z                             # [1]
                c = c + self.w["conf_proj.bias"] if "conf_proj.bias" in self.w else c
                confidence[i] = sigmoid(c[0])
            prev = int(np.argmax(logits[i]))
        return logits, confidence

    def _markov_bias(self, e: np.ndarray, h: np.ndarray, state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Bias [Vd] for one slot, and the next rnn state.
        vanilla: W2 e;  gated: W2 (sigmoid(Wg [h; e] + bg) * e);
        rnn: [g, c, o] = Wj [s; e; h] + bj; s' = sig(g) s + (1 - sig(g)) tanh(c); W2 tanh(o)."""
        w2 = self.w["markov_w2.weight"]                                        # [Vd, R]
        kind = self.cfg.markov_head_type
        if kind == "vanilla":
            r = e
        elif kind == "gated":
            gate = sigmoid(self.w["markov_gate.weight"] @ np.concatenate([h, e]) + self.w["markov_gate.bias"])
            r = gate * e
        else:
            z = self.w["markov_joint.weight"] @ np.concatenate([state, e, h]) + self.w["markov_joint.bias"]
            g, c, o = np.split(z, 3)                                           # [R] each
            state = sigmoid(g) * state + (1.0 - sigmoid(g)) * np.tanh(c)
            r = np.tanh(o)
        bias = w2 @ r
        if "markov_w2.scale" in self.w:
            bias = bias * self.w["markov_w2.scale"][0]
        return bias, state
