"""What a target architecture module provides to the converter (the registry is `archs/__init__.py`).

A `TargetArch` converts the Hugging Face checkpoints of one GGUF architecture: its hyperparameter
keys and tensors (`plan_target`), its tokenizer keys, and the sizes a draft is checked against.
A `DraftLayers` reads the decoder layers of drafts that are built from that architecture's
layers (their `model_type`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..backbone import Backbone, read_backbone
from ..hf_config import Config
from ..metadata import KeyValues
from ..options import Overrides
from ..plan import ModelPlan
from ..quant import OutType
from ..safetensors_io import Checkpoint
from ..tokenizer_meta import write_tokenizer_kv

LayerTable = dict[str, tuple[str, tuple[int, ...]]]  # HF name -> (GGUF name, shape)


@dataclass(frozen=True)
class TargetDims:
    """What a draft needs of its target: sizes, and where the language model's tensors live."""

    n_layer: int
    n_embd: int
    vocab_size: int
    prefix: str = "model."


class TargetArch:
    gguf_arch: str = ""
    hf_architectures: tuple[str, ...] = ()  # the config's `architectures` entries it converts
    add_space_prefix_key: bool = False  # write tokenizer.ggml.add_space_prefix (llama.cpp's llama does)

    def plan_target(self, ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, int]:
        """Hyperparameter keys and tensors of a target model (tokenizer keys are added by the
        caller), and its vocabulary size."""
        raise NotImplementedError

    def target_dims(self, cfg: Config) -> TargetDims:
        bb = read_backbone(cfg)
        return TargetDims(bb.n_layer, bb.n_embd, bb.vocab_size)

    def tokenizer_kv(self, tokenizer_dir: Path, vocab_size: int, kv: KeyValues, ov: Overrides) -> None:
        write_tokenizer_kv(tokenizer_dir, vocab_size, kv, add_space_prefix_key=self.add_space_prefix_key,
                           pre_override=ov.tokenizer_pre)


@dataclass(frozen=True)
class DraftBackbone:
    """A draft's decoder layers as the `dflash` GGUF writes them."""

    bb: Backbone  # the generic decoder keys
    layers: LayerTable  # every tensor the layers must have
    write_kv: Callable[[KeyValues], None]  # keys of the layers' arithmetic beyond the generic ones
    rope_freqs: Optional[np.ndarray] = None  # `rope_freqs.weight`, when the layers need one


class DraftLayers:
    name: str = ""  # for messages: the GGUF architecture whose layers these are
    model_types: tuple[str, ...] = ()  # the draft layer config's `model_type`
    deepspec_renames: dict[str, str] = {}  # stored prefix -> canonical, in DeepSpec checkpoints

    def check(self, backbone: Config, places: list[Config]) -> None:
        """Refuse what the dflash graph cannot run of these layers (`places`: every config the
        draft's fields may be stated in)."""

    def read(self, backbone: Config) -> DraftBackbone:
        raise NotImplementedError
