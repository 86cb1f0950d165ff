"""Running the app on uvicorn: listen, load, serve; SIGTERM (or Ctrl-C) drains and exits.

On SIGTERM uvicorn stops accepting connections and waits for the requests in flight (up to
``shutdown_timeout``, then cancels them); the lifespan's end then stops the engine loop and frees
the models. uvicorn re-raises the signal after its shutdown: our SIGTERM handler is a no-op, so
that a drained server exits 0 instead of dying of the signal.
"""
from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING, Callable

import uvicorn

from .app import create_app
from .state import ServerState

if TYPE_CHECKING:
    from ..llm import LLM
    from .config import ServerConfig


def serve(config: ServerConfig, load: Callable[[], LLM], log_level: str = "info") -> int:
    """Serve until SIGTERM / Ctrl-C; returns the exit status (1 when the models failed to load)."""
    config.validate()
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s", stream=sys.stderr)
    server: uvicorn.Server | None = None

    def load_failed(exc: BaseException) -> None:
        print(f"dspark-ggml serve: error: {exc}", file=sys.stderr)
        if server is not None:
            server.should_exit = True

    def ready() -> None:
        print(f"dspark-ggml serve: serving {config.model_id} on http://{config.host}:{config.port} "
              f"({config.n_slots} slots)", file=sys.stderr, flush=True)

    state = ServerState(config, load, on_load_failure=load_failed, on_ready=ready)
    uv_config = uvicorn.Config(create_app(state), host=config.host, port=config.port, log_level=log_level,
                               timeout_graceful_shutdown=config.shutdown_timeout, access_log=False,
                               lifespan="on", server_header=False)
    server = uvicorn.Server(uv_config)
    signal.signal(signal.SIGTERM, _drained)
    server.run()
    return 1 if state.load_error is not None else 0


def _drained(signum: int, frame: object) -> None:
    """SIGTERM after uvicorn's own handler has drained the server: nothing left to do."""
