"""Models loaded by the C core: targets (qwen3, qwen2, llama, qwen3moe, gemma4) and DFlash/DSpark drafts."""
from __future__ import annotations

import os
from typing import Any, Sequence

from . import _lib
from ._handle import NativeHandle, int_property
from .gguf_file import GGUFFile


def set_tensor_split(params: Any, split: Sequence[float] | None) -> None:
    """Fill ``params.tensor_split`` (the core checks the values)."""
    if split is None:
        return
    values = [float(v) for v in split]
    limit = int(_lib.lib().DSPARK_MAX_DEVICES)
    if len(values) > limit:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"tensor_split has {len(values)} entries; at most {limit} devices")
    for i, v in enumerate(values):
        params.tensor_split[i] = v


class Model(NativeHandle):
    """A target model loaded from a GGUF file, with its weights on a device.

    Args:
        path: the GGUF file.
        device: device index (see :func:`dspark_ggml.devices`); -1 (default) picks the first GPU if
            there is one, else the CPU.
        use_mmap: compute from the memory-mapped file without copying (CPU). Default True.
        cpu_repack: on the CPU, copy the weights the backend can repack for faster matmuls (Q4_0,
            Q4_K, IQ4_NL on AVX2) into that layout, as llama.cpp does, and pack the 32-value block
            types (q8_0, q4_0, q4_1, q5_0, q5_1) for our kernel where the CPU has AVX-512 VNNI (the
            same results, faster). Default True.
        tensor_split: spread the repeating layers over devices in these proportions, by device
            index (``[1, 1]``: half on device 0, half on device 1), as llama.cpp's ``--tensor-split``;
            the embeddings and the head stay on ``device``. None (default): all on ``device``.

    Raises:
        FileAccessError, FileFormatError, UnsupportedError: naming the file and the problem.
    """

    _free_function = "dspark_model_free"
    _kind = "model"

    def __init__(self, path: str | os.PathLike[str], *, device: int = -1, use_mmap: bool = True,
                 cpu_repack: bool = True, tensor_split: Sequence[float] | None = None) -> None:
        self.path = os.fspath(path)
        lib, ffi = _lib.lib(), _lib.ffi()
        params = ffi.new("struct dspark_model_params *", lib.dspark_model_default_params())
        params.device = device
        params.use_mmap = use_mmap
        params.cpu_repack = cpu_repack
        set_tensor_split(params, tensor_split)
        self._handle: Any = _lib.check_ptr(lib.dspark_model_load_from_file(self.path.encode(), params))
        self.gguf = GGUFFile._borrow(lib.dspark_model_gguf(self._handle), self.path)

    @property
    def arch(self) -> str:
        return _lib.to_str(_lib.lib().dspark_model_arch(self.handle)) or ""

    @property
    def device(self) -> str:
        """The main device's name (embeddings, head)."""
        return _lib.to_str(_lib.lib().dspark_model_device(self.handle)) or ""

    @property
    def devices(self) -> list[str]:
        """Every device holding some of the weights, the main one first."""
        names = _lib.to_str(_lib.lib().dspark_model_devices(self.handle)) or ""
        return [n for n in names.split(",") if n]

    n_vocab = int_property("dspark_model_n_vocab")
    n_embd = int_property("dspark_model_n_embd")
    n_layer = int_property("dspark_model_n_layer")
    n_head = int_property("dspark_model_n_head")
    n_head_kv = int_property("dspark_model_n_head_kv")
    n_ctx_train = int_property("dspark_model_n_ctx_train")
    n_params = int_property("dspark_model_n_params")
    size = int_property("dspark_model_size", "Bytes of weights.")
    n_repacked = int_property("dspark_model_n_repacked",
                              "Weight tensors held in a faster CPU layout than the file's (cpu_repack).")

    @property
    def metadata(self) -> dict[str, Any]:
        return self.gguf.metadata

    def __repr__(self) -> str:
        return f"Model({self.path!r}, arch={self.arch!r}, n_layer={self.n_layer}, n_embd={self.n_embd})"
