"""DFlash / DSpark draft checkpoints: which format a directory is in, and what it says.

Four formats exist in the wild (docs/reference/external-formats.md §1):

* deepspec    DeepSpec dense `Qwen3DSparkModel` / `Gemma4DSparkModel`: flat config
              (`target_layer_ids`, `block_size`, `mask_token_id`, `markov_*`); carries copies of
              the target embedding and lm head; anchor-first block.
* speculators vLLM speculators (`transformer_layer_config` nested, `aux_hidden_state_layer_ids`,
              `sample_from_anchor`, optional reduced draft vocab with `d2t`/`t2d`).
* specforge   SpecForge (`DSparkDraftModel` with a nested `dflash_config`); no embedding or head;
              states no block layout.
* zlab        z-lab DFlash (`DFlashDraftModel`): backbone only; anchor + N masks block.

The draft layers are Qwen3 layers, or Gemma-4 layers (`model_type` gemma4_text, in DeepSpec's
`Gemma4DSparkModel` or a speculators `transformer_layer_config`) for Gemma-4 targets.

`read_draft` turns any of them into one `DraftSpec`. Nothing ambiguous is guessed: a missing
or contradictory fact is an error naming the override flag that settles it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .archs import DRAFT_LAYERS, TARGETS, draft_layers
from .archs.base import DraftLayers
from .errors import ConversionError
from .hf_config import Config, agreed
from .options import Overrides

GEMMA4_DRAFT = "Gemma4DSparkModel"

# how each id-list field numbers target layers (see Overrides.target_layer_convention)
_LAYER_ID_FIELDS = {"target_layer_ids": "layer-output", "aux_hidden_state_layer_ids": "layer-input"}


@dataclass(frozen=True)
class LayerIds:
    field: str  # where it was read, for messages
    ids: list[int]
    convention: str


@dataclass
class DraftSpec:
    """Everything the GGUF writer needs to know about a draft, independent of its format."""

    source_format: str
    backbone: Config  # hyperparameters of the draft layers
    layer_arch: DraftLayers  # the architecture of the draft layers (archs.draft_layers)
    block_size: int
    layer_ids: list[LayerIds]  # as found; resolved against the target later
    layer_convention_override: Optional[str]
    mask_token_id: int
    sample_from_anchor: bool
    draft_vocab_size: Optional[int]
    markov_rank: Optional[int]  # as configured (checked against the tensors)
    markov_head_type: Optional[str]
    confidence_head: Optional[bool]  # `enable_confidence_head`
    confidence_with_markov: Optional[bool]
    confidence_temperatures: Optional[list[float]]  # per predicting slot (sequential temperature scaling)
    num_target_layers: Optional[int]
    target_hidden_size: Optional[int]
    causal: Optional[bool]
    sliding_window: Optional[int]
    sliding_layers: Optional[list[bool]]
    scalars: dict[str, float] = field(default_factory=dict)  # optional float keys by GGUF key
    renames: dict[str, str] = field(default_factory=dict)  # stored prefix -> canonical prefix
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# format detection


def detect_format(cfg: Config, override: Optional[str]) -> str:
    if override:
        return override
    if "transformer_layer_config" in cfg.data or "speculators_model_type" in cfg.data:
        return "speculators"
    arch = cfg.architecture()
    has_dflash_config = "dflash_config" in cfg.data
    if arch == "DFlashDraftModel":
        return "zlab"
    if arch == "DSparkDraftModel" and has_dflash_config:
        return "specforge"
    if arch == GEMMA4_DRAFT:
        return "deepspec"
    if arch == "Qwen3DSparkModel":
        # SpecForge's "flat" re-export also says Qwen3DSparkModel but keeps its dflash_config
        return "specforge" if has_dflash_config else "deepspec"
    raise ConversionError(f"{cfg.where}: architecture {arch!r} is neither a supported target "
                          f"({', '.join(TARGETS)}) nor a known DFlash/DSpark draft "
                          "format; if it is a draft, pass --draft-format")


def is_draft_config(cfg: Config) -> bool:
    return ("transformer_layer_config" in cfg.data or "speculators_model_type" in cfg.data
            or cfg.architecture() in ("DFlashDraftModel", "DSparkDraftModel", "Qwen3DSparkModel",
                                      GEMMA4_DRAFT))


# ----------------------------------------------------------------------------------------------
# reading a field that may be stated in several places (hf_config.agreed), or given by a flag


def _settle(name: str, flag: str, stated: Any, override: Any, default: Any = None,
            why_default: str = "") -> tuple[Any, str]:
    """Combine a config value, the user's override and a format default into one value + a note."""
    if stated is not None and override is not None and stated != override:
        raise ConversionError(f"config.json states {name}={stated!r} but {flag} {override!r} was "
                              "given; remove the flag or fix the config")
    if stated is not None:
        return stated, f"{name}={stated!r} (from config.json)"
    if override is not None:
        return override, f"{name}={override!r} (from {flag})"
    if default is not None:
        return default, f"{name}={default!r} ({why_default})"
    return None, ""


# ----------------------------------------------------------------------------------------------
# per-format readers


def _layer_ids(places: list[Config]) -> list[LayerIds]:
    found = []
    for key, convention in _LAYER_ID_FIELDS.items():
        ids = agreed(key, places, lambda c, k: c.int_list(k, None))
        if ids is not None:
            found.append(LayerIds(key, ids, convention))
    return found


def _common(cfg: Config, places: list[Config], ov: Overrides, fmt: str, backbone: Config,
            anchor_default: Optional[bool], anchor_why: str) -> DraftSpec:
    notes: list[str] = [f"draft format: {fmt}"]

    def settle(name: str, flag: str, read, default=None, why=""):
        value, note = _settle(name, flag, agreed(name, places, read), getattr(ov, name),
                              default, why)
        if value is None:
            raise ConversionError(f"{cfg.where}: the draft does not state {name}; pass {flag}")
        notes.append(note)
        return value

    block_size = settle("block_size", "--block-size", lambda c, k: c.int(k, None, minimum=1))
    mask = settle("mask_token_id", "--mask-token-id", lambda c, k: c.int(k, None, minimum=0))
    anchor = settle("sample_from_anchor", "--sample-from-anchor",
                    lambda c, k: c.bool(k, None), anchor_default, anchor_why)
    if not anchor and block_size < 2:
        raise ConversionError(f"{cfg.where}: block_size {block_size} leaves no draft slot in the "
                              "anchor + masks layout")
    layer_arch = draft_layers(backbone)
    layer_arch.check(backbone, places)
    return DraftSpec(
        source_format=fmt, backbone=backbone, layer_arch=layer_arch, block_size=block_size,
        layer_ids=_layer_ids(places), layer_convention_override=ov.target_layer_convention,
        mask_token_id=mask, sample_from_anchor=anchor,
        draft_vocab_size=agreed("draft_vocab_size", places, lambda c, k: c.int(k, None, minimum=1)),
        markov_rank=agreed("markov_rank", places, lambda c, k: c.int(k, None, minimum=0)),
        markov_head_type=agreed("markov_head_type", places, lambda c, k: c.str(k, None)),
        confidence_head=agreed("enable_confidence_head", places, lambda c, k: c.bool(k, None)),
        confidence_with_markov=agreed("confidence_head_with_markov", places,
                                       lambda c, k: c.bool(k, None)),
        confidence_temperatures=agreed("confidence_temperatures", places, lambda c, k: c.float_list(k, None)),
        num_target_layers=agreed("num_target_layers", places, lambda c, k: c.int(k, None)),
        target_hidden_size=agreed("target_hidden_size", places, lambda c, k: c.int(k, None)),
        causal=None, sliding_window=None, sliding_layers=None, notes=notes,
    )


def _layer_types(backbone: Config) -> list[str]:
    n = backbone.int("num_hidden_layers", minimum=1)
    types = backbone.str_list("layer_types", None)
    if types is None:
        # what transformers derives when the config does not list them
        window_from = backbone.int("max_window_layers", n)
        sliding = backbone.bool("use_sliding_window", False)
        types = ["sliding_attention" if sliding and i >= window_from else "full_attention"
                 for i in range(n)]
    if len(types) != n or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ConversionError(f"{backbone.where}: layer_types should list 'full_attention' or "
                              f"'sliding_attention' for each of the {n} layers")
    return types


def _sliding_layout(spec: DraftSpec, backbone: Config, dflash_config: Optional[Config]) -> None:
    use_swa = dflash_config is not None and dflash_config.bool("use_swa", False)
    sliding = [True] * backbone.int("num_hidden_layers") if use_swa else [
        t == "sliding_attention" for t in _layer_types(backbone)]
    if not any(sliding):
        return
    window = (dflash_config.int("swa_window_size", None) if dflash_config else None) \
        or backbone.int("sliding_window", None, minimum=1)
    if window is None:
        raise ConversionError(f"{backbone.where}: sliding-window layers without a sliding_window")
    spec.sliding_window, spec.sliding_layers = window, sliding
    spec.notes.append(f"sliding window {window} on layers "
                      f"{[i for i, s in enumerate(sliding) if s]}")


def _causal_flag(spec: DraftSpec, places: list[Config]) -> None:
    causal = agreed("is_causal", places, lambda c, k: c.bool(k, None))
    stated = agreed("causal", places, lambda c, k: c.bool(k, None))
    if causal is not None and stated is not None and causal != stated:
        raise ConversionError("is_causal and dflash_config.causal disagree")
    spec.causal = causal if causal is not None else stated


def _speculators_causal(spec: DraftSpec, cfg: Config) -> None:
    """speculators: sliding-window layers are causal inside the block unless
    `sliding_window_non_causal`; full-attention layers never are. GGUF has one flag for all."""
    if not spec.sliding_layers:
        return
    if cfg.bool("sliding_window_non_causal", False):
        spec.causal = False
        return
    if not all(spec.sliding_layers):
        raise ConversionError(f"{cfg.where}: some layers attend causally inside the block "
                              "(sliding-window) and others not (full attention); GGUF has a "
                              "single dflash.attention.causal flag, so this draft cannot be "
                              "converted faithfully")
    spec.causal = True
    spec.notes.append("block-internal attention is causal (speculators sliding-window layers)")


def _optional_scalars(spec: DraftSpec, places: list[Config]) -> None:
    # config field -> GGUF key (same fields llama.cpp's DFlash converter reads)
    pairs = {"attention_value_scale": "{arch}.attention.value_scale",
             "output_multiplier": "{arch}.logit_scale",
             "final_logit_softcapping": "{arch}.final_logit_softcapping",
             "input_embedding_scale": "{arch}.embedding_scale"}
    for name, key in pairs.items():
        value = agreed(name, places, lambda c, k: c.float(k, None))
        if value is not None and not (name == "final_logit_softcapping" and value <= 0):
            spec.scalars[key] = value


def _refuse_unsupported(places: list[Config]) -> None:
    for c in places:
        if c.data.get("rope_is_neox_style") is False:
            raise ConversionError(f"{c.where}: interleaved-rope drafts (rope_is_neox_style=false) "
                                  "are not supported")
        if "conv_kernel_size" in c.data:
            raise ConversionError(f"{c.where}: DFlash2 drafts are not supported")


def _read_deepspec(cfg: Config, ov: Overrides) -> DraftSpec:
    places = [cfg]
    spec = _common(cfg, places, ov, "deepspec", cfg, True, "DeepSpec drafts are anchor-first")
    spec.renames = dict(spec.layer_arch.deepspec_renames)
    _sliding_layout(spec, cfg, None)
    _causal_flag(spec, places)
    return spec


def _read_speculators(cfg: Config, ov: Overrides) -> DraftSpec:
    layer = cfg.sub("transformer_layer_config")
    if layer is None:
        raise ConversionError(f"{cfg.where}: speculators config without transformer_layer_config")
    if layer.str("model_type") not in DRAFT_LAYERS:
        raise ConversionError(f"{layer.where}: only {', '.join(DRAFT_LAYERS)} draft layers are "
                              f"supported, not {layer.str('model_type')!r}")
    kind = cfg.str("speculators_model_type", None)
    if kind not in (None, "dspark", "dflash"):
        raise ConversionError(f"{cfg.where}: speculators_model_type {kind!r} is not a DFlash/DSpark draft")
    places = [cfg]  # draft fields live at the top level; the nested config is the backbone
    spec = _common(cfg, places, ov, "speculators", layer, None, "")
    _sliding_layout(spec, layer, None)
    _speculators_causal(spec, cfg)
    return spec


def _read_specforge(cfg: Config, ov: Overrides) -> DraftSpec:
    dflash = cfg.sub("dflash_config")
    places = [cfg] + ([dflash] if dflash else [])
    spec = _common(cfg, places, ov, "specforge", cfg, None, "")
    _sliding_layout(spec, cfg, dflash)
    _causal_flag(spec, places)
    spec.renames = {"logit_head.markov_head.": "markov_head.",
                    "logit_head.confidence_head.": "confidence_head."}
    return spec


def _read_zlab(cfg: Config, ov: Overrides) -> DraftSpec:
    dflash = cfg.sub("dflash_config")
    places = [cfg] + ([dflash] if dflash else [])
    spec = _common(cfg, places, ov, "zlab", cfg, False,
                   "DFlash drafts predict from the slots after the anchor")
    _sliding_layout(spec, cfg, dflash)
    _causal_flag(spec, places)
    return spec


_READERS = {"deepspec": _read_deepspec, "speculators": _read_speculators,
            "specforge": _read_specforge, "zlab": _read_zlab}


def read_draft(cfg: Config, ov: Overrides) -> DraftSpec:
    fmt = detect_format(cfg, ov.draft_format)
    places = [cfg] + [c for c in (cfg.sub("dflash_config"), cfg.sub("transformer_layer_config")) if c]
    _refuse_unsupported(places)
    spec = _READERS[fmt](cfg, ov)
    _optional_scalars(spec, places)
    return spec


# ----------------------------------------------------------------------------------------------
# target layer ids


def _to_gguf(ids: list[int], convention: str) -> list[int]:
    return [i + 1 for i in ids] if convention == "layer-output" else list(ids)


def _fits(ids: list[int], n_target_layers: int) -> bool:
    return bool(ids) and len(set(ids)) == len(ids) and all(0 <= i < n_target_layers for i in ids)


def resolve_target_layers(spec: DraftSpec, n_target_layers: int) -> list[int]:
    """The draft's target layer ids in GGUF numbering (id k = hidden state entering layer k)."""
    flag = "--target-layer-convention"
    if not spec.layer_ids:
        raise ConversionError("the draft config has no target_layer_ids or "
                              "aux_hidden_state_layer_ids")
    chosen = spec.layer_ids
    override = spec.layer_convention_override
    if override and len(chosen) > 1:
        chosen = [x for x in chosen if x.convention == override]
    elif override:
        chosen = [LayerIds(chosen[0].field, chosen[0].ids, override)]
    converted = {x.field: _to_gguf(x.ids, x.convention) for x in chosen}
    if len({tuple(v) for v in converted.values()}) > 1:
        stated = ", ".join(f"{x.field}={x.ids}" for x in chosen)
        raise ConversionError(f"the draft config gives {stated}, which name different target "
                              f"layers; pass {flag} layer-output to use target_layer_ids or "
                              "layer-input to use aux_hidden_state_layer_ids")
    ids = next(iter(converted.values()))
    if not _fits(ids, n_target_layers):
        src = chosen[0]
        other = "layer-input" if src.convention == "layer-output" else "layer-output"
        hint = (f"; if they are numbered the other way pass {flag} {other}"
                if _fits(_to_gguf(src.ids, other), n_target_layers) else "")
        raise ConversionError(f"{src.field}={src.ids} read as {src.convention} gives target layers "
                              f"{ids}, not distinct layers of the target's {n_target_layers}{hint}")
    spec.notes.append(f"target layers {ids} (GGUF numbering, from {chosen[0].field} read as "
                      f"{chosen[0].convention})")
    return ids
