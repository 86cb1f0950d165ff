"""Rewrite a GGUF with some keys or tensors dropped or replaced (for tests that need a broken or
hand-made file)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import gguf
import numpy as np


def rewrite_gguf(src: Path, dst: Path, *, drop_keys: tuple[str, ...] = (), set_keys: Mapping[str, Any] | None = None,
                 drop_tensors: tuple[str, ...] = (), tensors: Mapping[str, np.ndarray] | None = None) -> Path:
    """Copy src to dst; `tensors` replaces (or adds) tensors with float32/int64 arrays in numpy
    orientation (ggml ne reversed); `set_keys` replaces string/int/float/bool values."""
    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(dst, arch)
    set_keys = dict(set_keys or {})
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
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
            w.add_tensor(t.name, np.ascontiguousarray(tensors.pop(t.name)))
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
