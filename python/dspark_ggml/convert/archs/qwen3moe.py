"""Qwen3-MoE (`Qwen3MoeForCausalLM`), written as llama.cpp's `qwen3moe` architecture.

The experts of a layer become three 3-D tensors `ffn_{gate,up,down}_exps.weight` of shape
[experts, out, in] (ggml {in, out, experts}); the router is `ffn_gate_inp.weight` (kept in
F32, as llama.cpp does); a shared expert, where a checkpoint has one, becomes `ffn_*_shexp`
with its gate `ffn_gate_inp_shexp.weight`. Checkpoints store the experts either one tensor per
expert (`mlp.experts.{j}.gate_proj.weight`, what transformers saves and the Hub holds) or fused
(`mlp.experts.gate_up_proj` [experts, 2 x width, hidden] and `mlp.experts.down_proj`); both are
read a single expert at a time.

llama.cpp's qwen3moe graph always renormalises the top-k weights and has no dense layers, so
`norm_topk_prob` false, `mlp_only_layers` and `decoder_sparse_step` > 1 are refused.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import gguf_keys as K
from ..backbone import Backbone, read_backbone, write_backbone_kv
from ..errors import ConversionError
from ..hf_config import Config
from ..metadata import KeyValues
from ..plan import ModelPlan, PlannedTensor, StoredTensor
from ..quant import OutType, tensor_type
from ..safetensors_io import FLOAT_DTYPES, Checkpoint, TensorRef, read_rows, read_tensor
from ..tensor_names import layer_tensor_name, layer_tensor_shapes
from .base import TargetArch

GGUF_ARCH = "qwen3moe"
_PER_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj$")
_LAYER_MOE = re.compile(r"^model\.layers\.(\d+)\.mlp\.(gate\.weight|shared_expert_gate\.weight|"
                        r"shared_expert\.(gate|up|down)_proj\.weight)$")


@dataclass(frozen=True)
class StackedExperts:
    """One [experts, out, in] tensor from the experts' separate [out, in] tensors."""

    refs: tuple[TensorRef, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.refs), *self.refs[0].shape)

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        for ref in self.refs:
            yield read_tensor(ref)[None]


@dataclass(frozen=True)
class FusedHalf:
    """The gate (half 0) or up (half 1) projections of a fused [experts, 2 x width, in] tensor."""

    ref: TensorRef
    half: int

    @property
    def shape(self) -> tuple[int, ...]:
        experts, rows, cols = self.ref.shape
        return (experts, rows // 2, cols)

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        width = self.ref.shape[1] // 2
        for j in range(self.ref.shape[0]):
            yield read_rows(self.ref, j, j + 1)[:, self.half * width:(self.half + 1) * width]


@dataclass(frozen=True)
class MoeShape:
    n_expert: int
    n_used: int
    n_ff_exp: int
    n_ff_shexp: Optional[int]


def _read_moe(cfg: Config) -> MoeShape:
    count_key = "num_experts" if cfg.has("num_experts") else "num_local_experts"
    moe = MoeShape(cfg.int(count_key, minimum=1), cfg.int("num_experts_per_tok", minimum=1),
                   cfg.int("moe_intermediate_size", minimum=1),
                   cfg.int("shared_expert_intermediate_size", None, minimum=1))
    if moe.n_used > moe.n_expert:
        raise ConversionError(f"{cfg.where}: field 'num_experts_per_tok' {moe.n_used} exceeds "
                              f"the {moe.n_expert} experts")
    if cfg.bool("norm_topk_prob", True) is False:
        raise ConversionError(f"{cfg.where}: field 'norm_topk_prob' false is not supported "
                              "(llama.cpp's qwen3moe always renormalises the top-k weights)")
    if cfg.int_list("mlp_only_layers", []) or cfg.int("decoder_sparse_step", 1) != 1:
        raise ConversionError(f"{cfg.where}: fields 'mlp_only_layers' / 'decoder_sparse_step' "
                              "make some layers dense, which qwen3moe cannot express")
    if cfg.bool("use_sliding_window", False):
        raise ConversionError(f"{cfg.where}: field 'use_sliding_window' is not supported for "
                              "qwen3moe targets")
    return moe


def _expert_shapes(bb: Backbone, moe: MoeShape) -> dict[str, tuple[int, ...]]:
    x, e, f = moe.n_expert, bb.n_embd, moe.n_ff_exp
    return {"ffn_gate_exps.weight": (x, f, e), "ffn_up_exps.weight": (x, f, e),
            "ffn_down_exps.weight": (x, e, f)}


def _moe_layer_shapes(bb: Backbone, moe: MoeShape) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Router and shared-expert tensors inside `mlp.` -> (GGUF name inside blk.N., shape)."""
    e = bb.n_embd
    shapes = {"gate.weight": ("ffn_gate_inp.weight", (moe.n_expert, e))}
    if moe.n_ff_shexp:
        f = moe.n_ff_shexp
        shapes.update({"shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", (1, e)),
                       "shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", (f, e)),
                       "shared_expert.up_proj.weight": ("ffn_up_shexp.weight", (f, e)),
                       "shared_expert.down_proj.weight": ("ffn_down_shexp.weight", (e, f))})
    return shapes


class _Experts:
    """Collects one layer's expert tensors, in whichever layout, until they form whole tensors."""

    def __init__(self, bb: Backbone, moe: MoeShape):
        self.moe = moe
        self.shapes = _expert_shapes(bb, moe)
        self.per_expert: dict[tuple[int, str], dict[int, TensorRef]] = {}
        self.sources: dict[tuple[int, str], object] = {}

    def add_per_expert(self, layer: int, expert: int, kind: str, ref: TensorRef) -> None:
        self.per_expert.setdefault((layer, kind), {})[expert] = ref

    def add_fused(self, layer: int, kind: str, ref: TensorRef) -> None:
        if kind == "gate_up":
            self.sources[(layer, "gate")] = FusedHalf(ref, 0)
            self.sources[(layer, "up")] = FusedHalf(ref, 1)
        else:
            self.sources[(layer, "down")] = StoredTensor(ref)

    def tensors(self, n_layer: int) -> Iterator[tuple[str, object]]:
        for (layer, kind), refs in self.per_expert.items():
            if (layer, kind) in self.sources:
                raise ConversionError(f"layer {layer}: experts stored both fused and per expert")
            if sorted(refs) != list(range(self.moe.n_expert)):
                raise ConversionError(f"layer {layer}: {kind}_proj of experts "
                                      f"{sorted(set(range(self.moe.n_expert)) - set(refs))} "
                                      "missing (or extra experts stored)")
            self.sources[(layer, kind)] = StackedExperts(tuple(refs[j] for j in sorted(refs)))
        for layer in range(n_layer):
            for kind in ("gate", "up", "down"):
                name = f"ffn_{kind}_exps.weight"
                source = self.sources.get((layer, kind))
                if source is None:
                    raise ConversionError(f"layer {layer} has no {kind}_proj experts")
                if source.shape != self.shapes[name]:
                    raise ConversionError(f"layer {layer}: experts' {kind}_proj give shape "
                                          f"{list(source.shape)}, expected {list(self.shapes[name])}")
                yield f"blk.{layer}.{name}", source


def _check_float(ref: TensorRef) -> None:
    if ref.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"{ref.describe()}: not a floating-point tensor")


def plan_qwen3moe_target(ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, Backbone]:
    bb = read_backbone(cfg)
    moe = _read_moe(cfg)
    if bb.partial_rotary_factor not in (None, 1.0) or bb.rope.kind == "llama3":
        raise ConversionError(f"{cfg.where}: partial rotary / llama3 rope are not supported for "
                              "qwen3moe targets")
    kv = KeyValues(GGUF_ARCH)
    write_backbone_kv(bb, kv)
    kv.u32(K.EXPERT_COUNT, moe.n_expert)
    kv.u32(K.EXPERT_USED_COUNT, moe.n_used)
    kv.u32(K.EXPERT_FEED_FORWARD_LENGTH, moe.n_ff_exp)
    if moe.n_ff_shexp:
        kv.u32(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, moe.n_ff_shexp)
    plan = ModelPlan(GGUF_ARCH, kv)

    dense = {p: s for p, s in layer_tensor_shapes(bb, qk_norm=True).items()
             if not p.startswith("mlp.")}
    mlp = _moe_layer_shapes(bb, moe)
    experts = _Experts(bb, moe)
    globals_ = {"model.embed_tokens.weight": ("token_embd.weight", (bb.vocab_size, bb.n_embd)),
                "model.norm.weight": ("output_norm.weight", (bb.n_embd,)),
                "lm_head.weight": ("output.weight", (bb.vocab_size, bb.n_embd))}
    seen: set[str] = set()
    for name, ref in ckpt.items():
        _check_float(ref)
        if m := _PER_EXPERT.match(name):
            experts.add_per_expert(int(m.group(1)), int(m.group(2)), m.group(3), ref)
            continue
        if m := _FUSED.match(name):
            experts.add_fused(int(m.group(1)), m.group(2), ref)
            continue
        if name in globals_:
            gguf_name, shape = globals_[name]
        elif m := _LAYER_MOE.match(name):
            part = mlp.get(m.group(2))
            if part is None:
                raise ConversionError(f"{ref.describe()}: a shared expert, but the config has no "
                                      "shared_expert_intermediate_size")
            gguf_name, shape = f"blk.{m.group(1)}.{part[0]}", part[1]
        else:
            layer = layer_tensor_name(name.removeprefix("model.")) if name.startswith("model.") \
                else None
            if layer is None or layer[1] not in dense or layer[0] >= bb.n_layer:
                raise ConversionError(f"unexpected tensor {name!r} in the checkpoint (no GGUF name)")
            gguf_name, shape = layer[2], dense[layer[1]]
        if ref.shape != shape:
            raise ConversionError(f"{ref.describe()}: expected shape {list(shape)} from {cfg.where}")
        seen.add(gguf_name)
        plan.add(PlannedTensor(gguf_name, StoredTensor(ref), tensor_type(gguf_name, ref.shape, out)))
    for gguf_name, source in experts.tensors(bb.n_layer):
        plan.add(PlannedTensor(gguf_name, source, tensor_type(gguf_name, source.shape, out)))
    _check_complete(seen, bb, dense, mlp, cfg)
    return plan, bb


def _check_complete(seen: set[str], bb: Backbone, dense: dict, mlp: dict, cfg: Config) -> None:
    required = {"token_embd.weight", "output_norm.weight"}
    for i in range(bb.n_layer):
        required |= {layer_tensor_name(f"layers.{i}.{p}")[2] for p in dense}
        required |= {f"blk.{i}.{g}" for g, _ in mlp.values()}
    if not bb.tie_word_embeddings:
        required.add("output.weight")
    missing = sorted(required - seen)
    if missing:
        raise ConversionError(f"{cfg.where}: the checkpoint lacks {len(missing)} tensor(s) the "
                              f"config implies, e.g. {missing[:3]}")


class Qwen3Moe(TargetArch):
    gguf_arch = GGUF_ARCH
    hf_architectures = ("Qwen3MoeForCausalLM",)

    def plan_target(self, ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, int]:
        plan, bb = plan_qwen3moe_target(ckpt, cfg, out)
        return plan, bb.vocab_size


ARCH = Qwen3Moe()
