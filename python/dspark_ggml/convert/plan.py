"""What will be written: metadata plus an ordered list of tensors, each with a lazy data source.

Sources yield a tensor as consecutive blocks of whole rows (PyTorch order, first dimension split),
so the writer never holds more than one block. A plan is built completely (and validated) before
the output file is opened.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from gguf import GGMLQuantizationType

from .metadata import KeyValues
from .quant import encoded_nbytes
from .safetensors_io import TensorRef, iter_row_blocks, read_rows


class TensorSource(Protocol):
    shape: tuple[int, ...]  # PyTorch order

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]: ...


@dataclass(frozen=True)
class StoredTensor:
    """A tensor as stored in a safetensors file."""

    ref: TensorRef

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.shape

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        return iter_row_blocks(self.ref, max_bytes)


@dataclass(frozen=True)
class HeadPermutedTensor:
    """A q/k projection (weight or bias) reordered within each head from HF's rotate-half rope
    layout to the interleaved layout llama.cpp's `llama` architecture expects.

    Per head the rows are [first half | second half]; GGUF wants them interleaved (row j of the
    first half, then row j of the second half). Whole heads are read at a time."""

    ref: TensorRef
    n_heads: int

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.shape

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        head_rows = self.ref.n_rows // self.n_heads
        row_bytes = max(1, self.ref.row_elements * 4)
        heads_per_block = max(1, max_bytes // (head_rows * row_bytes))
        for first in range(0, self.n_heads, heads_per_block):
            n = min(heads_per_block, self.n_heads - first)
            rows = read_rows(self.ref, first * head_rows, (first + n) * head_rows)
            rest = rows.shape[1:]
            yield (rows.reshape(n, 2, head_rows // 2, *rest).swapaxes(1, 2)
                   .reshape(n * head_rows, *rest))


@dataclass(frozen=True)
class ShiftedTensor:
    """A stored tensor plus a constant, added in float32: Gemma-2/3 norms, whose RMSNorm multiplies
    by 1 + weight, are written as llama.cpp's converter writes them, with the 1 added."""

    ref: TensorRef
    shift: float

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.shape

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        for rows in iter_row_blocks(self.ref, max_bytes):
            yield rows.astype(np.float32) + np.float32(self.shift)


@dataclass(frozen=True)
class ArrayTensor:
    """A small tensor computed by the converter (rope factors, absolute d2t ids)."""

    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        yield self.array


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    source: TensorSource
    qtype: GGMLQuantizationType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def nbytes(self) -> int:
        return encoded_nbytes(self.shape, self.qtype)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass
class ModelPlan:
    arch: str
    kv: KeyValues
    tensors: list[PlannedTensor] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # decisions worth telling the user

    def add(self, tensor: PlannedTensor) -> None:
        if any(t.name == tensor.name for t in self.tensors):
            raise AssertionError(f"tensor {tensor.name} planned twice")
        self.tensors.append(tensor)
