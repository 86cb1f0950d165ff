"""Speculative decoding options: which draft method, how many draft tokens, how they are verified."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .errors import InvalidArgumentError

METHODS = ("auto", "dflash", "dspark", "none")

# Other spellings people bring from llama.cpp (--spec-type) and vLLM (speculative_config).
_METHOD_ALIASES = {"draft-dflash": "dflash", "draft-dspark": "dspark"}
_KEY_ALIASES = {"num_speculative_tokens": "n_max", "num_draft_tokens": "n_max"}


@dataclass
class SpeculativeConfig:
    """How the draft model proposes tokens and the target verifies them.

    Attributes:
        method: "auto" (default: "dspark" when the draft has a Markov head, else "dflash"),
            "dflash", "dspark" (must match the draft given), or "none" (target only, even when a
            draft is given; the draft is then not loaded). llama.cpp's "draft-dflash" and
            "draft-dspark" are accepted and normalised.
        n_max: draft tokens per verify step; 0 (default) = the most the draft allows (its trained
            block size, or block size - 1 for the anchor + masks layout). Larger values are clamped.
        n_min: draft nothing in a step where fewer than n_min tokens would be verified. Default 0.
        p_min: DSpark with a confidence head: cut the block at the first position whose confidence
            is below p_min. 0.0 (default) = off. Like transformers' assistant_confidence_threshold.
        draft_mode: "greedy" (default: argmax chain, accepted where the target's own sample
            matches) or "probabilistic" (sampled chain with rejection sampling; lossless in
            distribution at temperature > 0).
        schedule: "auto" (default: "confidence" when the draft's confidence head is calibrated,
            else "adaptive"), "static" (verify n_max tokens every step, cut by p_min), "adaptive" (per
            step one block length, 0 .. n_max, that maximises expected tokens per ms from measured
            draft and verify costs and each sequence's running acceptance: shorter blocks, or no
            draft at all where drafting does not pay, as with a weak draft or a large batch) or
            "confidence" (adaptive, then DSpark's prefix scheduler; needs a confidence head). Both
            calibrate their costs at load (about a second on a CPU). With a draft that does not
            pay they keep to within a few percent of decoding without it, where "static" loses two
            thirds; where drafting pays, "adaptive" keeps what "static" gets and the confidence cut
            needs a head whose confidences mean what they say (bench/bench_default.py).
        backend_sampling: where the target's verify rows are sampled: True = inside its ggml graph,
            False = on the host, "auto" (default) = in the graph when every sequence of the batch is
            greedy (measured faster there), on the host otherwise.
        markov_top_k: DSpark, argmax drafting: add the Markov bias to each slot's top-k base
            candidates only, reading k rows of the Markov matrix per slot instead of all of them
            (large vocabularies on the CPU); 0 (default) = exact. 64 loses almost no acceptance.
    """

    method: str = "auto"
    n_max: int = 0
    n_min: int = 0
    p_min: float = 0.0
    draft_mode: str = "greedy"
    schedule: str = "auto"
    backend_sampling: bool | str = "auto"
    markov_top_k: int = 0

    def __post_init__(self) -> None:
        self.method = _METHOD_ALIASES.get(self.method, self.method)

    def validate(self) -> None:
        """Raise InvalidArgumentError naming the first bad field: the method and n_min against n_max
        here, the rest by the core's rules (dspark_spec_check, as the engine applies them)."""
        if self.method not in METHODS:
            raise InvalidArgumentError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.n_max > 0 and self.n_min > self.n_max:
            raise InvalidArgumentError(f"n_min ({self.n_min}) must not exceed n_max ({self.n_max})")
        from . import _lib
        from .engine import spec_params  # the header's enums (loads the library)

        fields = {k: v for k, v in asdict(self).items() if k != "method"}
        fields["schedule"] = self.resolved_schedule(calibrated_confidence=False)  # "auto": what it may become
        _lib.check(_lib.lib().dspark_spec_check(spec_params(**fields)))

    def resolved_schedule(self, calibrated_confidence: bool) -> str:
        """The schedule that runs with a draft that has (or lacks) a calibrated confidence head:
        "auto" resolved, any other value as it is."""
        if self.schedule != "auto":
            return self.schedule
        return "confidence" if calibrated_confidence else "adaptive"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeculativeConfig:
        """Build from a dict (e.g. parsed JSON); vLLM's num_speculative_tokens is read as n_max.

        Raises:
            InvalidArgumentError: an unknown key or a bad value.
        """
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = _KEY_ALIASES.get(key, key)
            if name not in names:
                raise InvalidArgumentError(f"unknown speculative option {key!r}; "
                                           f"known: {', '.join(sorted(names))}")
            values[name] = value
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (round-trips through from_dict and JSON)."""
        return asdict(self)


def coerce_speculative(value: SpeculativeConfig | Mapping[str, Any] | None) -> SpeculativeConfig:
    """A validated SpeculativeConfig from a config, a dict or None (the defaults)."""
    if value is None:
        config = SpeculativeConfig()
    elif isinstance(value, SpeculativeConfig):
        config = value
    elif isinstance(value, Mapping):
        return SpeculativeConfig.from_dict(value)
    else:
        raise TypeError(f"speculative must be a SpeculativeConfig, a dict or None, "
                        f"got {type(value).__name__}")
    config.validate()
    return config


def resolve_method(method: str, draft_kind: str | None, draft_path: str | None = None) -> str:
    """The method to run: "dflash", "dspark" or "none".

    Args:
        method: the requested method (SpeculativeConfig.method).
        draft_kind: "dflash" / "dspark" as the loaded draft declares it (DraftInfo.kind), or None
            when there is no draft.
        draft_path: for error messages.

    Raises:
        InvalidArgumentError: a method that needs a draft without one, or a draft of the other kind.
    """
    if method == "none":
        return "none"
    if draft_kind is None:
        if method == "auto":
            return "none"
        raise InvalidArgumentError(f"method {method!r} needs a draft model (draft_model_path)")
    if method == "auto" or method == draft_kind:
        return draft_kind
    what = ("a DSpark draft (it has a Markov head)" if draft_kind == "dspark"
            else "a DFlash draft (no Markov head)")
    raise InvalidArgumentError(f"{draft_path or 'the draft'} is {what}, but method {method!r} was asked for; "
                               f"use method='{draft_kind}' or 'auto'")
