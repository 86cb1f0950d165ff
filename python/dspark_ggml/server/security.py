"""Request guards: the API key (401), the body size limit (413), and JSON bodies the rest of the
server can take (400 otherwise: not JSON, nested too deep, a lone UTF-16 surrogate, NaN/Infinity).

The key is compared in constant time (hmac.compare_digest) so response timing does not reveal how
much of a guess was right. /health (and /v1/health) stay open so that load balancers and supervisors
can probe: llama-server's public endpoints, besides its web UI's files, which we do not serve.
"""
from __future__ import annotations

import hmac
import json
import re
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from starlette.requests import ClientDisconnect

from .errors import ApiError, bad_request, error_body

if TYPE_CHECKING:
    from starlette.requests import Request

OPEN_PATHS = frozenset({"/health", "/v1/health"})
DRAIN_FACTOR = 16  # a body this many times the limit is not read to its end
# a \uD800-\uDFFF escape: the only way a JSON body (UTF-8) can carry a surrogate
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected while sending its request: nobody is left to answer (not an error)."""


class ApiKeyMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streams and hide disconnects)."""

    def __init__(self, app: ASGIApp, api_key: str,
                 on_reject: Callable[[int], None] = lambda status: None) -> None:
        self.app = app
        self._key = api_key.encode()
        self._on_reject = on_reject

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        self._on_reject(401)
        body = json.dumps(error_body(401, "invalid or missing API key: send 'Authorization: Bearer <key>' (or 'X-Api-Key: <key>')",
                                     code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: dict) -> bool:
        """The key as llama-server takes it: from Authorization, else from X-Api-Key (what Anthropic's
        clients send), with or without a "Bearer " prefix."""
        headers = dict(scope.get("headers", []))
        given = headers.get(b"authorization") or headers.get(b"x-api-key") or b""
        if given.startswith(b"Bearer "):
            given = given[len(b"Bearer "):]
        return hmac.compare_digest(given, self._key)


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body; 413 beyond ``limit`` bytes (counted as it arrives: Content-Length
    may be absent or wrong), 400 if it is not JSON or not JSON the server can take; ClientGone if
    the client disconnected before sending it all."""
    chunks, size = [], 0
    stream = request.stream()
    try:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                await _discard(stream, size, DRAIN_FACTOR * limit)
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return parse_json(b"".join(chunks))


def parse_json(raw: bytes) -> Any:
    """JSON (RFC 8259: no NaN or Infinity) whose every string is valid Unicode. Nesting stops at
    Python's recursion limit; no field of a request nests (fields are checked for their shape), so
    nothing deeper than that reaches code that recurses."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:  # deeper than Python's recursion limit (about 1000): no request is
        raise bad_request("the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(value)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_unicode(value: Any) -> None:
    """400 when a string (or key) holds a lone UTF-16 surrogate: not Unicode text, nothing can encode it."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            strings = [v]
        elif isinstance(v, dict):
            strings = list(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
            continue
        else:
            continue
        for text in strings:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                bad = text[e.start:e.end].encode("unicode_escape").decode("ascii")
                raise bad_request(f"the request has a lone UTF-16 surrogate ({bad}) in a string: "
                                  "not valid Unicode") from None


async def _discard(stream: AsyncIterator[bytes], size: int, cap: int) -> None:
    """Read (and drop) the rest of a too-large body, up to ``cap`` bytes in all: closing a connection
    with unread data resets it, and the client would see the reset instead of the 413."""
    async for chunk in stream:
        size += len(chunk)
        if size > cap:
            return


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
