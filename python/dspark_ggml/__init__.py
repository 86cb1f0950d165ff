"""dspark-ggml: speculative decoding with DFlash and DSpark draft models on ggml.

    import dspark_ggml as dg
    llm = dg.LLM("target.gguf", draft_model_path="draft.gguf")
    print(llm.generate("def fibonacci(n):", max_tokens=64).text)

Names are imported on first use, so pure-Python parts (the converter, the tokenizer) import without
the native library, and `import dspark_ggml` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> module that defines it
_LAZY = {
    "LLM": "llm", "load": "llm",
    "SamplingParams": "sampling", "SpeculativeConfig": "speculative",
    "GenerationResult": "results", "GenerationChunk": "results", "GenerationStats": "results",
    "DSparkError": "errors",
    "Model": "model", "Context": "context", "DraftModel": "draft", "DraftContext": "draft",
    "Engine": "engine", "SpecStats": "engine",
    "Tokenizer": "tokenizer", "devices": "system", "system_info": "system",
    "add_rpc_server": "rpc", "serve_rpc": "rpc", "TokenLogprob": "logprobs",
}

__all__ = [
    "__version__", "LLM", "load", "SamplingParams", "SpeculativeConfig", "GenerationResult",
    "GenerationChunk", "GenerationStats", "DSparkError", "Model", "Context", "DraftModel", "DraftContext",
    "Engine", "SpecStats", "Tokenizer", "devices", "system_info", "add_rpc_server", "serve_rpc",
    "TokenLogprob",
]

if TYPE_CHECKING:
    from .context import Context
    from .draft import DraftContext, DraftModel
    from .engine import Engine, SpecStats
    from .errors import DSparkError
    from .llm import LLM, load
    from .logprobs import TokenLogprob
    from .model import Model
    from .results import GenerationChunk, GenerationResult, GenerationStats
    from .rpc import add_rpc_server, serve_rpc
    from .sampling import SamplingParams
    from .speculative import SpeculativeConfig
    from .system import devices, system_info
    from .tokenizer import Tokenizer


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
