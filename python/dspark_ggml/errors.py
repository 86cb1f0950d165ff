"""Exceptions raised by dspark-ggml: one hierarchy rooted at :class:`DSparkError`.

Each class mirrors a status code of the C API (``enum dspark_status``); the message is the C core's
own description of the problem (it names the file, key, tensor or argument at fault).
"""
from __future__ import annotations


class DSparkError(RuntimeError):
    """Base class of every error raised by dspark-ggml."""

    status: int = -100

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(DSparkError, ValueError):
    """A bad value from the caller (token, position, sequence id, batch size, ...). Nothing changed."""

    status = -1


class FileAccessError(DSparkError, OSError):
    """A file could not be opened or read."""

    status = -2


class FileFormatError(DSparkError):
    """A file is not a valid GGUF of a known model (truncated, foreign, missing key or tensor, bad shape)."""

    status = -3


class UnsupportedError(DSparkError):
    """Valid input that this build cannot handle (an architecture or option not implemented)."""

    status = -4


class OutOfMemoryError(DSparkError, MemoryError):
    status = -5


class ContextFullError(DSparkError):
    """The KV cache has no free cells for the batch. Nothing changed."""

    status = -6


class AbortedError(DSparkError):
    """The computation was stopped by the abort callback (e.g. Ctrl-C)."""

    status = -7


class DeviceLostError(DSparkError, ConnectionError):
    """A device stopped answering (an RPC server died or dropped the connection): what was placed on
    it cannot be used any more; models and contexts elsewhere keep working."""

    status = -8


_BY_STATUS = {cls.status: cls for cls in (InvalidArgumentError, FileAccessError, FileFormatError, UnsupportedError,
                                           OutOfMemoryError, ContextFullError, AbortedError, DeviceLostError)}


def error_for_status(status: int, message: str) -> DSparkError:
    """The exception instance for a C status code and message."""
    cls = _BY_STATUS.get(status, DSparkError)
    return cls(message or f"dspark error {status}", status)
