"""Loading the native library through cffi (ABI mode) and checking its status codes.

The C declarations come from the installed public header ``include/dspark.h`` (the part between its
cdef markers), so the binding and the C API cannot drift apart. The library directory is
``$DSPARK_GGML_LIB_PATH`` if set, else the ``lib`` folder next to ``_build_info.py``, which CMake
installs beside the binaries (this also holds in an editable install).
"""
from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import DSparkError, error_for_status

_LIB_NAMES = {"linux": "libdspark.so", "darwin": "libdspark.dylib", "win32": "dspark.dll"}


def _package_dir() -> Path:
    try:
        from . import _build_info  # installed by CMake next to lib/ and include/
    except ImportError as e:  # pragma: no cover - only when the package was never built
        raise DSparkError("the native library of dspark-ggml is not built; install the package with pip") from e
    return Path(_build_info.__file__).resolve().parent


def lib_dir() -> Path:
    """Directory holding libdspark and the ggml libraries."""
    env = os.environ.get("DSPARK_GGML_LIB_PATH")
    return Path(env) if env else _package_dir() / "lib"


def header_path() -> Path:
    env = os.environ.get("DSPARK_GGML_HEADER")
    return Path(env) if env else _package_dir() / "include" / "dspark.h"


def cdef_from_header(text: str) -> str:
    """The cffi declarations of the header: the cdef region without attributes or directives."""
    m = re.search(r"/\* @cdef-begin \*/(.*?)/\* @cdef-end \*/", text, re.S)
    if not m:
        raise DSparkError("dspark.h has no cdef region")
    lines = []
    for line in m.group(1).splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not re.match(r"#define\s+\w+\s+-?\d+\s*$", stripped):
            continue
        lines.append(line.replace("DSPARK_API ", ""))
    return "\n".join(lines)


@lru_cache(maxsize=None)
def _load() -> tuple[Any, Any]:
    from cffi import FFI

    ffi = FFI()
    header = header_path().read_text()
    ffi.cdef(cdef_from_header(header))
    name = _LIB_NAMES.get(sys.platform, "libdspark.so")
    path = lib_dir() / name
    if not path.exists():
        raise DSparkError(f"native library not found at {path}")
    lib = ffi.dlopen(str(path))
    # Resolve the freeing functions now: a handle's __del__ can run during garbage collection while
    # this thread holds cffi's (non-reentrant) lock, and a first lookup there waits for it forever.
    for name in set(re.findall(r"\b(dspark_\w+_(?:free|close))\s*\(", header)):
        getattr(lib, name)
    lib.dspark_backend_load_all(str(path.parent).encode())
    return ffi, lib


def ffi() -> Any:
    return _load()[0]


def lib() -> Any:
    return _load()[1]


def last_error() -> str:
    return ffi().string(lib().dspark_last_error()).decode("utf-8", "replace")


def check(status: int) -> int:
    """Raise the matching DSparkError if a C call returned a negative status; else return it."""
    if status < 0:
        raise error_for_status(status, last_error())
    return status


def check_ptr(ptr: Any) -> Any:
    """Raise the thread's last error if a C constructor returned NULL; else return the pointer."""
    if ptr == ffi().NULL:
        raise error_for_status(lib().dspark_last_status(), last_error())
    return ptr


def to_str(p: Any) -> str | None:
    return None if p == ffi().NULL else ffi().string(p).decode("utf-8", "replace")


@lru_cache(maxsize=None)
def enum(prefix: str, **renamed: str) -> dict[str, int]:
    """The header's constants ``DSPARK_<prefix>_<NAME>`` as ``{name.lower(): value}``, with names
    that the Python API spells otherwise renamed (``renamed={"max_tokens": "length"}``): the values
    are the header's, never typed twice."""
    head = f"DSPARK_{prefix}_"
    out = {}
    for name in dir(lib()):
        if name.startswith(head):
            key = name[len(head):].lower()
            out[renamed.get(key, key)] = int(getattr(lib(), name))
    if not out:
        raise DSparkError(f"dspark.h declares no DSPARK_{prefix}_* constants")
    return out

