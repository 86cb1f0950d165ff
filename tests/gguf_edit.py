"""Rewrite a GGUF with some keys or tensors dropped or replaced (for tests that need a broken or
hand-made file)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import gguf
import numpy as np


def rewrite_gguf(src: Path, dst: Path, *, drop_keys: tuple[str, ...] = (), set_keys: Mapping[str, Any] | None = None,
                 drop_tensors: tuple[str, ...] = (), tensors: Mapping[str, Any] | None = None,
                 alignment: int | None = None) -> Path:
    """Copy src to dst; `tensors` replaces (or adds) tensors with arrays in numpy orientation (ggml
    ne reversed; the dtype sets the GGUF type: float32, float16, int32, int64, ...) or with
    (raw bytes, GGMLQuantizationType) pairs for quantized data; `set_keys` replaces
    string/int/float/bool values; `alignment` writes general.alignment and pads the data to it."""
    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(dst, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    set_keys = dict(set_keys or {})
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment") or name in drop_keys:
            continue
        if name in set_keys:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, field.contents())
        else:
            w.add_key_value(name, field.contents(), vtype)
    for name, value in set_keys.items():
        if isinstance(value, bool):
            w.add_bool(name, value)
        elif isinstance(value, int):
            w.add_uint32(name, value)
        elif isinstance(value, float):
            w.add_float32(name, value)
        else:
            w.add_string(name, str(value))
    tensors = dict(tensors or {})
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        if t.name in tensors:
            _add(w, t.name, tensors.pop(t.name))
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, arr in tensors.items():
        _add(w, name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _add(w: gguf.GGUFWriter, name: str, value: Any) -> None:
    if isinstance(value, tuple):  # (raw bytes, quantization type)
        data, qtype = value
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.uint8), raw_dtype=qtype)
    else:
        w.add_tensor(name, np.ascontiguousarray(value))
