"""Request guards: the API key (401) and the body size limit (413).

The key is compared in constant time (hmac.compare_digest) so response timing does not reveal how
much of a guess was right. /health stays open so that load balancers and supervisors can probe.
"""
from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from .errors import ApiError, bad_request, error_body

if TYPE_CHECKING:
    from starlette.requests import Request

OPEN_PATHS = frozenset({"/health"})
DRAIN_FACTOR = 16  # a body this many times the limit is not read to its end
ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class ApiKeyMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streams and hide disconnects)."""

    def __init__(self, app: ASGIApp, api_key: str,
                 on_reject: Callable[[int], None] = lambda status: None) -> None:
        self.app = app
        self._key = ("Bearer " + api_key).encode()
        self._on_reject = on_reject

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        self._on_reject(401)
        body = json.dumps(error_body(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                                     code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: dict) -> bool:
        given = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        return hmac.compare_digest(given, self._key)


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body; 413 beyond ``limit`` bytes (counted as it arrives: Content-Length
    may be absent or wrong), 400 if it is not JSON."""
    chunks, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            await _discard(stream, size, DRAIN_FACTOR * limit)
            raise _too_large(limit)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None


async def _discard(stream: AsyncIterator[bytes], size: int, cap: int) -> None:
    """Read (and drop) the rest of a too-large body, up to ``cap`` bytes in all: closing a connection
    with unread data resets it, and the client would see the reset instead of the 413."""
    async for chunk in stream:
        size += len(chunk)
        if size > cap:
            return


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
