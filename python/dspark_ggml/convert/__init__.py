"""Hugging Face → GGUF conversion of targets (Qwen3, Qwen2, Llama, Qwen3-MoE, Gemma-4) and
DFlash/DSpark drafts.

    from dspark_ggml.convert import convert
    convert("Qwen3-8B", "qwen3-8b-f16.gguf")
    convert("dspark_qwen3_8b_block7", "draft.gguf", target_model_dir="Qwen3-8B")

The output matches what llama.cpp's convert_hf_to_gguf.py writes for the same checkpoint, except
where this converter is deliberately stricter or more explicit (see `convert`). Conversion
streams tensor by tensor, so memory stays near the largest tensor block, and the output appears
only once it is complete.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Optional, Union

from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, size_label

from . import gguf_keys as K
from .archs import TARGETS, target_arch
from .archs.base import TargetArch
from .draft_plan import Target, plan_draft
from .drafts import is_draft_config, read_draft
from .errors import ConversionError
from .hf_config import Config
from .metadata import KeyValues
from .options import Overrides
from .plan import ModelPlan
from .quant import OutType, resolve_outtype
from .safetensors_io import Checkpoint
from .writer import check_destination, write_gguf

__all__ = ["convert", "build_plan", "ConversionError", "Overrides"]

log = logging.getLogger("dspark_ggml.convert")
PathLike = Union[str, Path]


def _general_kv(plan: ModelPlan, name: str, out: OutType) -> KeyValues:
    kv = KeyValues(plan.arch)
    kv.string(K.TYPE, "model")
    kv.string(K.NAME, name)
    n_params = sum(math.prod(t.shape) for t in plan.tensors)
    kv.string(K.SIZE_LABEL, size_label(n_params, n_params, 0, 0))
    kv.u32(K.FILE_TYPE, int(out.file_type))
    kv.u32(K.QUANTIZATION_VERSION, GGML_QUANT_VERSION)
    return kv


def _finish(plan: ModelPlan, name: str, out: OutType, tokenizer_kv: KeyValues) -> ModelPlan:
    """Put the general keys first and the tokenizer keys last (llama.cpp's order)."""
    kv = _general_kv(plan, name, out)
    kv.update(plan.kv)
    kv.update(tokenizer_kv)
    plan.kv = kv
    fallbacks = [t.name for t in plan.tensors
                 if out.matrix_type == GGMLQuantizationType.Q8_0 and t.qtype == GGMLQuantizationType.F16]
    if fallbacks:
        plan.notes.append(f"rows not a multiple of 32, written as f16 instead of q8_0: "
                          f"{', '.join(fallbacks)}")
    return plan


def _tokenizer_kv(gguf_arch: str, tokenizer_dir: Path, arch: TargetArch, vocab_size: int,
                  ov: Overrides) -> KeyValues:
    """The tokenizer keys of the target architecture (a draft carries its target's)."""
    kv = KeyValues(gguf_arch)
    arch.tokenizer_kv(tokenizer_dir, vocab_size, kv, ov)
    return kv


def _target_plan(hf_dir: Path, cfg: Config, outtype: str, ov: Overrides) -> ModelPlan:
    arch = target_arch(cfg)
    ckpt = Checkpoint(hf_dir)
    out = resolve_outtype(outtype, ckpt)
    plan, vocab_size = arch.plan_target(ckpt, cfg, out)
    tok = _tokenizer_kv(plan.arch, hf_dir, arch, vocab_size, ov)
    return _finish(plan, hf_dir.resolve().name, out, tok)


def _load_target(target_dir: Optional[PathLike]) -> tuple[Target, TargetArch]:
    if target_dir is None:
        raise ConversionError("a draft needs --target-model-dir: the tokenizer, vocabulary and "
                              "embeddings are the target's")
    target_dir = Path(target_dir)
    cfg = Config.load(target_dir)
    arch = target_arch(cfg)
    if arch is None:
        raise ConversionError(f"{cfg.where}: target architecture {cfg.architecture()!r} is not "
                              f"supported (supported: {', '.join(TARGETS)})")
    ckpt = Checkpoint(target_dir)
    dims = arch.target_dims(cfg)
    target = Target(target_dir, dims.n_layer, dims.n_embd, dims.vocab_size, ckpt, dims.prefix)
    return target, arch


def _draft_plan(hf_dir: Path, cfg: Config, outtype: str, target_dir: Optional[PathLike],
                ov: Overrides) -> ModelPlan:
    if (hf_dir / "mask_embedding.pt").is_file():
        raise ConversionError(f"{hf_dir}: drafts with a separate mask_embedding.pt are not "
                              "supported")
    spec = read_draft(cfg, ov)
    target, arch = _load_target(target_dir)
    ckpt = Checkpoint(hf_dir)
    out = resolve_outtype(outtype, ckpt)
    plan = plan_draft(spec, ckpt, target, out)
    tok = _tokenizer_kv(plan.arch, target.model_dir, arch, target.vocab_size, ov)
    # the draft's own mask token wins over any mask token the target tokenizer names
    tok.u32(K.MASK_TOKEN_ID, spec.mask_token_id, replace=True)
    return _finish(plan, hf_dir.resolve().name, out, tok)


def build_plan(hf_dir: PathLike, *, outtype: str = "f16", target_model_dir: Optional[PathLike] = None,
               **overrides: Any) -> ModelPlan:
    """Read and validate everything and return what would be written (nothing is written)."""
    ov = Overrides.from_kwargs(overrides)
    hf_dir = Path(hf_dir)
    cfg = Config.load(hf_dir)
    if ov.draft_format is None and not is_draft_config(cfg) and target_arch(cfg) is not None:
        if target_model_dir is not None:
            raise ConversionError(f"{hf_dir} is a target model; --target-model-dir is only for "
                                  "drafts")
        return _target_plan(hf_dir, cfg, outtype, ov)
    return _draft_plan(hf_dir, cfg, outtype, target_model_dir, ov)


def convert(hf_dir: PathLike, outfile: PathLike, *, outtype: str = "f16",
            target_model_dir: Optional[PathLike] = None, force: bool = False,
            progress: bool = True, **overrides: Any) -> Path:
    """Convert a Hugging Face model directory to a GGUF file and return its path.

    `outtype`: f32, f16, bf16, q8_0 or auto (the checkpoint's own 16-bit type). 1-D tensors and
    norms stay f32 whatever the outtype, as in llama.cpp.
    `target_model_dir`: required for drafts (DeepSpec, speculators, SpecForge, z-lab); the
    tokenizer is taken from it and the draft's embedding/lm head are compared against it.
    `overrides`: answers to what a checkpoint leaves open, see `Overrides` (sample_from_anchor,
    target_layer_convention, mask_token_id, block_size, tokenizer_pre, draft_format).

    Differences from llama.cpp's converter, all deliberate: drafts always carry
    `dflash.sample_from_anchor` and `dflash.has_confidence_head`, DSpark drafts also
    `dflash.markov_head_type`; gated/rnn Markov heads convert (`markov_gate.*`, `markov_joint.*`);
    a draft embedding equal to the target's is dropped; anything ambiguous is refused.
    Gemma-4: drafts with Gemma-4 layers also convert from the speculators format (llama.cpp's
    converter reads those layers as Qwen3's and fails) and keep a stated
    `final_logit_softcapping` (llama.cpp refuses it); a target without a stated global head
    size, or whose tokenizer and vocab_size disagree, is refused rather than guessed.
    """
    out_path = Path(outfile)
    check_destination(out_path, force)
    plan = build_plan(hf_dir, outtype=outtype, target_model_dir=target_model_dir, **overrides)
    for note in plan.notes:
        log.info("%s", note)
    return write_gguf(plan, out_path, force=force, progress=progress)
