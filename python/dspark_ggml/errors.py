"""Exceptions raised by dspark-ggml: one hierarchy rooted at :class:`DSparkError`.

Each class mirrors a status code of the C API (``enum dspark_status``); the message is the C core's
own description of the problem (it names the file, key, tensor or argument at fault).
"""
from __future__ import annotations


class _HeaderStatus:
    """The ``status`` of an exception class: its enum dspark_status value, read from the header
    (through the loaded library, like the other enums) when first asked for; an instance made with
    an explicit status keeps its own."""

    def __get__(self, obj: object, owner: type) -> int:
        return status_codes()[_status_name(owner)]


class DSparkError(RuntimeError):
    """Base class of every error raised by dspark-ggml."""

    status: int = _HeaderStatus()  # type: ignore[assignment]

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(DSparkError, ValueError):
    """A bad value from the caller (token, position, sequence id, batch size, ...). Nothing changed."""


class FileAccessError(DSparkError, OSError):
    """A file could not be opened or read."""


class FileFormatError(DSparkError):
    """A file is not a valid GGUF of a known model (truncated, foreign, missing key or tensor, bad shape)."""


class UnsupportedError(DSparkError):
    """Valid input that this build cannot handle (an architecture or option not implemented)."""


class OutOfMemoryError(DSparkError, MemoryError):
    """The core could not allocate memory (host or device)."""
    status = -5


class ContextFullError(DSparkError):
    """The KV cache has no free cells for the batch. Nothing changed."""


class AbortedError(DSparkError):
    """The computation was stopped by the abort callback (e.g. Ctrl-C)."""


class ConstraintError(DSparkError):
    """A token constraint's callback (a grammar engine) raised or returned an error; the exception
    it raised is the __cause__ and ``seq_id`` the sequence whose constraint it was. A failing
    ``fill_masks`` fails its add / step before anything is committed (the next step goes on as if
    it had not run); a failing ``commit`` fails the step after it committed (its tokens can be
    read)."""

    seq_id: int = -1


class DeviceLostError(DSparkError, ConnectionError):
    """A device stopped answering (an RPC server died or dropped the connection): what was placed on
    it cannot be used any more; models and contexts elsewhere keep working."""


# The enum dspark_status name (DSPARK_STATUS_<NAME>, lower case) each class stands for.
_STATUS_NAMES: dict[type, str] = {
    DSparkError: "internal", InvalidArgumentError: "invalid_argument", FileAccessError: "io",
    FileFormatError: "bad_format", UnsupportedError: "unsupported", OutOfMemoryError: "out_of_memory",
    ContextFullError: "context_full", AbortedError: "aborted", DeviceLostError: "device_lost",
}


def status_codes() -> dict[str, int]:
    """enum dspark_status as ``{name: value}`` (from the header)."""
    from . import _lib  # _lib imports this module

    return _lib.enum("STATUS")


def _status_name(cls: type) -> str:
    return next(_STATUS_NAMES[c] for c in cls.__mro__ if c in _STATUS_NAMES)


def error_for_status(status: int, message: str) -> DSparkError:
    """The exception instance for a C status code and message."""
    codes = status_codes()
    cls = next((c for c, name in _STATUS_NAMES.items() if codes.get(name) == status and c is not DSparkError),
               DSparkError)
    return cls(message or f"dspark error {status}", status)
