"""What the server runs with, apart from the models: network, slots, limits, request defaults."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError
from ..sampling import SamplingParams

DEFAULT_MAX_BODY = 4 << 20  # a 128k-token prompt as JSON token ids fits; a runaway upload does not
DEFAULT_EMBEDDINGS_CTX = 2048
_ORIGIN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+")


@dataclass
class ServerConfig:
    """Server settings.

    Attributes:
        host, port: where to listen; 127.0.0.1 by default (loopback only: exposing the server is a
            deliberate choice).
        n_slots: sequences decoded at once (engine sequence ids; a request with n choices takes n).
        queue_size: sequences that may wait for a slot; beyond that requests get 503.
        api_key: when set, every endpoint but /health and /v1/health needs the key
            (``Authorization: Bearer <key>``, or ``X-Api-Key``, as llama-server).
        max_body_bytes: larger request bodies get 413.
        model_id: the name /v1/models lists (requests may name any model: there is one).
        sampling: defaults for fields a request leaves out (max_tokens, temperature, ...).
        shutdown_timeout: seconds SIGTERM waits for requests in flight before cancelling them.
        cors_origins: origins a browser may call the API from (CORS); "*" = any; empty (default) =
            no CORS headers. Preflight requests (OPTIONS) need no API key; credentials are not allowed.
        embeddings_n_ctx: the longest /v1/embeddings input in tokens (the size of the embeddings'
            own context, created at the first such request).
        cache_prompt: the prompt cache: a finished request's KV cells stay with its slot and a new
            request reuses the longest prefix of its prompt found there (its ``cache_prompt`` field
            can decline); False (``--no-cache-prompt``): every request prefills its whole prompt.
        endpoint_slots: GET /slots (llama-server's, on by default as there): what each slot runs or
            last ran, prompts and generated text included; ``--no-slots`` turns it off.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    n_slots: int = 4
    queue_size: int = 64
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    model_id: str = "dspark-ggml"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    shutdown_timeout: float = 60.0
    cors_origins: list[str] = field(default_factory=list)
    embeddings_n_ctx: int = DEFAULT_EMBEDDINGS_CTX
    cache_prompt: bool = True
    endpoint_slots: bool = True

    def validate(self) -> None:
        if not 1 <= self.n_slots <= 256:
            raise InvalidArgumentError(f"-np/--parallel must be in 1 .. 256, got {self.n_slots}")
        if self.queue_size < 0:
            raise InvalidArgumentError(f"--queue-size must be >= 0, got {self.queue_size}")
        if self.max_body_bytes < 1024:
            raise InvalidArgumentError(f"--max-body must be at least 1024 bytes, got {self.max_body_bytes}")
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"--port must be in 0 .. 65535, got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise InvalidArgumentError("--api-key is empty")
        for origin in self.cors_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise InvalidArgumentError(f"--cors-origins: {origin!r} is not an origin "
                                           "(scheme://host[:port], no path, or *)")
        if self.embeddings_n_ctx < 1:
            raise InvalidArgumentError(f"--embeddings-ctx must be >= 1, got {self.embeddings_n_ctx}")
        self.sampling.validate()

    @property
    def capacity(self) -> int:
        """Sequences admitted at once: running plus waiting."""
        return self.n_slots + self.queue_size
