"""Independent plain-numpy references of the target and draft forward math (float64).

TargetRef: qwen3 / llama / qwen2 targets, one sequence with a KV history (tests/reference/numpy_target.py).
DraftRef: DFlash / DSpark drafts: KV injection, block decoding, d2t, Markov heads, confidence
(tests/reference/numpy_draft.py). Weights use tests/tiny_models.py's orientation: numpy [out, in].
"""
from .common import RopeParams, apply_rope, rms_norm
from .numpy_draft import DraftRef, features_from_layer_inputs
from .numpy_target import TargetRef, target_rope

__all__ = ["TargetRef", "DraftRef", "features_from_layer_inputs", "target_rope", "RopeParams",
           "apply_rope", "rms_norm"]
