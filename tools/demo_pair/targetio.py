"""Running the HF target: load it, and capture the hidden states the draft is fed.

DeepSpec convention: target layer id L means the OUTPUT of decoder layer L (0-based), i.e. HF
``output_hidden_states[L + 1]``, the raw residual stream before the final norm. We capture it
with forward hooks on the decoder layers, so there is no doubt about which entry is meant.
"""

from __future__ import annotations

import os

import torch


def load_target(target_dir: str):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class FeatureTap:
    """Forward hooks that keep the outputs of the chosen decoder layers of the last call."""

    def __init__(self, model, layer_ids):
        self.layer_ids = list(layer_ids)
        self.store = {}
        self.handles = []
        for lid in self.layer_ids:
            layer = model.model.layers[lid]
            self.handles.append(layer.register_forward_hook(self._hook(lid)))

    def _hook(self, lid):
        def fn(module, inputs, output):
            self.store[lid] = output[0] if isinstance(output, tuple) else output
        return fn

    def features(self) -> torch.Tensor:
        """[B, S, n*d] concatenation in target_layer_ids order."""
        return torch.cat([self.store[lid] for lid in self.layer_ids], dim=-1)

    def remove(self):
        for h in self.handles:
            h.remove()


def tokenizer_path(target_dir: str) -> str:
    return os.path.join(target_dir, "tokenizer.json")
