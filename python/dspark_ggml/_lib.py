"""Loading the native library through cffi (ABI mode) and checking its status codes.

The C declarations come from the installed public header ``include/dspark.h`` (the part between its
cdef markers), so the binding and the C API cannot drift apart. The library directory is
``$DSPARK_GGML_LIB_PATH`` if set, else the ``lib`` folder next to ``_build_info.py``, which CMake
installs beside the binaries (this also holds in an editable install).
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import DSparkError, error_for_status

logger = logging.getLogger("dspark_ggml")

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
    _install_log_callback(ffi, lib)
    lib.dspark_backend_load_all(str(path.parent).encode())
    return ffi, lib


# enum dspark_log_level -> logging level
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_log_callback: Any = None  # the cffi callback: alive for the whole process (C may call it any time)


def _install_log_callback(ffi: Any, lib: Any) -> None:
    """Route the core's and ggml's log messages to ``logging.getLogger("dspark_ggml")``.

    The core may log from any thread, ggml's workers and the RPC call threads included; cffi takes
    the GIL for each call, and the callback never raises into C. The callback object is kept for
    the life of the process (a thread may be inside it while another replaces it), and at exit the
    core goes back to its own stderr output before the interpreter is torn down. With no logging
    configured, Python's last-resort handler prints warnings and errors to stderr, as the core did.
    """
    global _log_callback

    def forward(level: int, text: Any, _user_data: Any) -> None:
        try:
            lvl = _LOG_LEVELS.get(level, logging.DEBUG)
            if logger.isEnabledFor(lvl):
                msg = ffi.string(text).decode("utf-8", "replace").rstrip("\n")
                if msg:
                    logger.log(lvl, msg)
        except Exception:  # noqa: BLE001 - nothing may propagate into C
            pass

    _log_callback = ffi.callback("void(int32_t, const char *, void *)", forward)
    lib.dspark_log_set(_log_callback, ffi.NULL)
    atexit.register(lib.dspark_log_set, ffi.NULL, ffi.NULL)


def ffi() -> Any:
    return _load()[0]


def lib() -> Any:
    return _load()[1]


def last_error() -> str:
    return ffi().string(lib().dspark_last_error()).decode("utf-8", "replace")


def status_str(status: int) -> str:
    """The C API's name of a status code ("invalid argument", "context full", ...)."""
    return to_str(lib().dspark_status_str(status)) or f"status {status}"


def _error(status: int) -> DSparkError:
    """The exception of a failed call: the thread's last error message, or else the status's name."""
    return error_for_status(status, last_error() or f"{status_str(status)} (status {status})")


def check(status: int) -> int:
    """Raise the matching DSparkError if a C call returned a negative status; else return it."""
    if status < 0:
        raise _error(status)
    return status


def check_ptr(ptr: Any) -> Any:
    """Raise the thread's last error if a C constructor returned NULL; else return the pointer."""
    if ptr == ffi().NULL:
        raise _error(lib().dspark_last_status())
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

