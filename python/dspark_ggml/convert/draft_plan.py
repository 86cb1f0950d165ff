"""A draft (`DraftSpec` + its tensors + the target) as a `dflash` GGUF plan.

Decisions made here, each checked against the tensors rather than trusted from the config:

* Markov head type and rank come from the tensors present (vanilla: w1/w2; gated: + gate_proj;
  rnn: + joint_proj); a config that says otherwise is refused.
* The draft's embedding and lm head are dropped when they equal the target's (the runtime then
  shares the target's), kept otherwise. A reduced-vocab lm head is always kept: it is never
  replaced by the target's. If the embedding is kept but the head is not in the file, the
  runtime would tie the head to the draft's embedding, so the right head is written explicitly.
* `d2t` offsets become absolute target ids (I64); `t2d` is only used to cross-check them.
* The decoder layers are read by their architecture (`archs`, `DraftLayers.read`): the tensors
  they must have, the keys of their arithmetic beyond the generic ones, and any rope_freqs
  (Gemma-4 layers: `archs/gemma4.py`).
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from . import gguf_keys as K
from .archs.base import DraftBackbone, LayerTable
from .backbone import Backbone, write_backbone_kv
from .drafts import DraftSpec, resolve_target_layers
from .errors import ConversionError
from .metadata import KeyValues
from .plan import ArrayTensor, ModelPlan, PlannedTensor, StoredTensor
from .quant import OutType, tensor_type
from .safetensors_io import FLOAT_DTYPES, INT_DTYPES, Checkpoint, TensorRef, read_tensor, \
    tensors_equal
from .tensor_names import D2T, ROPE_FREQS

ARCH = "dflash"

# HF name (without `model.`) -> GGUF name of the tensors outside the decoder layers
GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "markov_head.gate_proj.weight": "markov_gate.weight",
    "markov_head.gate_proj.bias": "markov_gate.bias",
    "markov_head.joint_proj.weight": "markov_joint.weight",
    "markov_head.joint_proj.bias": "markov_joint.bias",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
}
# saved by some trainers, meaningless at inference (t2d is read, only to check d2t)
_TRAINING_ONLY = {"t2d", "verifier_lm_head.weight", "verifier_norm.weight"}


@dataclass(frozen=True)
class Target:
    model_dir: Path
    n_layer: int
    n_embd: int
    vocab_size: int
    ckpt: Checkpoint
    prefix: str = "model."  # where the language model's tensors live

    @property
    def embed(self) -> TensorRef:
        return self.ckpt[self.prefix + "embed_tokens.weight"]

    @property
    def head(self) -> TensorRef:
        return self.ckpt.get("lm_head.weight") or self.embed


@dataclass(frozen=True)
class Markov:
    head_type: str
    rank: int


# ----------------------------------------------------------------------------------------------
# names


def _canonical_names(spec: DraftSpec, ckpt: Checkpoint) -> dict[str, TensorRef]:
    """Stored names without `model.` and with legacy prefixes renamed -> refs."""
    out: dict[str, TensorRef] = {}
    for stored, ref in ckpt.items():
        name = stored.removeprefix("model.")
        for old, new in spec.renames.items():
            if name.startswith(old):
                name = new + name[len(old):]
        if name in out:
            raise ConversionError(f"{ref.describe()}: clashes with {out[name].name} after renaming")
        out[name] = ref
    return out


# ----------------------------------------------------------------------------------------------
# checks against the target and the config


def _check_backbone(spec: DraftSpec, bb: Backbone, target: Target) -> None:
    where = spec.backbone.where
    if bb.rope.kind == "llama3":
        raise ConversionError(f"{where}: llama3 rope scaling cannot be expressed for a dflash draft")
    t = target
    if bb.n_embd != t.n_embd:
        raise ConversionError(f"{where}: draft hidden_size {bb.n_embd} differs from the target's "
                              f"{t.n_embd}; the runtime needs them equal")
    if bb.vocab_size != t.vocab_size:
        raise ConversionError(f"{where}: draft vocab_size {bb.vocab_size} differs from the "
                              f"target's {t.vocab_size} (wrong --target-model-dir?)")
    if spec.num_target_layers is not None and spec.num_target_layers != t.n_layer:
        raise ConversionError(f"{where}: num_target_layers {spec.num_target_layers} but the target "
                              f"has {t.n_layer} layers (wrong --target-model-dir?)")
    if spec.target_hidden_size is not None and spec.target_hidden_size != t.n_embd:
        raise ConversionError(f"{where}: target_hidden_size {spec.target_hidden_size} but the "
                              f"target's hidden_size is {t.n_embd}")
    if not 0 <= spec.mask_token_id < t.vocab_size:
        raise ConversionError(f"mask_token_id {spec.mask_token_id} is outside the vocabulary "
                              f"(size {t.vocab_size})")


def _expect_shape(ref: Optional[TensorRef], shape: tuple[int, ...], why: str) -> None:
    if ref is not None and ref.shape != shape:
        raise ConversionError(f"{ref.describe()}: expected shape {list(shape)} ({why})")


def _check_layers(names: dict[str, TensorRef], table: LayerTable, spec: DraftSpec,
                  n_layer: int) -> None:
    for name, ref in names.items():
        if not name.startswith("layers."):
            continue
        if name not in table:
            raise ConversionError(f"{ref.describe()}: unexpected tensor for a {n_layer}-layer "
                                  f"{spec.layer_arch.name} draft")
        _expect_shape(ref, table[name][1], "from the draft config")
    missing = [name for name in table if name not in names]
    if missing:
        raise ConversionError(f"the draft checkpoint lacks {len(missing)} layer tensor(s), "
                              f"e.g. {missing[:3]}")


def _markov_head(names: dict[str, TensorRef], spec: DraftSpec, bb: Backbone,
                 n_vocab_draft: int) -> Optional[Markov]:
    present = {n for n in names if n.startswith("markov_head.")}
    unknown = sorted(present - set(GLOBAL_NAMES))
    if unknown:
        raise ConversionError(f"unknown Markov head tensor(s) {unknown}")
    if not present:
        if spec.markov_rank:
            raise ConversionError(f"the config says markov_rank {spec.markov_rank} but the "
                                  "checkpoint has no markov_head tensors")
        return None
    w1, w2 = names.get("markov_head.markov_w1.weight"), names.get("markov_head.markov_w2.weight")
    if w1 is None or w2 is None or len(w1.shape) != 2:
        raise ConversionError("a Markov head needs markov_w1.weight [vocab, rank] and "
                              "markov_w2.weight [draft vocab, rank]")
    rank, e = w1.shape[1], bb.n_embd
    _expect_shape(w1, (bb.vocab_size, rank), "markov_w1: one row per target token")
    _expect_shape(w2, (n_vocab_draft, rank), "markov_w2: one row per draft token")
    gated = {"markov_head.gate_proj.weight", "markov_head.gate_proj.bias"}
    rnn = {"markov_head.joint_proj.weight", "markov_head.joint_proj.bias"}
    head_type = "vanilla"
    if present & gated:
        head_type = "gated"
        _require(names, gated)
        _expect_shape(names["markov_head.gate_proj.weight"], (rank, e + rank), "gated head")
        _expect_shape(names["markov_head.gate_proj.bias"], (rank,), "gated head")
    if present & rnn:
        if head_type != "vanilla":
            raise ConversionError("the checkpoint has both gated and rnn Markov head tensors")
        head_type = "rnn"
        _require(names, rnn)
        _expect_shape(names["markov_head.joint_proj.weight"], (3 * rank, 2 * rank + e), "rnn head")
        _expect_shape(names["markov_head.joint_proj.bias"], (3 * rank,), "rnn head")
    if spec.markov_head_type is not None and spec.markov_head_type != head_type:
        raise ConversionError(f"the config says markov_head_type {spec.markov_head_type!r} but the "
                              f"tensors are those of a {head_type!r} head")
    if spec.markov_rank is not None and spec.markov_rank != rank:
        raise ConversionError(f"the config says markov_rank {spec.markov_rank} but the Markov "
                              f"tensors have rank {rank}")
    spec.notes.append(f"Markov head: {head_type}, rank {rank}")
    return Markov(head_type, rank)


def _require(names: dict[str, TensorRef], wanted: set[str]) -> None:
    missing = sorted(wanted - set(names))
    if missing:
        raise ConversionError(f"incomplete Markov head: missing {missing}")


def _confidence_head(names: dict[str, TensorRef], spec: DraftSpec, bb: Backbone,
                     markov: Optional[Markov]) -> bool:
    weight = names.get("confidence_head.proj.weight")
    bias = names.get("confidence_head.proj.bias")
    if weight is None:
        if bias is not None:
            raise ConversionError("confidence_head.proj.bias without its weight")
        if spec.confidence_head:
            raise ConversionError("the config enables a confidence head but the checkpoint has "
                                  "no confidence_head.proj.weight")
        return False
    if spec.confidence_head is False:
        raise ConversionError("the config disables the confidence head but the checkpoint has one")
    rank = markov.rank if markov else 0
    with_markov = spec.confidence_with_markov
    if with_markov is None:
        with_markov = weight.shape == (1, bb.n_embd + rank) and rank > 0
    width = bb.n_embd + (rank if with_markov else 0)
    if with_markov and markov is None:
        raise ConversionError("confidence_head_with_markov is set but there is no Markov head")
    _expect_shape(weight, (1, width), "confidence head input: hidden state"
                  + (" + Markov embedding" if with_markov else ""))
    _expect_shape(bias, (1,), "confidence head bias")
    return True


# ----------------------------------------------------------------------------------------------
# vocabulary, embedding and head


def _absolute_d2t(d2t: TensorRef, t2d: Optional[TensorRef], n_draft: int, n_vocab: int) -> np.ndarray:
    if d2t.dtype not in INT_DTYPES or d2t.shape != (n_draft,):
        raise ConversionError(f"{d2t.describe()}: expected an integer vector of draft_vocab_size "
                              f"{n_draft} offsets")
    ids = read_tensor(d2t).astype(np.int64) + np.arange(n_draft, dtype=np.int64)
    if ids.min() < 0 or ids.max() >= n_vocab:
        raise ConversionError(f"{d2t.describe()}: maps to target ids outside [0, {n_vocab})")
    if np.unique(ids).size != n_draft:
        raise ConversionError(f"{d2t.describe()}: two draft tokens map to the same target token")
    if t2d is not None:
        mask = read_tensor(t2d)
        if t2d.shape != (n_vocab,) or int(mask.astype(bool).sum()) != n_draft \
                or not mask.astype(bool)[ids].all():
            raise ConversionError(f"{t2d.describe()}: does not mark exactly the target tokens d2t "
                                  "maps to")
    return ids


def _vocab_mapping(names: dict[str, TensorRef], spec: DraftSpec, bb: Backbone
                   ) -> tuple[int, Optional[np.ndarray]]:
    """(draft vocab size, absolute d2t ids or None)."""
    n_vocab = bb.vocab_size
    n_draft = spec.draft_vocab_size or n_vocab
    if n_draft > n_vocab:
        raise ConversionError(f"draft_vocab_size {n_draft} exceeds vocab_size {n_vocab}")
    d2t, t2d = names.get("d2t"), names.get("t2d")
    if d2t is None:
        if n_draft < n_vocab:
            raise ConversionError(f"draft_vocab_size {n_draft} < vocab_size {n_vocab} but the "
                                  "checkpoint has no d2t table")
        return n_draft, None
    ids = _absolute_d2t(d2t, t2d, n_draft, n_vocab)
    if n_draft == n_vocab and np.array_equal(ids, np.arange(n_vocab)):
        spec.notes.append("d2t is the identity: dropped")
        return n_draft, None
    spec.notes.append(f"reduced draft vocabulary: {n_draft} of {n_vocab} tokens (d2t written)")
    return n_draft, ids


@dataclass(frozen=True)
class _Sharing:
    keep_embed: bool
    keep_head: bool
    head_from_target: bool  # write the target's head as the draft's output.weight


def _sharing(names: dict[str, TensorRef], spec: DraftSpec, target: Target,
             own_vocab_head: bool) -> _Sharing:
    embed, head = names.get("embed_tokens.weight"), names.get("lm_head.weight")
    keep_embed = embed is not None and not tensors_equal(embed, target.embed)
    if own_vocab_head:
        keep_head = True  # a head over the draft's own vocabulary is never the target's
        if head is None:
            raise ConversionError("a reduced draft vocabulary needs the draft's lm_head.weight")
    else:
        keep_head = head is not None and not tensors_equal(head, target.head)
    head_from_target = False
    if keep_embed and not keep_head:
        # with an embedding but no head the runtime ties the head to that embedding
        keep_head = head is not None
        head_from_target = head is None
    for what, ref, kept in (("embedding", embed, keep_embed), ("lm head", head, keep_head)):
        if ref is not None:
            spec.notes.append(f"draft {what}: " + ("kept" if kept else
                                                   "equal to the target's, dropped (shared)"))
    if head_from_target:
        spec.notes.append("draft lm head: none in the checkpoint, the target's is written")
    return _Sharing(keep_embed, keep_head, head_from_target)


# ----------------------------------------------------------------------------------------------
# assembly


def _draft_kv(spec: DraftSpec, layers: DraftBackbone, target_layers: list[int],
              markov: Optional[Markov], has_confidence: bool) -> KeyValues:
    kv = KeyValues(ARCH)
    bb = layers.bb
    write_backbone_kv(bb, kv)
    layers.write_kv(kv)
    if bb.partial_rotary_factor is not None:
        kv.u32(K.ROPE_DIMENSION_COUNT, int(bb.head_dim * bb.partial_rotary_factor))
    for key, value in spec.scalars.items():
        kv.f32(key, value)
    kv.u32(K.BLOCK_SIZE, spec.block_size)
    kv.array(K.TARGET_LAYERS, target_layers, GGUFValueType.INT32)
    if spec.sliding_window is not None:
        kv.u32(K.SLIDING_WINDOW, spec.sliding_window)
        kv.array(K.SLIDING_WINDOW_PATTERN, spec.sliding_layers, GGUFValueType.BOOL)
    if spec.causal is not None:
        kv.boolean(K.CAUSAL, spec.causal)
    kv.boolean(K.SAMPLE_FROM_ANCHOR, spec.sample_from_anchor)
    kv.boolean(K.HAS_CONFIDENCE_HEAD, has_confidence)
    if spec.confidence_temperatures is not None:
        temps = spec.confidence_temperatures
        slots = spec.block_size - (0 if spec.sample_from_anchor else 1)
        if not has_confidence:
            raise ConversionError("confidence_temperatures are given but the draft has no confidence head")
        if len(temps) != slots or not all(math.isfinite(t) and t > 0 for t in temps):
            raise ConversionError(f"confidence_temperatures must be {slots} positive numbers (one per "
                                  f"predicting slot of the block), got {temps}")
        kv.array(K.CONFIDENCE_TEMPERATURES, temps, GGUFValueType.FLOAT32)
    if markov is not None:
        kv.string(K.MARKOV_HEAD_TYPE, markov.head_type)
    return kv


def _plan_tensors(plan: ModelPlan, names: dict[str, TensorRef], layers: LayerTable,
                  sharing: _Sharing, target: Target, d2t: Optional[np.ndarray],
                  out: OutType) -> None:
    for name, ref in names.items():
        if name in _TRAINING_ONLY:
            plan.notes.append(f"{ref.name}: training-only, not written")
            continue
        if name == "d2t":
            continue
        if name == "embed_tokens.weight" and not sharing.keep_embed:
            continue
        if name == "lm_head.weight" and not sharing.keep_head:
            continue
        gguf_name = layers[name][0] if name in layers else GLOBAL_NAMES.get(name)
        if gguf_name is None:
            raise ConversionError(f"{ref.describe()}: unexpected tensor in a DFlash/DSpark draft")
        if ref.dtype not in FLOAT_DTYPES:
            raise ConversionError(f"{ref.describe()}: not a floating-point tensor")
        plan.add(PlannedTensor(gguf_name, StoredTensor(ref), tensor_type(gguf_name, ref.shape, out)))
    if sharing.head_from_target:
        head = target.head
        plan.add(PlannedTensor("output.weight", StoredTensor(head),
                               tensor_type("output.weight", head.shape, out)))
    if d2t is not None:
        plan.add(PlannedTensor(D2T, ArrayTensor(d2t), GGMLQuantizationType.I64))


def plan_draft(spec: DraftSpec, ckpt: Checkpoint, target: Target, out: OutType) -> ModelPlan:
    layers = spec.layer_arch.read(spec.backbone)
    bb = layers.bb
    _check_backbone(spec, bb, target)
    target_layers = resolve_target_layers(spec, target.n_layer)
    names = _canonical_names(spec, ckpt)
    _check_layers(names, layers.layers, spec, bb.n_layer)
    for required in ("fc.weight", "hidden_norm.weight", "norm.weight"):
        if required not in names:
            raise ConversionError(f"the draft checkpoint has no {required}")
    _expect_shape(names["fc.weight"], (bb.n_embd, len(target_layers) * target.n_embd),
                  f"{len(target_layers)} target layers x the target's hidden size")
    _expect_shape(names["hidden_norm.weight"], (bb.n_embd,), "hidden size")
    _expect_shape(names["norm.weight"], (bb.n_embd,), "hidden size")

    n_draft, d2t = _vocab_mapping(names, spec, bb)
    _expect_shape(names.get("embed_tokens.weight"), (bb.vocab_size, bb.n_embd), "target vocab")
    _expect_shape(names.get("lm_head.weight"), (n_draft, bb.n_embd), "draft vocab")
    markov = _markov_head(names, spec, bb, n_draft)
    has_confidence = _confidence_head(names, spec, bb, markov)
    sharing = _sharing(names, spec, target, own_vocab_head=d2t is not None)

    plan = ModelPlan(ARCH, _draft_kv(spec, layers, target_layers, markov, has_confidence))
    if layers.rope_freqs is not None:
        plan.add(PlannedTensor(ROPE_FREQS, ArrayTensor(layers.rope_freqs), GGMLQuantizationType.F32))
    _plan_tensors(plan, names, layers.layers, sharing, target, d2t, out)
    plan.notes.extend(spec.notes)
    return plan
