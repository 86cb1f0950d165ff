"""`dspark-ggml serve`: an OpenAI-compatible HTTP server over the speculative decoding engine.

One engine loop runs on its own thread (:mod:`.scheduler`); HTTP requests join its batch between
steps and leave when they finish (continuous batching). The HTTP side is FastAPI/Starlette on
uvicorn, installed by the optional ``[server]`` extra: this package imports without it (the CLI
lists `serve` and explains how to install it), only :mod:`.app` and :mod:`.serve` need it.

Modules, one concept each: ``cli`` (the verb's flags), ``config`` (what the server runs with),
``protocol`` (request parsing and validation), ``prompts`` (request -> engine requests),
``engines`` (per-request speculative / ignore_eos settings), ``scheduler`` (the engine loop),
``submission`` (one HTTP request's sequences, seen from asyncio), ``generation`` (answering them,
whole or streamed), ``responses`` (OpenAI's completion objects), ``responses_api`` (the Responses
API's objects and events), ``embeddings`` (/v1/embeddings), ``sse`` (server-sent events),
``metrics`` (Prometheus), ``security`` (API key, body limit, JSON bodies),
``errors`` (OpenAI-style error objects), ``state`` (loading and lifetime), ``app`` (routes),
``serve`` (uvicorn and signals).
"""
from __future__ import annotations

import importlib.util

INSTALL_HINT = "pip install 'dspark-ggml[server]'  (FastAPI and uvicorn)"
_REQUIRED = ("fastapi", "uvicorn")


def missing_dependencies() -> list[str]:
    """The server's third-party packages that are not installed."""
    return [name for name in _REQUIRED if importlib.util.find_spec(name) is None]
