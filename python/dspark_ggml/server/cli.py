"""`dspark-ggml serve`: the verb's flags (llama-server's names where it has one) and its start.

Importable without the ``[server]`` extra: ``dspark-ggml --help`` lists the verb, and running it
without FastAPI/uvicorn says how to install them.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..cli.args import (add_model_arguments, add_sampling_arguments, add_speculative_arguments, build_llm,
                        model_paths, sampling_from_args)
from . import INSTALL_HINT, missing_dependencies
from .config import DEFAULT_EMBEDDINGS_CTX, DEFAULT_MAX_BODY, ServerConfig

API_KEY_ENV = "DSPARK_GGML_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    g = p.add_argument_group("server", "Here -t defaults to all cores but one (left to the HTTP side), "
                             "the contexts run batch-invariant kernels (on the CPU our attention node, or ggml's reference "
                             "kernels in builds without it): a request gets the same tokens in any batch, and "
                             "--spec-schedule defaults to adaptive (block length per step from measured costs "
                             "and acceptance: shorter blocks, or none, as the batch grows).")
    g.add_argument("--host", default=d.host,
                   help=f"address to listen on (default: {d.host}, this machine only)")
    g.add_argument("--port", type=int, default=d.port, help=f"port (default: {d.port})")
    g.add_argument("-np", "--parallel", dest="n_slots", type=int, default=d.n_slots, metavar="N",
                   help=f"sequences decoded at once, batched in each verify step (default: {d.n_slots})")
    g.add_argument("--queue-size", type=int, default=d.queue_size, metavar="N",
                   help=f"sequences that may wait for a slot; more get HTTP 503 (default: {d.queue_size})")
    g.add_argument("--api-key", metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' (or X-Api-Key: KEY) on every endpoint but /health "
                        f"(default: ${API_KEY_ENV} if set, else none)")
    g.add_argument("--max-body", dest="max_body_bytes", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES",
                   help=f"largest request body; larger ones get HTTP 413 (default: {DEFAULT_MAX_BODY})")
    g.add_argument("--cors-origins", metavar="ORIGINS", default="",
                   help="comma-separated origins browsers may call the API from (CORS), or * for any; "
                        "preflight requests need no API key, credentials are not allowed (default: none, "
                        "no CORS headers)")
    g.add_argument("--embeddings-ctx", dest="embeddings_n_ctx", type=int, default=DEFAULT_EMBEDDINGS_CTX,
                   metavar="N", help=f"longest /v1/embeddings input in tokens: the size of the embeddings' "
                                     f"own context, created at the first request "
                                     f"(default: {DEFAULT_EMBEDDINGS_CTX})")
    g.add_argument("--no-cache-prompt", dest="cache_prompt", action="store_false",
                   help="no prompt cache: a request's KV cells are freed when it finishes and every request "
                        "prefills its whole prompt (default: cached; a new request reuses the longest "
                        "prefix of its prompt a finished one left, least recently used cells reclaimed first)")
    g.add_argument("--slots", dest="endpoint_slots", action=argparse.BooleanOptionalAction, default=True,
                   help="GET /slots: what each slot runs or last ran, its prompt and text included "
                        "(default: on, as llama-server; --no-slots turns it off)")
    g.add_argument("-a", "--alias", metavar="NAME",
                   help="model name in /v1/models (default: the target's file name)")
    g.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout, metavar="SECONDS",
                   help=f"on SIGTERM, wait this long for requests in flight "
                        f"(default: {d.shutdown_timeout:g})")
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="server log level (default: info)")
    add_model_arguments(p)
    add_speculative_arguments(p)
    add_sampling_arguments(p)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    target, _ = model_paths(args)
    name = args.alias or ("dspark-ggml-demo" if args.demo else os.path.splitext(os.path.basename(target))[0])
    return ServerConfig(host=args.host, port=args.port, n_slots=args.n_slots, queue_size=args.queue_size,
                        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                        max_body_bytes=args.max_body_bytes, model_id=name, sampling=sampling_from_args(args),
                        shutdown_timeout=args.shutdown_timeout,
                        cors_origins=[o.strip() for o in args.cors_origins.split(",") if o.strip()],
                        embeddings_n_ctx=args.embeddings_n_ctx, cache_prompt=args.cache_prompt,
                        endpoint_slots=args.endpoint_slots)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    config.validate()  # bad flags first: they are wrong with or without the extra
    missing = missing_dependencies()
    if missing:
        print(f"dspark-ggml serve needs {' and '.join(missing)}, which are not installed: {INSTALL_HINT}",
              file=sys.stderr)
        return 1
    from .serve import serve

    if args.n_threads is None:
        # one core stays for the HTTP side: ggml's workers spin while they wait, and with every core
        # theirs the event loop (and the engine thread handing it tokens) starves
        args.n_threads = max(1, (os.cpu_count() or 2) - 1)
    if args.schedule is None:
        # a fixed block costs more than it brings once the batch is large (the verify stops getting
        # cheaper per token): the server lets each step choose
        args.schedule = "adaptive"
    # ggml's CPU kernels change with the batch's shape (flash attention tiles from 64 queries and
    # splits the cache for a lone one; K-quant matmuls tile from 8 rows) and round differently, so a
    # sequence's logits would depend on its batch mates (seen: up to 0.04 apart). The reference
    # kernels compute each row alike in any batch, sampled requests included; with them flash
    # attention (which skips other sequences' cells) is also the faster choice at every batch size.
    return serve(config, lambda: build_llm(args, n_seq_max=config.n_slots, batch_invariant=True),
                 log_level=args.log_level)
