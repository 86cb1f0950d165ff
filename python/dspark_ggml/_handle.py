"""The lifetime of an object owned by the C core: one handle, freed once (close(), a `with` block,
or garbage collection), and an error instead of a crash when used after that."""
from __future__ import annotations

from typing import Any

from . import _lib


class NativeHandle:
    """Base of the Python objects that own a C handle; subclasses name the freeing function."""

    _free_function = ""    # the dspark_* function that frees the handle
    _kind = "object"       # for the "closed" error
    _handle: Any = None

    def close(self) -> None:
        """Free the native object now (idempotent)."""
        if getattr(self, "_handle", None) is not None:
            if self._free_function:
                getattr(_lib.lib(), self._free_function)(self._handle)
            self._handle = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def handle(self) -> Any:
        """The C handle; ValueError once closed."""
        if self._handle is None:
            raise ValueError(f"the {self._kind} is closed")
        return self._handle
