"""User-supplied answers to questions a checkpoint leaves open (the converter's override flags)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

LAYER_CONVENTIONS = ("layer-output", "layer-input")
DRAFT_FORMATS = ("deepspec", "speculators", "specforge", "zlab")


@dataclass(frozen=True)
class Overrides:
    """Each field is None unless the user set it; every one has a same-named CLI flag."""

    # block layout of a draft: true = anchor-first (DSpark), false = anchor + N masks (DFlash)
    sample_from_anchor: Optional[bool] = None
    # how the draft config numbers target layers: "layer-output" (id L = output of decoder
    # layer L: DeepSpec, SpecForge, z-lab `target_layer_ids`) or "layer-input" (id k = hidden
    # state entering layer k: speculators/vLLM `aux_hidden_state_layer_ids`, and GGUF)
    target_layer_convention: Optional[str] = None
    mask_token_id: Optional[int] = None
    block_size: Optional[int] = None
    # llama.cpp pre-tokenizer name, when the tokenizer's split rule is not recognised
    tokenizer_pre: Optional[str] = None
    # skip format detection for a draft
    draft_format: Optional[str] = None

    @classmethod
    def from_kwargs(cls, values: dict[str, Any]) -> "Overrides":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"unknown conversion option(s): {', '.join(unknown)} "
                            f"(known: {', '.join(sorted(known))})")
        ov = cls(**{k: v for k, v in values.items() if v is not None})
        ov._validate()
        return ov

    def _validate(self) -> None:
        if self.sample_from_anchor is not None and not isinstance(self.sample_from_anchor, bool):
            raise TypeError("sample_from_anchor must be a bool")
        if self.target_layer_convention not in (None, *LAYER_CONVENTIONS):
            raise ValueError(f"target_layer_convention must be one of {LAYER_CONVENTIONS}")
        if self.draft_format not in (None, *DRAFT_FORMATS):
            raise ValueError(f"draft_format must be one of {DRAFT_FORMATS}")
        for name in ("mask_token_id", "block_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"{name} must be a non-negative integer")
