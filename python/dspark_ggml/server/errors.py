"""Errors the HTTP API answers with, as OpenAI's error objects ({"error": {message, type, ...}})."""
from __future__ import annotations

from typing import Any

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "unavailable_error"}


class ApiError(Exception):
    """An HTTP error answer: status code, message, the request field at fault, extra headers."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, type: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.type = type  # None: the status's usual type
        self.extra = extra or {}  # more fields of the error object

    def body(self) -> dict[str, Any]:
        body = error_body(self.status, self.message, param=self.param, code=self.code, type=self.type)
        body["error"].update(self.extra)
        return body


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None, type: str | None = None) -> dict[str, Any]:
    """OpenAI's error object; the openai client raises the matching APIStatusError from it."""
    return {"error": {"message": message, "type": type or _TYPES.get(status, "server_error"), "param": param,
                      "code": code if code is not None else status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def exceed_context(message: str, n_prompt_tokens: int, n_ctx: int, param: str = "prompt") -> ApiError:
    """A prompt the context cannot hold: llama-server's exceed_context_size_error (400, with the
    prompt's token count and the context size), so that a client can shorten the prompt to fit."""
    return ApiError(400, message, param=param, type="exceed_context_size_error",
                    extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})


def unavailable(message: str, retry_after: int = 1) -> ApiError:
    """503: the client may retry after ``retry_after`` seconds (full queue, model still loading)."""
    return ApiError(503, message, headers={"Retry-After": str(retry_after)})
