"""The HTTP routes (FastAPI): OpenAI's /v1 endpoints plus llama-server's /health, /tokenize,
/detokenize and /metrics. No route reads or writes a file: models are chosen at startup only."""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import DSparkError
from .errors import ApiError, error_body, unavailable
from .generation import respond_stream, respond_whole
from .prompts import choice_requests, prompt_tokens
from .protocol import parse_chat, parse_completion, parse_detokenize, parse_tokenize
from .responses import ResponseBuilder
from .scheduler import QueueFullError
from .security import ApiKeyMiddleware, read_json
from .state import ServerState
from .submission import Submission

log = logging.getLogger("dspark_ggml.server")


def create_app(state: ServerState) -> FastAPI:
    """The ASGI app over ``state``; loading starts with the app's lifespan, freeing ends it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start()
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="dspark-ggml", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    if state.config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.config.api_key,
                           on_reject=state.metrics.record_response)
    _add_error_handlers(app, state)
    _add_generation_routes(app, state)
    _add_info_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        state.metrics.record_response(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        state.metrics.record_response(500)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _generate(state, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _generate(state, request, parse_chat)


async def _generate(state: ServerState, request: Request, parse: Any) -> Any:
    llm, scheduler = state.require_ready()
    body = await read_json(request, state.config.max_body_bytes)
    req = parse(body, state.config.sampling, state.config.n_slots)
    state.metrics.record_request(req.endpoint)
    # tokenizing (and rendering a chat template) is pure Python: off the event loop, so that a long
    # prompt does not stall the streams of everyone else
    tokens = await run_in_threadpool(prompt_tokens, llm, req)
    requests = choice_requests(llm, req, tokens)
    try:
        submission = Submission(scheduler, requests, req.speculative)
    except QueueFullError as e:
        raise unavailable(str(e)) from None
    method = "none" if req.speculative is not None and req.speculative.off else llm.method
    builder = ResponseBuilder(req.endpoint, state.config.model_id, method, len(tokens))
    if req.stream:
        response: Response = await respond_stream(submission, builder, req.n, req.include_usage)
    else:
        result = await respond_whole(submission, builder, req.n, request.receive)
        # 499 (nginx's "client closed request"): nobody reads it, the metrics count it
        response = JSONResponse(result) if result is not None else Response(status_code=499)
    state.metrics.record_response(response.status_code)
    return response


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if not state.ready:
            err = state.not_ready()
            return JSONResponse({**err.body(), "status": "loading" if state.load_error is None else "error"},
                                status_code=503, headers=err.headers)
        lost = state.scheduler.device_lost if state.scheduler is not None else None
        if lost is not None:  # an RPC server died: nothing can be served until a restart
            return JSONResponse({"status": "error", "error": {"message": lost, "type": "server_error"}},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        llm, _ = state.require_ready()
        meta = {"n_ctx": llm.n_ctx, "n_vocab": llm.n_vocab, "method": llm.method, "n_draft": llm.n_draft,
                "n_slots": state.config.n_slots}
        model = {"id": state.config.model_id, "object": "model", "created": int(time.time()),
                 "owned_by": "dspark-ggml", "meta": meta}
        return JSONResponse({"object": "list", "data": [model]})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        llm, _ = state.require_ready()
        body = await read_json(request, state.config.max_body_bytes)
        content, add_special, parse_special = parse_tokenize(body)
        return JSONResponse({"tokens": _text_call(llm.tokenize, content, add_special=add_special,
                                                  parse_special=parse_special)})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        llm, _ = state.require_ready()
        tokens = parse_detokenize(await read_json(request, state.config.max_body_bytes), llm.n_vocab)
        return JSONResponse({"content": _text_call(llm.detokenize, tokens)})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.gauges()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")


def _text_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A tokenizer call; its errors (no tokenizer in the GGUF, ...) are the request's (400)."""
    try:
        return fn(*args, **kwargs)
    except (DSparkError, ValueError) as e:
        raise ApiError(400, str(e)) from e
