"""The linked ggml build, its devices, and the CPU's feature flags."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import _lib



@dataclass(frozen=True)
class Device:
    index: int
    name: str
    description: str
    type: str
    memory_free: int
    memory_total: int


def devices() -> list[Device]:
    """Every device ggml offers in this build, in registry order (the index used by ``device=``)."""
    lib, ffi = _lib.lib(), _lib.ffi()
    types = {value: name for name, value in _lib.enum("DEVICE_TYPE").items()}
    out = []
    for i in range(lib.dspark_device_count()):
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        if lib.dspark_device_memory(i, free, total) != 0:  # a lost RPC server: listed, with no memory
            free[0] = total[0] = 0
        out.append(Device(i, _lib.to_str(lib.dspark_device_name(i)) or "",
                          _lib.to_str(lib.dspark_device_description(i)) or "",
                          types.get(lib.dspark_device_type(i), "?"), int(free[0]), int(total[0])))
    return out


def system_info() -> str:
    """ggml version, backends and CPU features of the linked build."""
    return _lib.to_str(_lib.lib().dspark_system_info()) or ""


def library_version() -> str:
    return _lib.to_str(_lib.lib().dspark_version()) or ""


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the OS reports them ("avx512_bf16", "amx_int8", ...; Linux's
    /proc/cpuinfo). Empty where it does not say. What the OS reports, not what our kernels use
    (``quant.cpu_isa``): AMX tiles, for one, also need the OS to grant them."""
    try:
        match = re.search(r"^flags\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return set()
    return set(match.group(1).split()) if match else set()
