"""The server's lifetime: load the models in the background (/health answers 503 meanwhile), run
the engine loop, and free everything at shutdown."""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Callable

from .._version import __version__
from .embeddings import Embedder
from .engines import EnginePool
from .errors import ApiError, unavailable
from .metrics import Metrics
from .prompt_cache import PromptCache
from .scheduler import Scheduler

if TYPE_CHECKING:
    from ..llm import LLM
    from .config import ServerConfig

log = logging.getLogger("dspark_ggml.server")


class ServerState:
    """What the routes share.

    Args:
        config: the server settings.
        load: builds the LLM (its target context must take ``config.n_slots`` sequences); runs on a
            background thread.
        on_load_failure: called (on that thread) with the exception when loading fails.
        on_ready: called (on that thread) once requests are served.
    """

    def __init__(self, config: ServerConfig, load: Callable[[], LLM],
                 on_load_failure: Callable[[BaseException], None] = lambda e: None,
                 on_ready: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.metrics = Metrics()
        self.llm: LLM | None = None
        self.scheduler: Scheduler | None = None
        self.embedder: Embedder | None = None
        self.fingerprint = ""  # system_fingerprint, once loaded
        self.load_error: BaseException | None = None
        self._pool: EnginePool | None = None
        self._load = load
        self._on_load_failure = on_load_failure
        self._on_ready = on_ready
        self._loader = threading.Thread(target=self._load_models, name="dspark-loader", daemon=True)

    def start(self) -> None:
        self._loader.start()

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    def require_ready(self) -> tuple[LLM, Scheduler]:
        """The LLM and scheduler, or a 503 while loading."""
        if self.llm is None or self.scheduler is None:
            raise self.not_ready()
        return self.llm, self.scheduler

    def not_ready(self) -> ApiError:
        """The 503 of a request that came too early (or after a failed load)."""
        what = "the model is loading" if self.load_error is None else "the model failed to load"
        return unavailable(what, retry_after=5)

    def _load_models(self) -> None:
        try:
            llm = self._load()
            if llm.n_seq_max < self.config.n_slots:
                raise ValueError(f"the context takes {llm.n_seq_max} sequences, the server needs "
                                 f"{self.config.n_slots}")
            self.fingerprint = system_fingerprint(llm)
            self.embedder = Embedder(llm, self.config.embeddings_n_ctx)
            pool = EnginePool(llm)
            caches = [llm.context.kv] + ([llm.draft_context.kv] if llm.draft_context is not None else [])
            cache = PromptCache(caches, llm.n_ctx, self.config.cache_prompt)
            scheduler = Scheduler(pool, llm.tokenizer, self.config.n_slots, self.config.capacity,
                                  self.metrics, cache)
            scheduler.start()
        except BaseException as e:  # noqa: BLE001 (reported, then the server exits)
            self.load_error = e
            self._on_load_failure(e)
            return
        self.llm, self._pool, self.scheduler = llm, pool, scheduler
        self._on_ready()

    def close(self) -> None:
        """Stop the engine loop (cancelling what is left) and free the engines and models."""
        if self._loader.ident is not None:  # started
            self._loader.join()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self._pool is not None:
            self._pool.close()
        if self.embedder is not None:  # its context before the model it computes with
            self.embedder.close()
        if self.llm is not None:
            self.llm.close()
        self.llm = self.scheduler = self._pool = self.embedder = None

    def gauges(self) -> dict[str, tuple[str, Callable[[], float]]]:
        """The live values /metrics reads: queue depth, busy and total slots, readiness."""
        s = self.scheduler
        return {"queue_depth": ("sequences waiting for a slot", lambda: s.queue_depth if s else 0),
                "slots_busy": ("slots running a sequence", lambda: s.busy_slots if s else 0),
                "slots_cached": ("idle slots whose KV cells stay for the prompt cache",
                                 lambda: s.cached_slots if s else 0),
                "slots": ("slots: sequences decoded at once (-np)", lambda: self.config.n_slots),
                "kv_cells_used": ("target KV cells in use: running sequences' and the prompt cache's",
                                  lambda: s.kv_cells_used[0] if s else 0),
                "draft_kv_cells_used": ("draft KV cells in use (0 without a draft)",
                                        lambda: s.kv_cells_used[1] if s and len(s.kv_cells_used) > 2 else 0),
                "prompt_cache_cells": ("target KV cells the idle slots hold for the prompt cache (shared ones "
                                       "counted per slot): at idle, kv_cells_used is at most this",
                                       lambda: s.kv_cells_used[-1] if s else 0),
                "ready": ("1 once the model is loaded", lambda: 1 if self.ready else 0)}


def system_fingerprint(llm: LLM) -> str:
    """"dspark-ggml-<version>-<hash>": the hash of the model files' names and sizes and of the
    build (ggml version and commit, backends, CPU features, the native libraries' sizes). Stable
    while the same files run on the same build; a changed model or build changes it."""
    from .. import _lib
    from ..system import library_version, system_info

    h = hashlib.sha256()
    parts = [__version__, library_version(), system_info()]
    paths = [llm.model.path] + ([llm.draft_model.path] if llm.draft_model is not None else [])
    try:
        lib_dir = _lib.lib_dir()
        paths += [os.path.join(lib_dir, name) for name in sorted(os.listdir(lib_dir))]
    except OSError:
        pass
    for path in paths:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        parts.append(f"{os.path.basename(path)}:{size}")
    h.update("\n".join(parts).encode())
    return f"dspark-ggml-{__version__}-{h.hexdigest()[:12]}"
