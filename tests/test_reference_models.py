"""Self-tests of tests/reference (the numpy oracles) and of tests/tiny_models.py (the random GGUFs).

* TargetRef == Hugging Face transformers (qwen3 / llama / qwen2, rope variants) on the same weights;
  incremental forward + truncate == one-shot forward.
* DraftRef's block decoder == HF Qwen3 layers (no context), and == a torch transcription of the
  spec (with context and every option); its Markov / gated / rnn heads == a torch transcription of
  the formulas. The transcriptions are written from the spec text, not from the numpy code.
* tiny.py's files read back with gguf.GGUFReader: keys, value types, tensor shapes and types, and
  quantized tensors dequantize to exactly the returned weights.

Run: PYTHONPATH=python:. python -m pytest tests/test_reference_models.py -q
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import gguf
import numpy as np
import pytest

try:  # the Hugging Face / torch cross-checks need the `reference` extra; the GGUF checks do not
    import torch
    import transformers
except ImportError:  # pragma: no cover
    torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch + transformers not installed")

from tests.tiny_models import (  # noqa: E402
    MASK_TOKEN,
    HF_TARGET_VARIANTS,
    DraftConfig,
    TargetConfig,
    read_gguf_weights,
    special_token_ids,
    write_draft,
    write_target,
)

from tests.reference import DraftRef, TargetRef, features_from_layer_inputs  # noqa: E402

if torch is not None:
    torch.set_grad_enabled(False)

TOL = 1e-4  # float32 HF vs float64 numpy, logits of std ~3


from tests.reference.hf_target import hf_model as _hf_model  # noqa: E402


TARGET_CASES = {name: TargetConfig(**fields) for name, fields in HF_TARGET_VARIANTS.items()}


@needs_torch
@pytest.mark.parametrize("case", sorted(TARGET_CASES))
def test_target_ref_matches_transformers(case: str, tmp_path: Path) -> None:
    cfg = TARGET_CASES[case]
    w = write_target(tmp_path / "t.gguf", cfg, seed=3)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.n_vocab, 13)
    positions = 40 + np.arange(13)  # away from 0: rope phases matter

    logits, layer_inputs = TargetRef(w, cfg).forward(tokens, positions)

    out = _hf_model(w, cfg)(input_ids=torch.tensor(tokens)[None], position_ids=torch.tensor(positions)[None],
                            output_hidden_states=True)
    assert np.abs(logits - out.logits[0].double().numpy()).max() <= TOL
    for layer in range(cfg.n_layer):  # HF hidden_states[L] is the input of layer L for L < n_layer
        assert np.abs(layer_inputs[layer] - out.hidden_states[layer][0].double().numpy()).max() <= TOL
    assert logits.std() > 0.5  # not degenerate


def test_target_ref_incremental_and_truncate_match_one_shot(tmp_path: Path) -> None:
    cfg = TargetConfig(arch="qwen3", n_layer=3)
    w = write_target(tmp_path / "t.gguf", cfg, seed=5)
    tokens = np.random.default_rng(1).integers(0, cfg.n_vocab, 10)
    full_logits, full_inputs = TargetRef(w, cfg).forward(tokens, np.arange(10))

    ref = TargetRef(w, cfg)
    ref.forward(tokens[:6], np.arange(6))
    ref.forward([7, 8, 9], [6, 7, 8])                # a rejected continuation ...
    ref.truncate(6)                                   # ... rolled back
    assert ref.n_cached == 6
    rows = [ref.forward(tokens[i:i + 1], [i]) for i in range(6, 10)]
    step_logits = np.concatenate([r[0] for r in rows])
    assert np.abs(step_logits - full_logits[6:]).max() < 1e-9
    assert np.abs(rows[-1][1][2] - full_inputs[2][9:]).max() < 1e-9
    with pytest.raises(ValueError):
        ref.forward([1], [3])  # position 3 is still in the history

    greedy = TargetRef(w, cfg).generate_greedy(tokens[:4], 5)
    chain_logits, _ = TargetRef(w, cfg).forward(list(tokens[:4]) + greedy[:-1], np.arange(8))
    assert greedy == [int(t) for t in chain_logits[3:].argmax(-1)]


# ------------------------------------------------------------------------------------------------
# draft: backbone


def _draft_setup(tmp_path: Path, dcfg: DraftConfig, tcfg: Optional[TargetConfig] = None, seed: int = 11):
    tcfg = tcfg or TargetConfig(arch="qwen3", n_layer=3)
    tw = write_target(tmp_path / "t.gguf", tcfg, seed=1)
    dw = write_draft(tmp_path / "d.gguf", dcfg, tcfg, seed=seed)
    return tcfg, tw, dw, dcfg.resolve(tcfg)


@needs_torch
def test_draft_block_without_context_matches_transformers_qwen3(tmp_path: Path) -> None:
    """A draft layer stack is a Qwen3 decoder with a bidirectional mask: check it against HF."""
    dcfg = DraftConfig(kind="dflash", n_layer=2, block_size=5)
    tcfg, tw, dw, rcfg = _draft_setup(tmp_path, dcfg)
    anchor, pos0, B = 17, 30, 5
    out = DraftRef(dw, dcfg, tw, tcfg).propose(anchor, pos0, B)

    hf_layers = {f"blk.{i}.{n}": dw[f"blk.{i}.{n}"] for i in range(2) for n in
                 ("attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                  "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight", "ffn_gate.weight",
                  "ffn_up.weight", "ffn_down.weight")}
    hf_layers.update({"token_embd.weight": tw["token_embd.weight"], "output.weight": tw["output.weight"],
                      "output_norm.weight": dw["output_norm.weight"]})
    as_target = TargetConfig(arch="qwen3", n_vocab=tcfg.n_vocab, n_embd=tcfg.n_embd, n_layer=2,
                             n_head=rcfg.n_head, n_head_kv=rcfg.n_head_kv, head_dim=rcfg.head_dim,
                             n_ff=rcfg.n_ff, rope_theta=float(rcfg.rope_theta), rms_eps=rcfg.rms_eps)
    model = _hf_model(hf_layers, as_target)
    ids = torch.tensor([[anchor] + [rcfg.mask_token_id] * (B - 1)])
    no_mask = torch.zeros(1, 1, B, B)  # additive 4-D mask: every slot sees every slot
    hf = model(input_ids=ids, position_ids=torch.arange(pos0, pos0 + B)[None], attention_mask=no_mask)

    assert np.abs(out["base_logits"] - hf.logits[0].double().numpy()).max() <= TOL
    assert np.array_equal(out["tokens"], out["base_logits"].argmax(-1))  # DFlash: plain argmax
    assert out["confidence"] is None


def _t(x: np.ndarray) -> "torch.Tensor":
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _torch_rms(x: "torch.Tensor", w: Optional["torch.Tensor"], eps: float) -> "torch.Tensor":
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _torch_neox_rope(x: "torch.Tensor", pos: "torch.Tensor", theta: float, factors) -> "torch.Tensor":
    """x [T, heads, D]: rotate (j, j + D/2) by pos * theta^(-2j/D) / factor_j."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if factors is not None:
        inv = inv / factors
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def _torch_draft_hidden(dw, tw, c: DraftConfig, feats, ctx_pos, anchor: int, pos0: int,
                        B: int) -> "torch.Tensor":
    """Spec §2.1-2.2 transcribed: fused context K/V + block pass -> final-normed hidden [B, E]."""
    W = {k: _t(v) for k, v in dw.items() if k != "d2t"}
    eps, H, Hkv, D = c.rms_eps, c.n_head, c.n_head_kv, c.head_dim
    factors = W.get("rope_freqs.weight")
    g = _t(feats) @ W["fc.weight"].T * (W["fc.scale"] if "fc.scale" in W else 1.0)
    g = _torch_rms(g, W["enc.output_norm.weight"], eps)
    emb = W["token_embd.weight"] if "token_embd.weight" in W else _t(tw["token_embd.weight"])
    x = emb[torch.tensor([anchor] + [c.mask_token_id] * (B - 1))] * (c.embedding_scale or 1.0)
    pos = torch.arange(pos0, pos0 + B)
    ctx_pos_t = torch.as_tensor(ctx_pos)
    all_pos = torch.cat([ctx_pos_t, pos])
    for i in range(c.n_layer):
        L = {n[len(f"blk.{i}."):]: t for n, t in W.items() if n.startswith(f"blk.{i}.")}

        def kv(rows: "torch.Tensor", p: "torch.Tensor"):
            k = (rows @ L["attn_k.weight"].T).view(-1, Hkv, D)
            if "attn_v.weight" in L:
                v = (rows @ L["attn_v.weight"].T).view(-1, Hkv, D)
            else:  # shared KV: weightless RMSNorm of the raw K
                v = _torch_rms(k, None, eps)
            return _torch_neox_rope(_torch_rms(k, L["attn_k_norm.weight"], eps), p, c.rope_theta, factors), v

        k_ctx, v_ctx = kv(g, ctx_pos_t)
        h = _torch_rms(x, L["attn_norm.weight"], eps)
        q = _torch_rms((h @ L["attn_q.weight"].T).view(B, H, D), L["attn_q_norm.weight"], eps)
        q = _torch_neox_rope(q, pos, c.rope_theta, factors)
        k_blk, v_blk = kv(h, pos)
        k, v = torch.cat([k_ctx, k_blk]), torch.cat([v_ctx, v_blk])
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        see = torch.ones(B, all_pos.numel(), dtype=torch.bool)
        if c.causal:
            see &= all_pos[None, :] <= pos[:, None]
        if c.sliding_window and c.sliding_window_pattern[i]:
            see &= (pos[:, None] - all_pos[None, :]) < c.sliding_window
        scale = c.attention_scale or D ** -0.5
        s = torch.einsum("bhd,nhd->hbn", q, k) * scale
        p = torch.softmax(s.masked_fill(~see[None], float("-inf")), -1)
        a = torch.einsum("hbn,nhd->bhd", p, v).reshape(B, H * D) @ L["attn_output.weight"].T
        a = a * (c.value_scale or 1.0)
        if "post_attention_norm.weight" in L:
            a = _torch_rms(a, L["post_attention_norm.weight"], eps)
        x = x + a
        u = _torch_rms(x, L["ffn_norm.weight"], eps)
        gate = u @ L["ffn_gate.weight"].T
        gelu = c.hidden_activation in ("gelu", "gelu_pytorch_tanh")
        gate = torch.nn.functional.gelu(gate, approximate="tanh") if gelu else torch.nn.functional.silu(gate)
        y = (gate * (u @ L["ffn_up.weight"].T)) @ L["ffn_down.weight"].T
        if "post_ffw_norm.weight" in L:
            y = _torch_rms(y, L["post_ffw_norm.weight"], eps)
        x = (x + y) * (L["layer_output_scale.weight"] if "layer_output_scale.weight" in L else 1.0)
    return _torch_rms(x, W["output_norm.weight"], eps)


DRAFT_CASES = {
    "dspark": DraftConfig(n_layer=2),
    "gemma-style": DraftConfig(shared_kv=True, post_norms=True, layer_output_scale=True,
                               hidden_activation="gelu_pytorch_tanh", embedding_scale=8.0,
                               attention_scale=1.0, value_scale=0.7, own_embeddings=True, own_head=True),
    "swa-causal": DraftConfig(n_layer=2, sliding_window=3, sliding_window_pattern=[True, False], causal=True,
                              fc_scale=True, rope_freqs=True, n_head_kv=4),
    "reduced-vocab": DraftConfig(draft_vocab=40, own_head=True, markov_w2_scale=True, head_dim=32, n_head=2,
                                 n_head_kv=1),
}


@needs_torch
@pytest.mark.parametrize("case", sorted(DRAFT_CASES))
def test_draft_ref_matches_torch_transcription(case: str, tmp_path: Path) -> None:
    dcfg = DRAFT_CASES[case]
    tcfg, tw, dw, rcfg = _draft_setup(tmp_path, dcfg)
    target = TargetRef(tw, tcfg)
    prompt = np.random.default_rng(2).integers(0, tcfg.n_vocab, 9)
    _, inputs = target.forward(prompt, np.arange(9))
    feats = features_from_layer_inputs(inputs, rcfg.target_layers)            # [9, L*E]

    ref = DraftRef(dw, dcfg, tw, tcfg)
    ref.inject(feats[:5], np.arange(5))
    ref.inject(feats[5:], np.arange(5, 9))                                       # in two chunks
    out = ref.propose(anchor=23, pos0=9, n_block=rcfg.block_size)

    expect = _torch_draft_hidden(dw, tw, rcfg, feats, np.arange(9), 23, 9, rcfg.block_size).numpy()
    assert np.abs(out["hidden"] - expect).max() < 1e-9
    head = dw.get("output.weight", dw.get("token_embd.weight", tw["output.weight"]))
    mapped = np.asarray(dw["d2t"]) if "d2t" in dw else np.arange(tcfg.n_vocab)
    assert np.abs(out["base_logits"][:, mapped] - expect @ head.astype(np.float64).T).max() < 1e-9
    if "d2t" in dw:
        unmapped = np.setdiff1d(np.arange(tcfg.n_vocab), mapped)
        assert np.isneginf(out["logits"][:, unmapped]).all()
        assert np.isin(out["tokens"], mapped).all()


def test_draft_context_changes_the_block_and_truncate_restores_it(tmp_path: Path) -> None:
    tcfg, tw, dw, rcfg = _draft_setup(tmp_path, DraftConfig())
    feats = np.random.default_rng(4).standard_normal((8, len(rcfg.target_layers) * tcfg.n_embd))
    short = DraftRef(dw, rcfg, tw, tcfg)
    short.inject(feats[:5], np.arange(5))
    longer = DraftRef(dw, rcfg, tw, tcfg)
    longer.inject(feats, np.arange(8))
    with pytest.raises(ValueError):
        longer.propose(5, 5, 4)               # stale cells at >= pos0
    with pytest.raises(ValueError):
        longer.inject(feats[:1], [3])         # position 3 already stored
    a = short.propose(5, 5, 4)
    longer.truncate(5)
    b = longer.propose(5, 5, 4)
    assert np.abs(a["logits"] - b["logits"]).max() < 1e-12  # equal up to BLAS blocking
    assert not np.allclose(a["hidden"], DraftRef(dw, rcfg, tw, tcfg).propose(5, 5, 4)["hidden"])


# ------------------------------------------------------------------------------------------------
# draft: Markov heads and confidence, against a torch transcription of the formulas


def _torch_markov(dw, c: DraftConfig, base: np.ndarray, hidden: np.ndarray, anchor: int):
    """Spec §2.4 + this project's gated / rnn definitions, transcribed."""
    W = {k: _t(v) for k, v in dw.items() if k != "d2t"}
    base, hidden = _t(base), _t(hidden)
    B, V = base.shape
    d2t = torch.as_tensor(np.asarray(dw["d2t"])) if "d2t" in dw else torch.arange(V)
    out = base.clone()
    conf = torch.full((B,), float("nan"), dtype=torch.float64)
    R = W["markov_w1.weight"].shape[1]
    s = torch.zeros(R, dtype=torch.float64)
    prev = anchor
    start = 0 if c.sample_from_anchor else 1
    for i in range(start, B):
        e = W["markov_w1.weight"][prev]
        h = hidden[i]
        if c.markov_head_type == "vanilla":
            r = e
        elif c.markov_head_type == "gated":
            r = torch.sigmoid(W["markov_gate.weight"] @ torch.cat([h, e]) + W["markov_gate.bias"]) * e
        else:
            gt, cand, o = (W["markov_joint.weight"] @ torch.cat([s, e, h]) + W["markov_joint.bias"]).chunk(3)
            s = torch.sigmoid(gt) * s + (1 - torch.sigmoid(gt)) * torch.tanh(cand)
            r = torch.tanh(o)
        bias = (W["markov_w2.weight"] @ r) * (W["markov_w2.scale"][0] if "markov_w2.scale" in W else 1.0)
        out[i, d2t] += bias
        if "conf_proj.weight" in W:
            conf[i] = torch.sigmoid(W["conf_proj.weight"][0] @ torch.cat([h, e]) + W["conf_proj.bias"][0])
        prev = int(out[i].argmax())
    return out.numpy(), out.argmax(-1).numpy(), conf.numpy()


@needs_torch
@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("anchor_first", [True, False])
@pytest.mark.parametrize("reduced_vocab", [False, True])
def test_markov_heads_match_torch(head: str, anchor_first: bool, reduced_vocab: bool, tmp_path: Path) -> None:
    dcfg = DraftConfig(markov_head_type=head, sample_from_anchor=anchor_first, block_size=6, markov_rank=8,
                       draft_vocab=60 if reduced_vocab else None, own_head=reduced_vocab,
                       markov_w2_scale=reduced_vocab)
    tcfg, tw, dw, rcfg = _draft_setup(tmp_path, dcfg)
    ref = DraftRef(dw, dcfg, tw, tcfg)
    feats = np.random.default_rng(6).standard_normal((4, len(rcfg.target_layers) * tcfg.n_embd))
    ref.inject(feats, np.arange(4))
    anchor = 77 if not reduced_vocab else int(dw["d2t"][3])
    out = ref.propose(anchor, 4, 6)

    logits, tokens, conf = _torch_markov(dw, rcfg, out["base_logits"], out["hidden"], anchor)
    finite = np.isfinite(logits)
    assert np.array_equal(finite, np.isfinite(out["logits"]))
    assert np.abs(out["logits"][finite] - logits[finite]).max() < 1e-9
    assert np.array_equal(out["tokens"], tokens)
    assert np.allclose(out["confidence"], conf, atol=1e-12, equal_nan=True)
    assert np.isnan(out["confidence"][0]) == (not anchor_first)
    assert not np.array_equal(out["logits"][1:], out["base_logits"][1:])   # the bias is not a no-op
    if not anchor_first:
        assert np.array_equal(out["logits"][0], out["base_logits"][0])     # bonus slot passes through


def test_markov_head_skipped_when_block_exceeds_block_size(tmp_path: Path) -> None:
    tcfg, tw, dw, rcfg = _draft_setup(tmp_path, DraftConfig(block_size=3))
    out = DraftRef(dw, rcfg, tw, tcfg).propose(9, 0, 4)
    assert out["confidence"] is None and np.array_equal(out["logits"], out["base_logits"])


# ------------------------------------------------------------------------------------------------
# tiny.py: files read back with the gguf package


def _fields(path: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(metadata fields by key, tensor infos by name) of a GGUF file."""
    reader = gguf.GGUFReader(str(path))
    return dict(reader.fields), {t.name: t for t in reader.tensors}


def _value(field) -> object:
    return field.contents()


@pytest.mark.parametrize("arch,dtype", [("qwen3", "f32"), ("qwen3", "q8_0"), ("llama", "f16"),
                                        ("qwen2", "bf16"), ("qwen3", "q4_0")])
def test_target_gguf_reads_back(arch: str, dtype: str, tmp_path: Path) -> None:
    cfg = TargetConfig(arch=arch, dtype=dtype, rope_scaling=("yarn", 4.0, 512) if arch == "qwen3" else None,
                       rope_freqs=arch == "llama")
    path = tmp_path / "t.gguf"
    w = write_target(path, cfg, seed=2)
    fields, tensors = _fields(path)
    T = gguf.GGUFValueType
    expect = {"general.architecture": (arch, T.STRING), f"{arch}.block_count": (2, T.UINT32),
              f"{arch}.context_length": (2048, T.UINT32), f"{arch}.embedding_length": (64, T.UINT32),
              f"{arch}.feed_forward_length": (128, T.UINT32), f"{arch}.attention.head_count": (4, T.UINT32),
              f"{arch}.attention.head_count_kv": (2, T.UINT32),
              f"{arch}.attention.key_length": (16, T.UINT32),
              f"{arch}.attention.value_length": (16, T.UINT32),
              f"{arch}.rope.freq_base": (10000.0, T.FLOAT32),
              f"{arch}.attention.layer_norm_rms_epsilon": (pytest.approx(1e-6), T.FLOAT32)}
    if arch == "qwen3":
        expect.update({f"{arch}.rope.scaling.type": ("yarn", T.STRING),
                       f"{arch}.rope.scaling.factor": (4.0, T.FLOAT32),
                       f"{arch}.rope.scaling.original_context_length": (512, T.UINT32)})
    for key, (value, vtype) in expect.items():
        assert _value(fields[key]) == value, key
        assert fields[key].types[0] == vtype, key

    assert set(tensors) == set(w)
    assert ("attn_q_norm.weight" in " ".join(w)) == (arch == "qwen3")
    assert ("blk.0.attn_q.bias" in w) == (arch == "qwen2")
    assert list(tensors["blk.0.attn_q.weight"].shape) == [64, 64]      # ggml ne = {in, out}
    assert list(tensors["token_embd.weight"].shape) == [64, 320]
    assert w["token_embd.weight"].shape == (320, 64)                    # numpy = ne reversed
    matrix_type = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0"}[dtype]
    assert tensors["blk.1.ffn_down.weight"].tensor_type.name == matrix_type
    assert tensors["output_norm.weight"].tensor_type.name == "F32"
    back = read_gguf_weights(path)
    for name, values in w.items():
        assert np.array_equal(back[name], values), name
    if arch == "llama":
        assert tensors["rope_freqs.weight"].tensor_type.name == "F32"
        assert list(tensors["rope_freqs.weight"].shape) == [8]
        assert set(np.unique(w["rope_freqs.weight"])) >= {1.0, 8.0}


def test_quantized_weights_are_close_to_their_source(tmp_path: Path) -> None:
    """Same seed, same draws: q8_0 / f16 weights are the f32 ones up to rounding."""
    f32 = write_target(tmp_path / "a.gguf", TargetConfig(dtype="f32"), seed=4)
    for dtype, tol in (("f16", 1e-3), ("q8_0", 0.02)):
        q = write_target(tmp_path / f"{dtype}.gguf", TargetConfig(dtype=dtype), seed=4)
        err = max(np.abs(q[k] - f32[k]).max() for k in f32)
        assert 0 < err < tol, dtype


def test_k_quants_are_written_by_ggml_and_read_back_exactly(tmp_path: Path) -> None:
    """K-quants go through ggml's kernels (gguf 0.19 cannot quantize them); gguf-py reads them back."""
    f32 = write_target(tmp_path / "a.gguf", TargetConfig(dtype="f32", n_embd=256, head_dim=64), seed=0)
    for dtype, tol in (("q4_k", 0.2), ("q6_k", 0.05)):
        w = write_target(tmp_path / "k.gguf", TargetConfig(dtype=dtype, n_embd=256, head_dim=64), seed=0)
        back = read_gguf_weights(tmp_path / "k.gguf")
        assert all(np.array_equal(back[k], w[k]) for k in w)
        err = max(np.abs(w[k] - f32[k]).max() / (np.abs(f32[k]).max() + 1e-9) for k in f32 if f32[k].ndim == 2)
        assert 0 < err < tol, dtype
    with pytest.raises(ValueError):
        write_target(tmp_path / "x.gguf", TargetConfig(dtype="q3_x"))


def test_draft_gguf_keys_and_tensors(tmp_path: Path) -> None:
    tcfg = TargetConfig(n_layer=4)
    dcfg = DraftConfig(markov_head_type="rnn", markov_rank=8, draft_vocab=50, own_head=True, shared_kv=True,
                       post_norms=True, layer_output_scale=True, causal=False, fc_scale=True,
                       markov_w2_scale=True, sliding_window=8, sliding_window_pattern=[True],
                       hidden_activation="gelu_pytorch_tanh", embedding_scale=8.0, attention_scale=1.0,
                       value_scale=0.5, sample_from_anchor=False, block_size=7, dtype="q8_0")
    path = tmp_path / "d.gguf"
    w = write_draft(path, dcfg, tcfg, seed=3)
    fields, tensors = _fields(path)
    T = gguf.GGUFValueType
    rcfg = dcfg.resolve(tcfg)
    expect = {"general.architecture": ("dflash", T.STRING), "dflash.block_size": (7, T.UINT32),
              "dflash.target_layers": (rcfg.target_layers, T.ARRAY),
              "dflash.sample_from_anchor": (False, T.BOOL),
              "dflash.has_confidence_head": (True, T.BOOL), "dflash.markov_head_type": ("rnn", T.STRING),
              "dflash.attention.causal": (False, T.BOOL),
              "dflash.hidden_activation": ("gelu_pytorch_tanh", T.STRING),
              "dflash.embedding_scale": (8.0, T.FLOAT32), "dflash.attention.scale": (1.0, T.FLOAT32),
              "dflash.attention.value_scale": (0.5, T.FLOAT32),
              "dflash.attention.sliding_window": (8, T.UINT32),
              "dflash.attention.sliding_window_pattern": ([True], T.ARRAY),
              "tokenizer.ggml.mask_token_id": (special_token_ids(320)[MASK_TOKEN], T.UINT32),
              "dflash.embedding_length": (64, T.UINT32), "dflash.block_count": (1, T.UINT32),
              "dflash.attention.layer_norm_rms_epsilon": (pytest.approx(1e-6), T.FLOAT32)}
    for key, (value, vtype) in expect.items():
        assert _value(fields[key]) == value, key
        assert fields[key].types[0] == vtype, key
    assert fields["dflash.target_layers"].types[1] == T.INT32
    assert fields["dflash.attention.sliding_window_pattern"].types[1] == T.BOOL
    assert rcfg.target_layers == [1, 2, 3]

    E, R, V, Vd = 64, 8, 320, 50
    ne = {n: list(t.shape) for n, t in tensors.items()}
    assert ne["markov_w1.weight"] == [R, V] and ne["markov_w2.weight"] == [R, Vd]
    assert ne["markov_joint.weight"] == [2 * R + E, 3 * R] and ne["markov_joint.bias"] == [3 * R]
    assert ne["conf_proj.weight"] == [E + R, 1] and ne["conf_proj.bias"] == [1]
    assert ne["output.weight"] == [E, Vd] and ne["fc.weight"] == [3 * E, E] and ne["fc.scale"] == [1]
    assert ne["blk.0.layer_output_scale.weight"] == [1] and ne["markov_w2.scale"] == [1]
    assert "blk.0.attn_v.weight" not in tensors and "token_embd.weight" not in tensors
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"} <= set(tensors)
    assert tensors["d2t"].tensor_type.name == "I64" and ne["d2t"] == [Vd]
    d2t = w["d2t"]
    assert d2t.dtype == np.int64 and np.all(np.diff(d2t) > 0) and 0 <= d2t.min() and d2t.max() < V
    assert tensors["fc.weight"].tensor_type.name == "Q8_0"
    assert tensors["conf_proj.weight"].tensor_type.name == "F16"    # 72 columns: no q8_0 blocks
    back = read_gguf_weights(path)
    assert all(np.array_equal(back[k], w[k]) for k in w)


@pytest.mark.parametrize("head", ["gated", "vanilla"])
def test_draft_gguf_markov_variants(head: str, tmp_path: Path) -> None:
    path = tmp_path / "d.gguf"
    dcfg = DraftConfig(markov_head_type=head, confidence_head=False, markov_rank=4)
    write_draft(path, dcfg, TargetConfig(), seed=0)
    fields, tensors = _fields(path)
    assert _value(fields["dflash.markov_head_type"]) == head
    assert _value(fields["dflash.has_confidence_head"]) is False
    assert "conf_proj.weight" not in tensors and "markov_joint.weight" not in tensors
    assert ("markov_gate.weight" in tensors) == (head == "gated")
    if head == "gated":
        assert list(tensors["markov_gate.weight"].shape) == [64 + 4, 4]
        assert list(tensors["markov_gate.bias"].shape) == [4]


def test_dflash_gguf_has_no_dspark_parts(tmp_path: Path) -> None:
    path = tmp_path / "d.gguf"
    write_draft(path, DraftConfig(kind="dflash"), TargetConfig(), seed=0)
    fields, tensors = _fields(path)
    assert not any(n.startswith(("markov", "conf_proj")) for n in tensors)
    assert "dflash.markov_head_type" not in fields and "dflash.sample_from_anchor" not in fields
    assert "tokenizer.ggml.mask_token_id" in fields and "dflash.target_layers" in fields


def test_tokenizer_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    write_target(path, TargetConfig(n_vocab=400), seed=0)
    fields, _ = _fields(path)
    tokens = _value(fields["tokenizer.ggml.tokens"])
    types = _value(fields["tokenizer.ggml.token_type"])
    merges = _value(fields["tokenizer.ggml.merges"])
    assert len(tokens) == len(types) == 400 and len(set(tokens)) == 400
    assert _value(fields["tokenizer.ggml.model"]) == "gpt2"
    assert len(merges) > 20
    vocab = set(tokens)
    for m in merges:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab, m
    ids = special_token_ids(400)
    assert tokens[ids["<|im_end|>"]] == "<|im_end|>" and tokens[ids[MASK_TOKEN]] == MASK_TOKEN
    assert types[ids[MASK_TOKEN]] == gguf.TokenType.CONTROL and types[0] == gguf.TokenType.NORMAL
    assert _value(fields["tokenizer.ggml.eos_token_id"]) == ids["<|endoftext|>"]
    assert _value(fields["tokenizer.ggml.eot_token_id"]) == ids["<|im_end|>"]
    assert tokens[ord("a")] == "a" and tokens[ord(" ")] == "\u0120"  # GPT-2 byte symbols
    jinja2 = pytest.importorskip("jinja2")
    text = jinja2.Template(_value(fields["tokenizer.chat_template"])).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_skipped_when_vocab_too_small(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    write_target(path, TargetConfig(n_vocab=256), seed=0)
    fields, _ = _fields(path)
    assert not any(k.startswith("tokenizer.") for k in fields)


def test_writing_is_seeded_per_tensor(tmp_path: Path) -> None:
    a = write_target(tmp_path / "a.gguf", TargetConfig(), seed=7)
    write_target(tmp_path / "b.gguf", TargetConfig(), seed=7)
    c = write_target(tmp_path / "c.gguf", TargetConfig(), seed=8)
    d = write_target(tmp_path / "d.gguf", TargetConfig(rope_freqs=True), seed=7)  # one more tensor
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert not np.array_equal(a["blk.0.attn_q.weight"], c["blk.0.attn_q.weight"])
    assert all(np.array_equal(a[k], d[k]) for k in a)
    assert write_target(tmp_path / "e.gguf", TargetConfig(), seed=7, return_weights=False) == {}
    assert (tmp_path / "e.gguf").read_bytes() == (tmp_path / "a.gguf").read_bytes()


def test_invalid_configs_raise(tmp_path: Path) -> None:
    bad_targets = [TargetConfig(arch="gpt2"), TargetConfig(n_head=4, n_head_kv=3), TargetConfig(head_dim=15),
                   TargetConfig(rope_scaling=("yarn", 4.0))]
    for cfg in bad_targets:
        with pytest.raises(ValueError):
            write_target(tmp_path / "t.gguf", cfg)
    t = TargetConfig()
    bad_drafts = [DraftConfig(kind="eagle"), DraftConfig(markov_head_type="lstm"),
                  DraftConfig(kind="dflash", confidence_head=True), DraftConfig(draft_vocab=50),
                  DraftConfig(target_layers=[5]),
                  DraftConfig(sliding_window=4, sliding_window_pattern=[True, True]),
                  DraftConfig(hidden_activation="relu"), DraftConfig(markov_rank=0)]
    for dcfg in bad_drafts:
        with pytest.raises(ValueError):
            write_draft(tmp_path / "d.gguf", dcfg, t)
