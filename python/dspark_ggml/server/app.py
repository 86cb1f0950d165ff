"""The HTTP routes (FastAPI): OpenAI's endpoints (under /v1 and at the root, as llama-server),
Anthropic's /v1/messages and /v1/messages/count_tokens, plus llama-server's /health (and
/v1/health), /props, /apply-template, /tokenize, /detokenize and /metrics. No route reads or
writes a file: models are chosen at startup only."""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ..errors import DSparkError, InvalidArgumentError
from .embeddings import encode
from .errors import ApiError, bad_request, error_body, unavailable
from .generation import CompletionStream, respond_stream, respond_whole
from .logprobs import LogprobText
from .messages_api import MessageObject, MessagesRequest, MessageStream, anthropic_error, parse_messages
from .llama_info import props, token_pieces
from .prompts import chat_text, chat_token_count, choice_requests, prompt_tokens, tokenize
from .protocol import (GenerationRequest, parse_chat, parse_completion, parse_detokenize, parse_embeddings,
                       parse_responses, parse_tokenize)
from .responses import Extras, ResponseBuilder
from .responses_api import ResponseObject, ResponseStream
from .scheduler import QueueFullError
from .security import ApiKeyMiddleware, ClientGone, read_json
from .state import ServerState
from .submission import Submission

log = logging.getLogger("dspark_ggml.server")
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the metrics count it


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
    if state.config.cors_origins:
        # added last, so outermost: a preflight is answered before the API key is asked for, and
        # the API key's 401 carries the CORS headers (a browser may read why it failed)
        app.add_middleware(CORSMiddleware, allow_origins=state.config.cors_origins, allow_credentials=False,
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=["Retry-After"], max_age=600)
    _add_error_handlers(app, state)
    _add_generation_routes(app, state)
    _add_info_routes(app, state)
    return app


def _routes(app: FastAPI, method: str, *paths: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register one handler at several paths."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for path in paths:
            app.add_api_route(path, fn, methods=[method])
        return fn
    return register


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        state.metrics.record_response(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        state.metrics.record_response(CLIENT_CLOSED)
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        state.metrics.record_response(500)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    @_routes(app, "POST", "/v1/completions", "/completions")
    async def completions(request: Request) -> Any:
        body = await _body(state, request)
        c = state.config
        return await _generate(state, request, parse_completion(body, c.sampling, c.n_slots, c.capacity))

    @_routes(app, "POST", "/v1/chat/completions", "/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await _body(state, request)
        return await _generate(state, request, parse_chat(body, state.config.sampling, state.config.n_slots))

    @_routes(app, "POST", "/v1/responses", "/responses")
    async def responses(request: Request) -> Any:
        body = await _body(state, request)
        req = parse_responses(body, state.config.sampling, state.config.n_slots)
        return await _generate(state, request, req.chat, req.echo)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        try:
            req = parse_messages(await _body(state, request), state.config.sampling, state.config.n_slots)
            return await _generate(state, request, req.chat, messages=req)
        except ApiError as e:  # in the shape Anthropic's clients read
            state.metrics.record_response(e.status)
            return JSONResponse(anthropic_error(e), status_code=e.status, headers=e.headers)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        try:
            req = parse_messages(await _body(state, request), state.config.sampling, state.config.n_slots,
                                 counting=True)
            llm, _ = state.require_ready()
            return JSONResponse({"input_tokens": await run_in_threadpool(chat_token_count, llm, req.chat)})
        except ApiError as e:
            state.metrics.record_response(e.status)
            return JSONResponse(anthropic_error(e), status_code=e.status, headers=e.headers)

    @app.post("/apply-template")
    async def apply_template(request: Request) -> JSONResponse:
        """llama-server's: the chat route's parsing and template, no generation."""
        body = await _body(state, request)
        req = parse_chat(body, state.config.sampling, state.config.n_slots)
        llm, _ = state.require_ready()
        return JSONResponse({"prompt": await run_in_threadpool(chat_text, llm, req)})

    @_routes(app, "POST", "/v1/embeddings", "/embeddings")
    async def embeddings(request: Request) -> Any:
        return await _embeddings(state, request)


async def _body(state: ServerState, request: Request) -> Any:
    state.require_ready()
    return await read_json(request, state.config.max_body_bytes)


async def _generate(state: ServerState, request: Request, req: GenerationRequest,
                    echo: dict[str, Any] | None = None, messages: MessagesRequest | None = None) -> Response:
    """Run a parsed generation request; ``echo``: a Responses API request's fields to echo;
    ``messages``: a Messages API request (its answer in Anthropic's shape)."""
    llm, scheduler = state.require_ready()
    state.metrics.record_request(req.endpoint)
    # tokenizing (and rendering a chat template) is pure Python: off the event loop, so that a long
    # prompt does not stall the streams of everyone else
    prompts = await run_in_threadpool(prompt_tokens, llm, req)
    requests = choice_requests(llm, req, prompts)
    try:
        submission = Submission(scheduler, requests, req.speculative, req.cache_prompt)
    except QueueFullError as e:
        raise unavailable(str(e)) from None
    method = "none" if req.speculative is not None and req.speculative.off else llm.method
    n_prompt, n_choices = sum(len(p) for p in prompts), len(requests)
    builder = ResponseBuilder(req.endpoint, state.config.model_id, method, n_prompt, state.fingerprint,
                              req.include_usage, req.n, _extras(llm, req, prompts))
    response_obj = ResponseObject(builder, echo) if echo is not None else None
    message_obj = (MessageObject(builder, messages.stop_sequences, llm.detokenize)
                   if messages is not None else None)
    response: Response
    if req.stream:
        fmt = (ResponseStream(response_obj) if response_obj is not None else
               MessageStream(message_obj) if message_obj is not None else CompletionStream(builder))
        response = await respond_stream(submission, fmt, n_choices)
    else:
        choices = await respond_whole(submission, n_choices, request.receive)
        if choices is None:
            response = Response(status_code=CLIENT_CLOSED)
        elif response_obj is not None:
            response = JSONResponse(response_obj.whole(choices[0]))
        elif message_obj is not None:
            response = JSONResponse(message_obj.message(choices[0]))
        else:
            response = JSONResponse(builder.completion(choices))
    state.metrics.record_response(response.status_code)
    return response


def _extras(llm: Any, req: GenerationRequest, prompts: list[list[int]]) -> Extras:
    """What the response shows beyond text: logprobs, the echoed prompts, the tool calls."""
    echo = None
    if req.echo:
        echo = [p if isinstance(p, str) else (llm.detokenize(p) if llm.tokenizer is not None else "")
                for p in (req.prompts or [])]
    return Extras(logprobs=req.sampling.logprobs is not None, text=LogprobText(llm.tokenizer), echo=echo,
                  prompts=prompts if req.echo else None, tools=req.tools)


async def _embeddings(state: ServerState, request: Request) -> JSONResponse:
    llm, scheduler = state.require_ready()
    embedder = state.embedder
    assert embedder is not None
    req = parse_embeddings(await read_json(request, state.config.max_body_bytes))
    if req.dimensions is not None and req.dimensions != embedder.n_embd:
        raise bad_request(f"'dimensions' must be the model's ({embedder.n_embd}) if given: embeddings are "
                          f"not shortened", "dimensions")
    state.metrics.record_request("embeddings")

    def tokens_of_all() -> list[list[int]]:
        out = []
        for i, x in enumerate(req.inputs):
            tokens = tokenize(llm, x, "input")
            if not tokens:
                raise bad_request(f"input[{i}] has no tokens", "input")
            if len(tokens) > embedder.n_ctx:
                raise bad_request(f"input[{i}] has {len(tokens)} tokens; an embedding takes at most "
                                  f"{embedder.n_ctx} (--embeddings-ctx)", "input")
            out.append(tokens)
        return out

    inputs = await run_in_threadpool(tokens_of_all)
    data = []
    for i, tokens in enumerate(inputs):
        try:
            future = scheduler.call(lambda t=tokens: embedder.embed(t))
        except QueueFullError as e:
            raise unavailable(str(e)) from None
        try:
            vector = await asyncio.wrap_future(future)
        except InvalidArgumentError as e:
            raise bad_request(f"input[{i}]: {e}", "input") from e
        except DSparkError as e:  # the device, not the request
            raise ApiError(500, f"embedding failed: {e}") from e
        except QueueFullError as e:
            raise unavailable(str(e)) from None
        data.append({"object": "embedding", "index": i, "embedding": encode(vector, req.base64)})
    n_tokens = sum(len(t) for t in inputs)
    state.metrics.record_embedding(n_tokens)
    state.metrics.record_response(200)
    return JSONResponse({"object": "list", "data": data, "model": state.config.model_id,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    @_routes(app, "GET", "/health", "/v1/health")
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

    @_routes(app, "GET", "/v1/models", "/models")
    async def models() -> JSONResponse:
        llm, _ = state.require_ready()
        meta = {"n_ctx": llm.n_ctx, "n_vocab": llm.n_vocab, "n_embd": llm.model.n_embd, "method": llm.method,
                "n_draft": llm.n_draft, "n_slots": state.config.n_slots,
                "system_fingerprint": state.fingerprint}
        model = {"id": state.config.model_id, "object": "model", "created": int(time.time()),
                 "owned_by": "dspark-ggml", "meta": meta}
        return JSONResponse({"object": "list", "data": [model]})

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> JSONResponse:
        llm, _ = state.require_ready()
        body = await read_json(request, state.config.max_body_bytes)
        content, add_special, parse_special, with_pieces = parse_tokenize(body)
        tokens = _text_call(llm.tokenize, content, add_special=add_special, parse_special=parse_special)
        if with_pieces:  # a tokenizer exists: tokenize above needed one
            return JSONResponse({"tokens": token_pieces(llm.tokenizer, tokens)})
        return JSONResponse({"tokens": tokens})

    @app.get("/slots")
    async def slots_route(request: Request) -> JSONResponse:
        """llama-server's: each slot's job (running, or the last it ran); ``?fail_on_no_slot=1``
        answers 503 when every slot is busy."""
        if not state.config.endpoint_slots:
            raise ApiError(501, "this server does not serve /slots: it was started with --no-slots",
                           type="not_supported_error")
        llm, scheduler = state.require_ready()
        try:
            slots = await asyncio.wrap_future(scheduler.call(scheduler.slots))
        except QueueFullError as e:
            raise unavailable(str(e)) from None
        if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in slots):
            raise unavailable("no slot available")

        def with_prompts() -> list[dict[str, Any]]:
            for s in slots:
                s["n_ctx"] = llm.n_ctx  # the cells are shared: a slot may use all of them
                s.setdefault("speculative", llm.method != "none")
                tokens = s.pop("prompt_tokens", None)
                if tokens is not None:
                    s["prompt"] = llm.detokenize(tokens) if llm.tokenizer is not None else ""
            return slots

        return JSONResponse(await run_in_threadpool(with_prompts))

    @app.get("/props")
    async def props_route() -> JSONResponse:
        llm, _ = state.require_ready()
        return JSONResponse(props(state, llm))

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
