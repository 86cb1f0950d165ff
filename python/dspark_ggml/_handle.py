"""The lifetime of an object owned by the C core: one handle, freed once (close(), a `with` block,
or garbage collection), and an error instead of a crash when used after that."""
from __future__ import annotations

from typing import Any, Callable

from . import _lib


class Closing:
    """close() on leaving a `with` block and on garbage collection (close() must be idempotent)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class NativeHandle(Closing):
    """Base of the Python objects that own a C handle; subclasses name the freeing function."""

    _free_function = ""    # the dspark_* function that frees the handle
    _kind = "object"       # for the "closed" error
    _handle: Any = None
    _abort_cb: Any = None  # the installed cffi abort callback (kept alive while installed)

    def close(self) -> None:
        """Free the native object now (idempotent)."""
        if getattr(self, "_handle", None) is not None:
            if self._free_function:
                getattr(_lib.lib(), self._free_function)(self._handle)
            self._handle = None

    @property
    def handle(self) -> Any:
        """The C handle; ValueError once closed."""
        if self._handle is None:
            raise ValueError(f"the {self._kind} is closed")
        return self._handle

    def _set_abort_callback(self, setter: str, callback: Callable[[], Any] | None) -> None:
        """Install ``callback`` through the C function ``setter`` (a true result aborts the
        computation), or remove it (None). The cffi callback is kept alive with the object."""
        ffi = _lib.ffi()
        if callback is None:
            self._abort_cb = None
            getattr(_lib.lib(), setter)(self.handle, ffi.NULL, ffi.NULL)
            return
        self._abort_cb = ffi.callback("bool(void *)", lambda _data: bool(callback()))
        getattr(_lib.lib(), setter)(self.handle, self._abort_cb, ffi.NULL)


def int_property(function: str, doc: str | None = None) -> property:
    """A read-only property: the integer the C function ``function(handle)`` returns."""
    return property(lambda self: int(getattr(_lib.lib(), function)(self.handle)), doc=doc)
