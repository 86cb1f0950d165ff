"""llama-server's informational answers: GET /props, the pieces of POST /tokenize, and the
request parameters GET /slots shows.

/props gives the fields of llama-server's that hold here, with the values this server runs with.
Samplers we do not have are not listed (a client would take them for settings it could change);
features we lack are reported off: no vision or audio input, no POST /props, no web UI.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._version import __version__

if TYPE_CHECKING:
    from ..llm import LLM
    from ..sampling import SamplingParams
    from ..tokenizer import Tokenizer
    from .state import ServerState

RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: "a fresh random seed per request"


def token_pieces(tokenizer: Tokenizer, tokens: list[int]) -> list[dict[str, Any]]:
    """{id, piece} per token, as llama-server's /tokenize with_pieces: the piece is the token's
    text when its bytes are valid UTF-8, else the list of its byte values (half a character)."""
    out = []
    for t in tokens:
        raw = tokenizer.token_to_piece(t, special=True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return out


def props(state: ServerState, llm: LLM) -> dict[str, Any]:
    """GET /props."""
    from ..system import system_info  # as state.py: the native library loads with the model

    tok = llm.tokenizer
    c = state.config
    ggml = system_info().split(";")[0]  # "ggml <version> (<commit>)"
    return {
        "default_generation_settings": {"n_ctx": llm.n_ctx, "params": generation_params(c.sampling)},
        "total_slots": c.n_slots,
        "model_alias": c.model_id,
        "model_path": llm.model.path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": c.endpoint_slots,
        "endpoint_props": False,  # no POST /props
        "endpoint_metrics": True,  # /metrics is always served
        "ui": False,
        "chat_template": (tok.chat_template or "") if tok is not None else "",
        "bos_token": _token_text(tok, tok.bos_id) if tok is not None else "",
        "eos_token": _token_text(tok, tok.eos_id) if tok is not None else "",
        "build_info": f"dspark-ggml {__version__}, {ggml}",
        "is_sleeping": False,  # the server never unloads its model
    }


def generation_params(s: SamplingParams) -> dict[str, Any]:
    """Sampling parameters (the request defaults, or a request's) under llama-server's names;
    "none" is its -1."""
    n_predict = s.max_tokens if s.max_tokens is not None else -1
    return {"seed": s.seed if s.seed is not None else RANDOM_SEED, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "repeat_last_n": s.penalty_last_n,
            "repeat_penalty": s.repeat_penalty, "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty, "max_tokens": n_predict, "n_predict": n_predict,
            "ignore_eos": False, "stream": False, "n_probs": s.logprobs or 0}


def _token_text(tok: Tokenizer, token: int | None) -> str:
    """A special token's text; "" when the vocabulary has none (as llama-server's null token)."""
    if token is None:
        return ""
    return tok.token_to_piece(token, special=True).decode("utf-8", errors="replace")
