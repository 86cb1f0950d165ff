"""Converter behaviour on tiny random checkpoints: data fidelity, draft semantics, refusals,
atomic output, CLI.

Expected values come from the checkpoints themselves (read with safetensors/torch, not with the
converter's reader) and from the fixture parameters; GGUF files are read with gguf's reader.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize
from safetensors.torch import load_file, save_file

import hf_checkpoints as hf
from dspark_ggml.convert import ConversionError, convert
from dspark_ggml.convert import cli as convert_cli
from dspark_ggml.convert import writer as convert_writer

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# helpers


class Gguf:
    def __init__(self, path: Path):
        self.reader = GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}

    def kv(self, key: str):
        field = self.reader.fields.get(key)
        if field is None:
            return None
        value = field.contents()
        return list(value) if field.types[0] == GGUFValueType.ARRAY else value

    def kv_type(self, key: str) -> GGUFValueType:
        return GGUFValueType(self.reader.fields[key].types[-1])

    def ne(self, name: str) -> list[int]:  # ggml order, fastest dimension first
        return [int(x) for x in self.tensors[name].shape]

    def qtype(self, name: str) -> Q:
        return Q(self.tensors[name].tensor_type)

    def f32(self, name: str) -> np.ndarray:
        """The tensor as float32 in PyTorch order."""
        t = self.tensors[name]
        data = np.asarray(t.data)
        qtype = Q(t.tensor_type)
        if qtype == Q.F32:
            values = data.astype(np.float32)
        elif qtype == Q.F16:
            values = data.view(np.float16).astype(np.float32)
        else:
            values = dequantize(data.view(np.uint8), qtype)
        return values.reshape(list(reversed(self.ne(name))))


def hf_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def hf_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


def rewrite_tensors(model_dir: Path, edit) -> None:
    tensors = hf_tensors(model_dir)
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})


def run_convert(src: Path, out: Path, **kw) -> Gguf:
    convert(src, out, progress=False, **kw)
    return Gguf(out)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    base = hf.make_base_checkpoints(root)
    qwen3 = base["qwen3"]
    return {
        **base,
        "deepspec_gated": hf.make_deepspec_dspark(root / "deepspec_gated", qwen3, head_type="gated"),
        "deepspec_rnn": hf.make_deepspec_dspark(root / "deepspec_rnn", qwen3, head_type="rnn"),
        "spec_reduced": hf.make_speculators_dspark(root / "spec_reduced", qwen3,
                                                   draft_vocab_size=96),
        "specforge_legacy": hf.make_specforge_dspark(root / "specforge_legacy", qwen3,
                                                     head_type="gated", legacy_keys=True),
        "zlab": hf.make_zlab_dflash(root / "zlab", qwen3),
    }


def copy_model(models, key: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(models[key], tmp_path / key))


# ----------------------------------------------------------------------------------------------
# targets: data fidelity


QWEN3_NAMES = {  # independent of the converter's table: HF name -> GGUF name
    "model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
    "model.norm.weight": "output_norm.weight",
}
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name_for(hf_name: str) -> str:
    if hf_name in QWEN3_NAMES:
        return QWEN3_NAMES[hf_name]
    _, _, layer, *module, kind = hf_name.split(".")
    return f"blk.{layer}.{LAYER_NAMES['.'.join(module)]}.{kind}"


def test_qwen3_f32_holds_the_exact_checkpoint_values(models, tmp_path):
    g = run_convert(models["qwen3"], tmp_path / "q.gguf", outtype="f32")
    src = hf_tensors(models["qwen3"])
    assert set(g.tensors) == {gguf_name_for(n) for n in src}
    for name, tensor in src.items():
        gname = gguf_name_for(name)
        assert g.ne(gname) == list(reversed(tensor.shape))
        assert g.qtype(gname) == Q.F32
        np.testing.assert_array_equal(g.f32(gname), to_np(tensor), err_msg=gname)
    assert g.kv("general.architecture") == "qwen3"
    assert g.kv("qwen3.block_count") == hf.DEFAULT_SHAPE.num_hidden_layers
    assert g.kv("qwen3.rope.freq_base") == 1e6
    assert g.kv("general.file_type") == 0


def test_bf16_output_keeps_bf16_bits(models, tmp_path):
    g = run_convert(models["qwen3"], tmp_path / "q.gguf", outtype="bf16")
    for name, tensor in hf_tensors(models["qwen3"]).items():
        gname = gguf_name_for(name)
        if tensor.dim() == 1:
            assert g.qtype(gname) == Q.F32
            continue
        assert g.qtype(gname) == Q.BF16
        stored = np.asarray(g.tensors[gname].data).view(np.uint16).reshape(tensor.shape)
        np.testing.assert_array_equal(stored, tensor.view(torch.int16).numpy().view(np.uint16))


def test_q8_0_quantizes_matrices_and_keeps_norms_and_biases_f32(models, tmp_path):
    g = run_convert(models["qwen2"], tmp_path / "q.gguf", outtype="q8_0")
    src = hf_tensors(models["qwen2"])
    assert "output.weight" not in g.tensors  # tied embeddings: nothing to write
    for name, tensor in src.items():
        gname = gguf_name_for(name)
        expected = Q.F32 if tensor.dim() == 1 else Q.Q8_0
        assert g.qtype(gname) == expected, gname
        ref = to_np(tensor)
        # q8_0: one scale per 32 values, error about half a step (the scale itself is f16)
        tol = 0 if expected == Q.F32 else np.abs(ref).max() / 127 * 0.6
        assert np.abs(g.f32(gname) - ref).max() <= tol, gname
    assert g.kv("general.file_type") == 7


def test_runtime_only_types_encode_but_are_not_offered(models, tmp_path):
    """The block types only llama-quantize makes (the tiny test models use them) encode through
    the converter's encoder, K-quants with ggml's kernels, but the CLI does not offer them."""
    from dspark_ggml.convert.quant import OUTTYPE_CHOICES, RUNTIME_OUT_TYPES, encode, encoded_nbytes
    from dspark_ggml.quant import dequantize

    rows = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    for name in ("q4_0", "q5_1", "q4_k", "q6_k"):
        qtype = RUNTIME_OUT_TYPES[name].matrix_type
        data = encode(rows, qtype)
        assert data.nbytes == encoded_nbytes(rows.shape, qtype), name
        back = dequantize(data, name, rows.shape)
        assert 0 < np.abs(back - rows).max() < 0.3 * np.abs(rows).max(), name
    assert set(RUNTIME_OUT_TYPES) > set(OUTTYPE_CHOICES) - {"auto"}
    assert not {"q4_0", "q4_k"} & set(OUTTYPE_CHOICES)
    with pytest.raises(ConversionError, match="unknown --outtype"):
        convert(models["qwen2"], tmp_path / "x.gguf", outtype="q4_k")


def test_llama_q_and_k_rows_are_interleaved_per_head(models, tmp_path):
    g = run_convert(models["llama"], tmp_path / "l.gguf", outtype="f32")
    src = hf_tensors(models["llama"])
    cfg = hf_config(models["llama"])
    d = cfg["head_dim"]
    for proj, heads in (("q", cfg["num_attention_heads"]), ("k", cfg["num_key_value_heads"])):
        hf_w = to_np(src[f"model.layers.1.self_attn.{proj}_proj.weight"])
        got = g.f32(f"blk.1.attn_{proj}.weight")
        for h in range(heads):
            for j in range(d // 2):
                for half in range(2):
                    np.testing.assert_array_equal(got[h * d + 2 * j + half],
                                                  hf_w[h * d + half * d // 2 + j])
    v = g.f32("blk.1.attn_v.weight")
    np.testing.assert_array_equal(v, to_np(src["model.layers.1.self_attn.v_proj.weight"]))
    assert g.kv("llama.rope.dimension_count") == d
    assert g.kv("llama.vocab_size") == cfg["vocab_size"]


def test_llama3_rope_factors(models, tmp_path):
    g = run_convert(models["llama"], tmp_path / "l.gguf", outtype="f16")
    cfg = hf_config(models["llama"])
    rs, dim = cfg["rope_scaling"], cfg["head_dim"]
    freqs = 1.0 / cfg["rope_theta"] ** (np.arange(0, dim, 2) / dim)
    wavelen = 2 * np.pi / freqs
    smooth = (rs["original_max_position_embeddings"] / wavelen - rs["low_freq_factor"]) / (
        rs["high_freq_factor"] - rs["low_freq_factor"])
    expected = np.where(wavelen < rs["original_max_position_embeddings"] / rs["high_freq_factor"], 1.0,
                        np.where(wavelen > rs["original_max_position_embeddings"] / rs["low_freq_factor"],
                                 rs["factor"], 1 / ((1 - smooth) / rs["factor"] + smooth)))
    assert g.qtype("rope_freqs.weight") == Q.F32
    np.testing.assert_allclose(g.f32("rope_freqs.weight"), expected, rtol=1e-6)
    assert len(set(np.round(expected, 3))) >= 3  # the fixture exercises all three regimes


def test_small_blocks_give_identical_files(models, tmp_path, monkeypatch):
    """Streaming splits tensors into row blocks; the bytes must not depend on the block size."""
    for key, kw in (("llama", {}), ("spec_reduced", {"target_model_dir": models["qwen3"]})):
        whole = tmp_path / f"{key}_whole.gguf"
        convert(models[key], whole, outtype="q8_0", progress=False, **kw)
        monkeypatch.setattr(convert_writer, "BLOCK_BYTES", 300)  # about one row per block
        split = tmp_path / f"{key}_split.gguf"
        convert(models[key], split, outtype="q8_0", progress=False, **kw)
        monkeypatch.undo()
        assert whole.read_bytes() == split.read_bytes(), key


# ----------------------------------------------------------------------------------------------
# tokenizer metadata


def test_tokenizer_metadata(models, tmp_path):
    from tokenizers import Tokenizer
    g = run_convert(models["qwen3"], tmp_path / "q.gguf")
    tok = Tokenizer.from_file(str(models["qwen3"] / "tokenizer.json"))
    cfg = hf_config(models["qwen3"])
    tokens, types = g.kv("tokenizer.ggml.tokens"), g.kv("tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == cfg["vocab_size"]
    n = tok.get_vocab_size()
    assert tokens[:n] == [tok.id_to_token(i) for i in range(n)]
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, cfg["vocab_size"])]
    assert set(types[n:]) == {5}  # UNUSED
    assert types[tok.token_to_id("<|im_end|>")] == 3  # special -> CONTROL
    assert types[tok.token_to_id("<think>")] == 4  # added, not special -> USER_DEFINED
    assert types[tok.token_to_id("the")] == 1
    assert g.kv("tokenizer.ggml.model") == "gpt2"
    assert g.kv("tokenizer.ggml.pre") == "qwen2"
    merges = json.loads((models["qwen3"] / "tokenizer.json").read_text())["model"]["merges"]
    assert g.kv("tokenizer.ggml.merges") == [" ".join(m) if isinstance(m, list) else m for m in merges]
    assert g.kv("tokenizer.ggml.eos_token_id") == tok.token_to_id("<|im_end|>")
    assert g.kv("tokenizer.ggml.padding_token_id") == tok.token_to_id("<|endoftext|>")
    assert g.kv("tokenizer.ggml.bos_token_id") == cfg["bos_token_id"]  # from config.json
    assert g.kv("tokenizer.ggml.add_bos_token") is False
    assert g.kv("tokenizer.chat_template") == hf.QWEN_CHAT_TEMPLATE


def test_llama_tokenizer_adds_bos(models, tmp_path):
    g = run_convert(models["llama"], tmp_path / "l.gguf")
    assert g.kv("tokenizer.ggml.pre") == "llama-bpe"
    assert g.kv("tokenizer.ggml.add_bos_token") is True
    assert g.kv("tokenizer.ggml.add_eos_token") is False


def test_chat_template_file_and_pre_override(models, tmp_path):
    src = copy_model(models, "qwen3", tmp_path)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    (src / "chat_template.jinja").write_text("{{ messages }}")
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    (src / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ConversionError, match="--tokenizer-pre"):
        convert(src, tmp_path / "a.gguf", progress=False)
    g = run_convert(src, tmp_path / "b.gguf", tokenizer_pre="qwen2")
    assert g.kv("tokenizer.ggml.pre") == "qwen2"
    assert g.kv("tokenizer.chat_template") == "{{ messages }}"


# ----------------------------------------------------------------------------------------------
# drafts


def test_deepspec_draft(models, tmp_path):
    g = run_convert(models["deepspec"], tmp_path / "d.gguf", target_model_dir=models["qwen3"])
    cfg = hf_config(models["deepspec"])
    src = hf_tensors(models["deepspec"])
    assert g.kv("general.architecture") == "dflash"
    assert g.kv("dflash.target_layers") == [i + 1 for i in cfg["target_layer_ids"]]
    assert g.kv_type("dflash.target_layers") == GGUFValueType.INT32
    assert g.kv("dflash.block_size") == cfg["block_size"]
    assert g.kv("tokenizer.ggml.mask_token_id") == cfg["mask_token_id"]
    assert g.kv("dflash.sample_from_anchor") is True
    assert g.kv("dflash.has_confidence_head") is True
    assert g.kv("dflash.markov_head_type") == "vanilla"
    assert g.kv("dflash.markov_rank") is None  # the rank is the tensor's
    # the embedding and head are the target's copies: shared at runtime, not duplicated
    assert "token_embd.weight" not in g.tensors and "output.weight" not in g.tensors
    np.testing.assert_array_equal(g.f32("markov_w1.weight").astype(np.float16),
                                  to_np(src["markov_head.markov_w1.weight"]).astype(np.float16))
    assert g.ne("fc.weight") == [2 * cfg["hidden_size"], cfg["hidden_size"]]
    assert g.ne("conf_proj.weight") == [cfg["hidden_size"] + cfg["markov_rank"], 1]
    target = run_convert(models["qwen3"], tmp_path / "t.gguf")
    assert g.kv("tokenizer.ggml.tokens") == target.kv("tokenizer.ggml.tokens")


@pytest.mark.parametrize("key,kind,extra", [
    ("deepspec_gated", "gated", ("markov_gate", lambda d, r: [d + r, r], lambda d, r: [r])),
    ("deepspec_rnn", "rnn", ("markov_joint", lambda d, r: [2 * r + d, 3 * r], lambda d, r: [3 * r])),
])
def test_gated_and_rnn_markov_heads(models, tmp_path, key, kind, extra):
    g = run_convert(models[key], tmp_path / "d.gguf", target_model_dir=models["qwen3"],
                    outtype="f32")
    cfg, src = hf_config(models[key]), hf_tensors(models[key])
    d, r = cfg["hidden_size"], cfg["markov_rank"]
    prefix, weight_ne, bias_ne = extra
    hf_prefix = "markov_head.gate_proj" if kind == "gated" else "markov_head.joint_proj"
    assert g.kv("dflash.markov_head_type") == kind
    assert g.ne(f"{prefix}.weight") == weight_ne(d, r)
    assert g.ne(f"{prefix}.bias") == bias_ne(d, r)
    assert g.qtype(f"{prefix}.bias") == Q.F32
    np.testing.assert_array_equal(g.f32(f"{prefix}.weight"), to_np(src[f"{hf_prefix}.weight"]))
    np.testing.assert_array_equal(g.f32(f"{prefix}.bias"), to_np(src[f"{hf_prefix}.bias"]))


def test_speculators_reduced_vocab(models, tmp_path):
    g = run_convert(models["spec_reduced"], tmp_path / "s.gguf", target_model_dir=models["qwen3"],
                    outtype="f32")
    src, cfg = hf_tensors(models["spec_reduced"]), hf_config(models["spec_reduced"])
    n_draft, n_vocab, d = cfg["draft_vocab_size"], cfg["transformer_layer_config"]["vocab_size"], 64
    assert g.qtype("d2t") == Q.I64
    np.testing.assert_array_equal(np.asarray(g.tensors["d2t"].data),
                                  torch.nonzero(src["t2d"]).flatten().numpy())
    assert "t2d" not in g.tensors
    # the reduced head is the draft's own, never the target's
    assert g.ne("output.weight") == [d, n_draft]
    np.testing.assert_array_equal(g.f32("output.weight"), to_np(src["lm_head.weight"]))
    assert g.ne("markov_w1.weight") == [cfg["markov_rank"], n_vocab]
    assert g.ne("markov_w2.weight") == [cfg["markov_rank"], n_draft]
    assert "token_embd.weight" not in g.tensors  # equal to the target's
    assert g.kv("dflash.target_layers") == cfg["aux_hidden_state_layer_ids"]  # already GGUF numbering
    assert g.kv("dflash.sample_from_anchor") is True


def test_speculators_anchor_layout_and_sliding_window(tmp_path, models):
    src = hf.make_speculators_dspark(tmp_path / "s", models["qwen3"], sample_from_anchor=False,
                                     sliding_window=32)
    g = run_convert(src, tmp_path / "s.gguf", target_model_dir=models["qwen3"])
    assert g.kv("dflash.sample_from_anchor") is False
    assert g.kv("dflash.attention.sliding_window") == 32
    assert g.kv("dflash.attention.sliding_window_pattern") == [True, True]
    assert g.kv("dflash.attention.causal") is True  # speculators' sliding layers are causal


def test_speculators_confidence_temperatures(tmp_path, models):
    """DSpark's calibrated per-slot temperatures (the training recipe's export) become
    dflash.confidence_temperatures; a list of the wrong length is refused."""
    src = hf.make_speculators_dspark(tmp_path / "s", models["qwen3"])
    slots = hf_config(src)["block_size"]  # anchor-first: every slot predicts
    temps = [1.0 + 0.25 * j for j in range(slots)]
    hf.edit_config(src, confidence_temperatures=temps)
    g = run_convert(src, tmp_path / "s.gguf", target_model_dir=models["qwen3"])
    assert g.kv("dflash.confidence_temperatures") == pytest.approx(temps)
    assert g.kv_type("dflash.confidence_temperatures") == GGUFValueType.FLOAT32
    hf.edit_config(src, confidence_temperatures=temps[:-1])
    with pytest.raises(ConversionError, match="confidence_temperatures must be"):
        run_convert(src, tmp_path / "bad.gguf", target_model_dir=models["qwen3"])


def test_specforge_legacy_keys_and_flag(models, tmp_path):
    g = run_convert(models["specforge_legacy"], tmp_path / "f.gguf",
                    target_model_dir=models["qwen3"], sample_from_anchor=False)
    assert g.kv("dflash.sample_from_anchor") is False
    assert g.kv("dflash.markov_head_type") == "gated"
    assert {"markov_w1.weight", "markov_gate.weight", "conf_proj.weight"} <= set(g.tensors)
    assert "token_embd.weight" not in g.tensors and "output.weight" not in g.tensors


def test_zlab_dflash(models, tmp_path):
    g = run_convert(models["zlab"], tmp_path / "z.gguf", target_model_dir=models["qwen3"])
    assert g.kv("dflash.sample_from_anchor") is False
    assert g.kv("dflash.has_confidence_head") is False
    assert g.kv("dflash.markov_head_type") is None
    assert g.kv("dflash.block_size") == 16
    assert not any(n.startswith(("markov", "conf_proj", "token_embd", "output.")) for n in g.tensors)


def test_retrained_embedding_is_kept_with_an_explicit_head(models, tmp_path):
    src = copy_model(models, "deepspec", tmp_path)
    rewrite_tensors(src, lambda t: t["embed_tokens.weight"].add_(0.5))
    g = run_convert(src, tmp_path / "d.gguf", target_model_dir=models["qwen3"], outtype="f32")
    new = hf_tensors(src)
    np.testing.assert_array_equal(g.f32("token_embd.weight"), to_np(new["embed_tokens.weight"]))
    # without output.weight the runtime would use the retrained embedding as the head
    np.testing.assert_array_equal(g.f32("output.weight"), to_np(new["lm_head.weight"]))


def test_trained_full_vocab_head_is_kept(models, tmp_path):
    src = hf.make_speculators_dspark(tmp_path / "s", models["qwen3"])
    rewrite_tensors(src, lambda t: t["lm_head.weight"].mul_(2))
    g = run_convert(src, tmp_path / "s.gguf", target_model_dir=models["qwen3"], outtype="f32")
    np.testing.assert_array_equal(g.f32("output.weight"), to_np(hf_tensors(src)["lm_head.weight"]))
    assert "token_embd.weight" not in g.tensors


def test_embedding_without_head_gets_the_targets_head(models, tmp_path):
    src = copy_model(models, "deepspec", tmp_path)

    def edit(t):
        t["embed_tokens.weight"].add_(0.5)
        del t["lm_head.weight"]
    rewrite_tensors(src, edit)
    g = run_convert(src, tmp_path / "d.gguf", target_model_dir=models["qwen3"], outtype="f32")
    target = hf_tensors(models["qwen3"])
    np.testing.assert_array_equal(g.f32("output.weight"), to_np(target["lm_head.weight"]))


def test_identity_d2t_is_dropped(models, tmp_path):
    src = copy_model(models, "deepspec", tmp_path)
    rewrite_tensors(src, lambda t: t.update(d2t=torch.zeros(hf.DEFAULT_SHAPE.vocab_size,
                                                             dtype=torch.int64)))
    g = run_convert(src, tmp_path / "d.gguf", target_model_dir=models["qwen3"])
    assert "d2t" not in g.tensors and "output.weight" not in g.tensors


# ----------------------------------------------------------------------------------------------
# refusals: every ambiguity or inconsistency stops the conversion with a message naming the fix


def _edit_json(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def _specforge(tmp, qwen3):
    return hf.make_specforge_dspark(tmp / "m", qwen3)


def _spec_without_anchor(tmp, qwen3):
    return hf.make_speculators_dspark(tmp / "m", qwen3, sample_from_anchor=None)


def _spec_null_mask(tmp, qwen3):
    m = hf.make_speculators_dspark(tmp / "m", qwen3)
    hf.edit_config(m, mask_token_id=None)
    return m


def _deepspec_ids_off_by_one(tmp, qwen3):
    # [1, 3] read as layer outputs would need target layer 4 of 4: only valid the other way
    return hf.make_deepspec_dspark(tmp / "m", qwen3, target_layer_ids=(1, 3))


def _deepspec_two_lists(tmp, qwen3):
    m = hf.make_deepspec_dspark(tmp / "m", qwen3)  # target_layer_ids [0, 2]
    hf.edit_config(m, aux_hidden_state_layer_ids=[0, 2])
    return m


def _wrong_head_type(tmp, qwen3):
    m = hf.make_deepspec_dspark(tmp / "m", qwen3)
    hf.edit_config(m, markov_head_type="gated")
    return m


def _wrong_rank(tmp, qwen3):
    m = hf.make_deepspec_dspark(tmp / "m", qwen3)
    hf.edit_config(m, markov_rank=16)
    return m


def _wrong_target_depth(tmp, qwen3):
    m = hf.make_deepspec_dspark(tmp / "m", qwen3)
    hf.edit_config(m, num_target_layers=36)
    return m


def _missing_layer_tensor(tmp, qwen3):
    m = hf.make_zlab_dflash(tmp / "m", qwen3)
    rewrite_tensors(m, lambda t: t.pop("layers.1.self_attn.k_norm.weight"))
    return m


def _reduced_without_d2t(tmp, qwen3):
    m = hf.make_speculators_dspark(tmp / "m", qwen3, draft_vocab_size=96)
    rewrite_tensors(m, lambda t: (t.pop("d2t"), t.pop("t2d")))
    return m


def _duplicate_d2t(tmp, qwen3):
    m = hf.make_speculators_dspark(tmp / "m", qwen3, draft_vocab_size=96)
    rewrite_tensors(m, lambda t: t.update(d2t=torch.zeros(96, dtype=torch.int64) + 5
                                          - torch.arange(96) * (torch.arange(96) % 2)))
    return m


def _mixed_causal_layers(tmp, qwen3):
    m = hf.make_speculators_dspark(tmp / "m", qwen3, sliding_window=32)
    cfg = hf_config(m)
    cfg["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention"]
    (m / "config.json").write_text(json.dumps(cfg))
    return m


def _confidence_flag_without_head(tmp, qwen3):
    m = hf.make_deepspec_dspark(tmp / "m", qwen3, confidence_head=False)
    hf.edit_config(m, enable_confidence_head=True)
    return m


def _conflicting_anchor(tmp, qwen3):
    return hf.make_speculators_dspark(tmp / "m", qwen3, sample_from_anchor=True)


REFUSALS = [
    (_specforge, {}, "--sample-from-anchor"),
    (_spec_without_anchor, {}, "--sample-from-anchor"),
    (_conflicting_anchor, {"sample_from_anchor": False}, "sample_from_anchor=True"),
    (_spec_null_mask, {}, "--mask-token-id"),
    (_deepspec_ids_off_by_one, {}, "--target-layer-convention layer-input"),
    (_deepspec_two_lists, {}, "--target-layer-convention"),
    (_wrong_head_type, {}, "markov_head_type 'gated'"),
    (_wrong_rank, {}, "markov_rank 16"),
    (_wrong_target_depth, {}, "num_target_layers 36"),
    (_missing_layer_tensor, {}, "layers.1.self_attn.k_norm.weight"),
    (_reduced_without_d2t, {}, "no d2t"),
    (_duplicate_d2t, {}, "same target token"),
    (_mixed_causal_layers, {}, "single dflash.attention.causal"),
    (_confidence_flag_without_head, {}, "confidence head"),
]


@pytest.mark.parametrize("make,overrides,message", REFUSALS, ids=[r[0].__name__ for r in REFUSALS])
def test_refusals(models, tmp_path, make, overrides, message):
    src = make(tmp_path, models["qwen3"])
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match=re.escape(message)):
        convert(src, out, target_model_dir=models["qwen3"], progress=False, **overrides)
    assert not out.exists()


def test_flags_settle_what_was_refused(models, tmp_path):
    qwen3 = models["qwen3"]
    g = run_convert(_deepspec_ids_off_by_one(tmp_path / "a", qwen3), tmp_path / "a.gguf",
                    target_model_dir=qwen3, target_layer_convention="layer-input")
    assert g.kv("dflash.target_layers") == [1, 3]
    g = run_convert(_deepspec_two_lists(tmp_path / "b", qwen3), tmp_path / "b.gguf",
                    target_model_dir=qwen3, target_layer_convention="layer-input")
    assert g.kv("dflash.target_layers") == [0, 2]
    g = run_convert(_spec_null_mask(tmp_path / "c", qwen3), tmp_path / "c.gguf",
                    target_model_dir=qwen3, mask_token_id=7)
    assert g.kv("tokenizer.ggml.mask_token_id") == 7


def test_draft_needs_its_target(models, tmp_path):
    with pytest.raises(ConversionError, match="--target-model-dir"):
        convert(models["deepspec"], tmp_path / "x.gguf", progress=False)
    other = hf.make_qwen3_target(tmp_path / "other",
                                 shape=dataclasses.replace(hf.DEFAULT_SHAPE, vocab_size=352))
    with pytest.raises(ConversionError, match="vocab_size"):
        convert(models["deepspec"], tmp_path / "x.gguf", progress=False, target_model_dir=other)


def test_tied_target_with_a_different_stored_head_is_refused(models, tmp_path):
    src = copy_model(models, "qwen2", tmp_path)  # tie_word_embeddings: true
    rewrite_tensors(src, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] * 2}))
    with pytest.raises(ConversionError, match="tie_word_embeddings is true"):
        convert(src, tmp_path / "x.gguf", progress=False)
    rewrite_tensors(src, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    assert "output.weight" in run_convert(src, tmp_path / "y.gguf").tensors  # as llama.cpp


def test_unknown_tensor_in_target_is_refused(models, tmp_path):
    src = copy_model(models, "qwen3", tmp_path)
    rewrite_tensors(src, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2, 2)}))
    with pytest.raises(ConversionError, match="mlp.extra"):
        convert(src, tmp_path / "x.gguf", progress=False)


# ----------------------------------------------------------------------------------------------
# output file handling


def test_refuses_to_overwrite_without_force(models, tmp_path):
    out = tmp_path / "q.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(ConversionError, match="--force"):
        convert(models["qwen3"], out, progress=False)
    assert out.read_bytes() == b"keep me"
    convert(models["qwen3"], out, progress=False, force=True)
    assert out.read_bytes()[:4] == b"GGUF"


def test_failure_mid_write_leaves_no_partial_file(models, tmp_path, monkeypatch):
    out = tmp_path / "q.gguf"
    out.write_bytes(b"old")
    calls = []
    real_encode = convert_writer.encode

    def failing_encode(rows, qtype):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt  # like Ctrl-C in the middle of the data
        return real_encode(rows, qtype)

    monkeypatch.setattr(convert_writer, "encode", failing_encode)
    with pytest.raises(KeyboardInterrupt):
        convert(models["qwen3"], out, progress=False, force=True)
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.gguf"]


# ----------------------------------------------------------------------------------------------
# command line


def test_cli_run(models, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    out = tmp_path / "f.gguf"
    args = parser.parse_args([str(models["specforge_legacy"]), "-o", str(out), "--target-model-dir",
                              str(models["qwen3"]), "--no-progress"])
    assert convert_cli.run(args) == 1
    assert "--sample-from-anchor" in capsys.readouterr().err
    assert not out.exists()
    args = parser.parse_args([str(models["specforge_legacy"]), "-o", str(out), "--target-model-dir",
                              str(models["qwen3"]), "--no-progress", "--sample-from-anchor",
                              "false", "--outtype", "q8_0"])
    assert convert_cli.run(args) == 0
    g = Gguf(out)
    assert g.kv("dflash.sample_from_anchor") is False and g.kv("general.file_type") == 7


def test_python_dash_m(models, tmp_path):
    out = tmp_path / "q.gguf"
    env = {"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "dspark_ggml.convert", str(models["qwen2"]),
                           "-o", str(out), "--outtype", "bf16"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Gguf(out).kv("general.architecture") == "qwen2"


# ----------------------------------------------------------------------------------------------
# Gemma-4 and Qwen3-MoE targets, Gemma-4 drafts


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma4")
    models = {v: hf.make_gemma4_target(root / v, v) for v in hf.GEMMA4_VARIANTS}
    models["conditional"] = hf.make_gemma4_conditional_target(root / "conditional")
    models["deepspec"] = hf.make_gemma4_dspark(root / "deepspec", models["dense"])
    models["speculators"] = hf.make_gemma4_speculators_dspark(root / "speculators",
                                                              models["dense"])
    models["qwen3moe"] = hf.make_qwen3moe_target(root / "qwen3moe")
    return models


GEMMA4_LAYER_NAMES = {  # independent of the converter's table
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "per_layer_input_gate.weight": "inp_gate.weight", "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "router.proj.weight": "ffn_gate_inp.weight", "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight", "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
GEMMA4_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


def gemma4_name_for(hf_name: str, prefix: str = "model.") -> str:
    name = hf_name.removeprefix(prefix)
    if name in GEMMA4_GLOBAL_NAMES:
        return GEMMA4_GLOBAL_NAMES[name]
    _, layer, part = name.split(".", 2)
    return f"blk.{layer}.{GEMMA4_LAYER_NAMES[part]}"


@pytest.mark.parametrize("variant", hf.GEMMA4_VARIANTS)
def test_gemma4_f32_holds_the_exact_checkpoint_values(gemma, tmp_path, variant):
    g = run_convert(gemma[variant], tmp_path / "g.gguf", outtype="f32")
    src = hf_tensors(gemma[variant])
    assert "lm_head.weight" not in src and "output.weight" not in g.tensors  # tied
    assert set(g.tensors) == {gemma4_name_for(n) for n in src} | {"rope_freqs.weight"}
    for name, tensor in src.items():
        # stored as is: Gemma-4's RMSNorm multiplies by the weight itself (no +1 shift)
        np.testing.assert_array_equal(g.f32(gemma4_name_for(name)), to_np(tensor), err_msg=name)
    assert g.kv("general.architecture") == "gemma4"


def test_gemma4_attention_layout_keys(gemma, tmp_path):
    g = run_convert(gemma["dense"], tmp_path / "g.gguf", outtype="f32")
    assert g.kv("gemma4.attention.sliding_window_pattern") == [True, True, False] * 2
    assert g.kv("gemma4.attention.sliding_window") == 8
    assert g.kv("gemma4.attention.head_count_kv") == [2, 2, 1, 2, 2, 1]
    assert (g.kv("gemma4.attention.key_length"), g.kv("gemma4.attention.key_length_swa")) == (32, 16)
    assert (g.kv("gemma4.rope.dimension_count"), g.kv("gemma4.rope.dimension_count_swa")) == (32, 16)
    assert (g.kv("gemma4.rope.freq_base"), g.kv("gemma4.rope.freq_base_swa")) == (1e6, 1e4)
    assert g.kv("gemma4.attention.shared_kv_layers") == 2
    assert g.kv("gemma4.final_logit_softcapping") == 30.0
    assert g.kv("gemma4.embedding_length_per_layer_input") == 0
    # K = V on the global layers, no K/V at all on the two KV-sharing layers
    assert "blk.2.attn_v.weight" not in g.tensors and "blk.0.attn_v.weight" in g.tensors
    assert not any(n.startswith(("blk.4.attn_k", "blk.5.attn_k")) for n in g.tensors)
    assert g.ne("blk.2.attn_q.weight") == [64, 4 * 32] and g.ne("blk.0.attn_q.weight") == [64, 64]
    # proportional rope: a quarter of the 32-wide global head rotates (4 of 16 pairs)
    np.testing.assert_array_equal(g.f32("rope_freqs.weight"),
                                  np.array([1.0] * 4 + [1e30] * 12, dtype=np.float32))


def test_gemma4_ple_and_double_wide_mlp(gemma, tmp_path):
    g = run_convert(gemma["ple"], tmp_path / "g.gguf", outtype="f16")
    assert g.kv("gemma4.embedding_length_per_layer_input") == 16
    assert g.kv("gemma4.feed_forward_length") == [128] * 4 + [256] * 2  # the KV-sharing layers
    assert g.kv_type("gemma4.feed_forward_length") == GGUFValueType.INT32
    assert g.ne("per_layer_token_embd.weight") == [6 * 16, g.ne("token_embd.weight")[1]]
    assert g.ne("blk.5.ffn_up.weight") == [64, 256]


def test_gemma4_moe_keeps_fused_experts_and_router_scales(gemma, tmp_path):
    g = run_convert(gemma["moe"], tmp_path / "g.gguf", outtype="q8_0")
    src = hf_tensors(gemma["moe"])
    assert (g.kv("gemma4.expert_count"), g.kv("gemma4.expert_used_count"),
            g.kv("gemma4.expert_feed_forward_length")) == (4, 2, 32)
    assert g.ne("blk.0.ffn_gate_up_exps.weight") == [64, 2 * 32, 4]
    assert g.ne("blk.0.ffn_down_exps.weight") == [32, 64, 4]
    assert g.qtype("blk.0.ffn_gate_up_exps.weight") == Q.Q8_0
    assert g.qtype("blk.0.ffn_gate_inp.weight") == Q.F32  # routers stay f32, as in llama.cpp
    for hf_name, gname in (("router.scale", "ffn_gate_inp.scale"),
                           ("router.per_expert_scale", "ffn_down_exps.scale"),
                           ("layer_scalar", "layer_output_scale.weight")):
        ref = to_np(src[f"model.layers.3.{hf_name}"])
        assert not np.allclose(ref, 1.0)  # the fixture makes them matter
        np.testing.assert_array_equal(g.f32(f"blk.3.{gname}"), ref)


def test_gemma4_conditional_writes_the_text_model_only(gemma, tmp_path):
    g = run_convert(gemma["conditional"], tmp_path / "g.gguf", outtype="f32")
    src = hf_tensors(gemma["conditional"])
    text = {n: t for n, t in src.items() if n.startswith("model.language_model.")}
    assert len(text) < len(src)  # the fixture has a vision tower and embedder
    assert set(g.tensors) == {gemma4_name_for(n, "model.language_model.") for n in text} | {
        "rope_freqs.weight"}
    for name, tensor in text.items():
        np.testing.assert_array_equal(g.f32(gemma4_name_for(name, "model.language_model.")),
                                      to_np(tensor))
    assert g.kv("gemma4.block_count") == 6


def test_gemma4_tokenizer(gemma, tmp_path):
    g = run_convert(gemma["dense"], tmp_path / "g.gguf")
    tok = json.loads((gemma["dense"] / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in tok["added_tokens"]})
    tokens = g.kv("tokenizer.ggml.tokens")
    assert tokens == [by_id[i] for i in range(len(by_id))]
    types = dict(zip(tokens, g.kv("tokenizer.ggml.token_type")))
    assert types["<bos>"] == types["<|turn>"] == types["<|image|>"] == 3  # CONTROL
    assert types["<0x41>"] == 6  # BYTE
    assert types["<|channel>"] == types["<note>"] == 4  # USER_DEFINED (visible / not special)
    assert set(g.kv("tokenizer.ggml.scores")) == {-1000.0}
    assert g.kv("tokenizer.ggml.model") == "gemma4"
    assert g.kv("tokenizer.ggml.add_bos_token") is True
    assert g.kv("tokenizer.ggml.add_space_prefix") is False
    assert g.kv("tokenizer.ggml.mask_token_id") == hf.GEMMA4_MASK_TOKEN_ID


def test_qwen3moe_stacks_the_experts(gemma, tmp_path):
    g = run_convert(gemma["qwen3moe"], tmp_path / "m.gguf", outtype="f32")
    src = hf_tensors(gemma["qwen3moe"])
    assert (g.kv("qwen3moe.expert_count"), g.kv("qwen3moe.expert_used_count"),
            g.kv("qwen3moe.expert_feed_forward_length")) == (8, 2, 32)
    assert g.ne("blk.1.ffn_gate_exps.weight") == [64, 32, 8]
    assert g.ne("blk.1.ffn_down_exps.weight") == [32, 64, 8]
    for kind in ("gate", "up", "down"):
        stacked = np.stack([to_np(src[f"model.layers.1.mlp.experts.{j}.{kind}_proj.weight"])
                            for j in range(8)])
        np.testing.assert_array_equal(g.f32(f"blk.1.ffn_{kind}_exps.weight"), stacked)
    np.testing.assert_array_equal(g.f32("blk.1.ffn_gate_inp.weight"),
                                  to_np(src["model.layers.1.mlp.gate.weight"]))
    assert not any("shexp" in n for n in g.tensors)  # Qwen3-MoE has no shared expert


def test_qwen3moe_fused_experts_give_the_same_file(gemma, tmp_path):
    """transformers 5 holds experts fused ([experts, 2 x width, hidden]); both layouts convert
    to the same bytes."""
    src = Path(shutil.copytree(gemma["qwen3moe"], tmp_path / "fused"))

    def fuse(t):
        for i in range(4):
            p = f"model.layers.{i}.mlp.experts"
            gate = [t.pop(f"{p}.{j}.gate_proj.weight") for j in range(8)]
            up = [t.pop(f"{p}.{j}.up_proj.weight") for j in range(8)]
            down = [t.pop(f"{p}.{j}.down_proj.weight") for j in range(8)]
            t[f"{p}.gate_up_proj"] = torch.cat([torch.stack(gate), torch.stack(up)], dim=1)
            t[f"{p}.down_proj"] = torch.stack(down)

    rewrite_tensors(src, fuse)
    a = run_convert(gemma["qwen3moe"], tmp_path / "a.gguf", outtype="q8_0")
    b = run_convert(src, tmp_path / "b.gguf", outtype="q8_0")
    assert set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        assert np.asarray(a.tensors[name].data).tobytes() == \
            np.asarray(b.tensors[name].data).tobytes(), name


def test_gemma4_speculators_draft(gemma, tmp_path):
    """llama.cpp's converter cannot read this format (test_convert_interop.py), so the whole
    file is checked here."""
    g = run_convert(gemma["speculators"], tmp_path / "s.gguf", outtype="f32",
                    target_model_dir=gemma["dense"])
    src, cfg = hf_tensors(gemma["speculators"]), hf_config(gemma["speculators"])
    assert g.kv("general.architecture") == "dflash"
    assert g.kv("dflash.sample_from_anchor") is False  # the 1+N block
    assert g.kv("dflash.target_layers") == [2, 4]  # aux ids are GGUF numbering already
    assert g.kv("dflash.block_size") == 8
    assert (g.kv("dflash.attention.head_count_kv"), g.kv("dflash.attention.key_length"),
            g.kv("dflash.rope.dimension_count")) == (1, 32, 32)
    assert g.kv("dflash.embedding_scale") == 8.0 and g.kv("dflash.attention.scale") == 1.0
    assert g.kv("dflash.hidden_activation") == "gelu_pytorch_tanh"
    assert g.kv("dflash.markov_head_type") == "vanilla"
    assert g.kv("tokenizer.ggml.model") == "gemma4"
    assert g.kv("tokenizer.ggml.mask_token_id") == hf.GEMMA4_MASK_TOKEN_ID
    np.testing.assert_array_equal(np.asarray(g.tensors["d2t"].data),
                                  torch.nonzero(src["t2d"]).flatten().numpy())
    assert g.ne("output.weight") == [64, cfg["draft_vocab_size"]]
    assert "token_embd.weight" not in g.tensors  # the target's
    np.testing.assert_array_equal(g.f32("rope_freqs.weight"),
                                  np.array([1.0] * 4 + [1e30] * 12, dtype=np.float32))
    assert not any(n.endswith("attn_v.weight") for n in g.tensors)  # V from K
    for i in range(2):
        for hf_name, gname in (("layer_scalar", "layer_output_scale.weight"),
                               ("post_attention_layernorm.weight", "post_attention_norm.weight"),
                               ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
                               ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
                               ("self_attn.k_proj.weight", "attn_k.weight")):
            np.testing.assert_array_equal(g.f32(f"blk.{i}.{gname}"),
                                          to_np(src[f"layers.{i}.{hf_name}"]))


def test_gemma4_draft_of_a_conditional_target(gemma, tmp_path):
    draft = hf.make_gemma4_dspark(tmp_path / "d", gemma["conditional"], head_type="gated")
    g = run_convert(draft, tmp_path / "d.gguf", target_model_dir=gemma["conditional"])
    assert g.kv("dflash.markov_head_type") == "gated" and "markov_gate.weight" in g.tensors
    assert "token_embd.weight" not in g.tensors and "output.weight" not in g.tensors  # shared


def test_gemma4_draft_soft_capping_is_kept(gemma, tmp_path):
    """What a copy of a Gemma-4 config carries; llama.cpp's converter refuses it, we write it."""
    draft = hf.make_gemma4_dspark(tmp_path / "d", gemma["dense"], final_logit_softcapping=30.0)
    g = run_convert(draft, tmp_path / "d.gguf", target_model_dir=gemma["dense"])
    assert g.kv("dflash.final_logit_softcapping") == 30.0


def _edit_layer_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg["transformer_layer_config"].update(changes)
    path.write_text(json.dumps(cfg))


GEMMA4_DRAFT_REFUSALS = [
    ("deepspec", {"layer_types": ["full_attention", "sliding_attention"]}, "'layer_types'"),
    ("deepspec", {"attention_k_eq_v": False}, "'attention_k_eq_v'"),
    ("deepspec", {"enable_moe_block": True, "num_experts": 4}, "'enable_moe_block'"),
    ("deepspec", {"num_kv_shared_layers": 1}, "'num_kv_shared_layers'"),
    ("deepspec", {"hidden_size_per_layer_input": 16}, "'hidden_size_per_layer_input'"),
    ("deepspec", {"attention_bias": True}, "'attention_bias'"),
    ("deepspec", {"hidden_activation": "gelu"}, "'hidden_activation'"),
    ("deepspec", {"input_embedding_scale": 2.0}, "'input_embedding_scale'"),
    ("deepspec", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}},
     "'rope_type'"),
    ("speculators", {"layer_types": ["sliding_attention"] * 2}, "'layer_types'"),
    ("speculators", {"enable_moe_block": True}, "'enable_moe_block'"),
    ("speculators", {"model_type": "gemma3_text"}, "gemma3_text"),
]


@pytest.mark.parametrize("key,changes,message", GEMMA4_DRAFT_REFUSALS,
                         ids=[f"{k}-{next(iter(c))}" for k, c, _ in GEMMA4_DRAFT_REFUSALS])
def test_gemma4_draft_refusals_name_the_field(gemma, tmp_path, key, changes, message):
    src = Path(shutil.copytree(gemma[key], tmp_path / key))
    if key == "speculators":
        _edit_layer_config(src, **changes)
    else:
        hf.edit_config(src, **changes)
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match=re.escape(message)):
        convert(src, out, target_model_dir=gemma["dense"], progress=False)
    assert not out.exists()


TARGET_REFUSALS = [
    ("qwen3moe", {"norm_topk_prob": False}, "'norm_topk_prob'"),
    ("qwen3moe", {"mlp_only_layers": [1]}, "'mlp_only_layers'"),
    ("dense", {"use_bidirectional_attention": "all"}, "'use_bidirectional_attention'"),
    ("dense", {"attn_logit_softcapping": 50.0}, "'attn_logit_softcapping'"),
    ("dense", {"per_layer_config": {"2": {"head_dim": 32}, "5": {"head_dim": 64}}}, "head_dim"),
    ("dense", {"layer_types": ["sliding_attention"] * 6}, "'layer_types'"),
    ("dense", {"num_kv_shared_layers": 6}, "'num_kv_shared_layers'"),
]


@pytest.mark.parametrize("key,changes,message", TARGET_REFUSALS,
                         ids=[f"{k}-{next(iter(c))}" for k, c, _ in TARGET_REFUSALS])
def test_gemma4_and_moe_target_refusals(gemma, tmp_path, key, changes, message):
    src = Path(shutil.copytree(gemma[key], tmp_path / key))
    hf.edit_config(src, **changes)
    with pytest.raises(ConversionError, match=re.escape(message)):
        convert(src, tmp_path / "out.gguf", progress=False)


def test_gemma4_target_without_global_head_size_is_refused(gemma, tmp_path):
    """transformers would assume 512; the converter does not guess."""
    src = Path(shutil.copytree(gemma["dense"], tmp_path / "g"))
    hf.edit_config(src, per_layer_config=None)
    with pytest.raises(ConversionError, match="global_head_dim or per_layer_config"):
        convert(src, tmp_path / "out.gguf", progress=False)
    hf.edit_config(src, global_head_dim=32, num_global_key_value_heads=1)  # the older config style
    g = run_convert(src, tmp_path / "g.gguf", outtype="f32")
    assert g.kv("gemma4.attention.head_count_kv") == [2, 2, 1, 2, 2, 1]


def test_gemma4_stale_kv_of_sharing_layers_is_written_as_llama_cpp_does(gemma, tmp_path):
    """Some checkpoints still store K/V for the KV-sharing layers (transformers ignores them on
    load); llama.cpp's converter writes them, and so do we. They are never required."""
    src = Path(shutil.copytree(gemma["dense"], tmp_path / "g"))
    rewrite_tensors(src, lambda t: t.update({
        "model.layers.4.self_attn.k_proj.weight": t["model.layers.3.self_attn.k_proj.weight"] * 2,
        "model.layers.4.self_attn.k_norm.weight": t["model.layers.3.self_attn.k_norm.weight"].clone()}))
    g = run_convert(src, tmp_path / "g.gguf", outtype="f32")
    assert g.ne("blk.4.attn_k.weight") == [64, 32] and "blk.4.attn_v.weight" not in g.tensors
    rewrite_tensors(src, lambda t: t.update({
        "model.layers.4.self_attn.k_proj.weight": torch.zeros(8, 64)}))
    with pytest.raises(ConversionError, match="expected shape"):
        convert(src, tmp_path / "h.gguf", progress=False)


def test_gemma4_per_layer_config_keys_are_read_as_layer_numbers():
    """transformers pads per_layer_config keys to the width of the largest layer index ("05" in a
    12-layer model): the global layers' head size and KV heads are found all the same."""
    from transformers import Gemma4TextConfig

    from dspark_ggml.convert.archs.gemma4 import read_gemma4
    from dspark_ggml.convert.hf_config import Config

    types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    cfg = Gemma4TextConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=12,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                           num_global_key_value_heads=1, layer_types=types, sliding_window=8,
                           hidden_size_per_layer_input=0, attention_k_eq_v=True).to_dict()
    assert "05" in cfg["per_layer_config"]  # what transformers writes
    g = read_gemma4(Config(cfg, "config.json"))
    assert (g.head_dim_swa, g.head_dim_full, g.kv_heads_swa, g.kv_heads_full) == (16, 32, 2, 1)
