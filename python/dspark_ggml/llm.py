"""The high-level API: load a target (and a DFlash/DSpark draft) once, then generate text."""
from __future__ import annotations

import numbers
import os
import weakref
from contextlib import ExitStack
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generator, Mapping, Sequence, TypeVar, Union

from . import _lib
from ._handle import Closing
from .context import Context
from .decode_loop import DecodeLoop, Request
from .draft import DraftContext, DraftModel
from .engine import Engine, build_engine
from .errors import DSparkError, InvalidArgumentError, UnsupportedError
from .interrupt import Interrupt
from .logprobs import TokenLogprob
from .model import Model
from .results import GenerationChunk, GenerationResult
from .rpc import add_rpc_servers
from .sampling import SamplingParams, with_options
from .speculative import SpeculativeConfig, coerce_speculative, resolve_method
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .sampling import SamplingOptions

Prompt = Union[str, Sequence[int]]
Messages = Sequence[Mapping[str, Any]]
_Closeable = TypeVar("_Closeable", Model, DraftModel, Context, DraftContext, Engine)


class LLM(Closing):
    """A target model, optionally with a DFlash/DSpark draft, ready to generate.

    At temperature 0 (the default) the output is the target's own greedy decoding, token for token,
    with or without a draft: the draft only makes it faster.

    Args:
        model_path: the target GGUF (qwen3, llama or qwen2). Its tokenizer is used for text; a GGUF
            without one still generates from and to token ids.
        draft_model_path: a DFlash/DSpark draft GGUF trained for this target; None (default) =
            target only.
        speculative: a SpeculativeConfig or the same as a dict (method, n_max, n_min, p_min,
            draft_mode, schedule, backend_sampling); None (default) = SpeculativeConfig().
        n_ctx: KV cache cells, shared by the sequences of a batch; a sequence ends with
            "context_full" when its prompt plus output reach n_ctx. Default 4096; 0 = the model's
            training context.
        n_batch: most prompt tokens decoded in one go (longer prompts are split). Default 512.
        n_seq_max: sequences run at once by generate_batch (more prompts wait for a free slot).
            Default 1.
        n_outputs_max_per_seq: logits rows one sequence may ask for in a batch; None (default) =
            the verify block, draft tokens per step + 1.
        n_threads: CPU threads; None (default) = all hardware threads.
        type_kv: KV cache type: "f16" (default), "f32", "bf16" or "q8_0".
        flash_attn: "auto" (default), True or False.
        batch_invariant: kernels whose per-row results do not depend on the batch (see
            :class:`~dspark_ggml.context.Context`). Default False.
        device: device index (dspark_ggml.devices()); -1 (default) = the first GPU, else the CPU.
        draft_device: the draft's device index; None (default) = the target's device.
        tensor_split: spread the target's layers over devices in these proportions, by device
            index (llama.cpp's ``--tensor-split``); None (default) = all on ``device``.
        rpc_servers: rpc-servers (``"host:port"``, a list or a comma-separated string) whose
            devices join the device list first (see :mod:`dspark_ggml.rpc`); RPC devices count as
            GPUs, so ``device=-1`` then picks the first of them unless a local GPU comes first.
        use_mmap: compute from the memory-mapped files (CPU). Default True.

    Raises:
        FileAccessError, FileFormatError, UnsupportedError: a GGUF that cannot be loaded.
        InvalidArgumentError: a bad option, a draft that does not fit the target, or a method that
            does not match the draft (e.g. "dspark" for a DFlash draft).
        TokenizerError: the target's tokenizer metadata is unusable.

    Attributes:
        model, draft_model: the loaded Model / DraftModel (None without a draft).
        context, draft_context: the target Context and the DraftContext (None without a draft):
            their KV caches (``context.kv``) can be inspected and edited between generations.
        engine: the Engine that runs the steps.
        tokenizer: the target's Tokenizer, or None when its GGUF carries none.
        speculative: the SpeculativeConfig in effect; ``method`` and ``schedule`` are resolved.

    Examples:
        >>> llm = LLM("target.gguf", draft_model_path="draft.gguf", n_threads=4)  # doctest: +SKIP
        >>> llm.generate("def fibonacci(n):", max_tokens=64).text  # doctest: +SKIP
        >>> for chunk in llm.stream("def fibonacci(n):"):  # doctest: +SKIP
        ...     print(chunk.text, end="", flush=True)
    """

    def __init__(self, model_path: str | os.PathLike[str], *,
                 draft_model_path: str | os.PathLike[str] | None = None,
                 speculative: SpeculativeConfig | Mapping[str, Any] | None = None,
                 # context
                 n_ctx: int = 4096, n_batch: int = 512, n_seq_max: int = 1,
                 n_outputs_max_per_seq: int | None = None, n_threads: int | None = None,
                 type_kv: str = "f16", flash_attn: bool | str = "auto", batch_invariant: bool = False,
                 # model
                 device: int = -1, draft_device: int | None = None, use_mmap: bool = True,
                 tensor_split: Sequence[float] | None = None, rpc_servers: str | Sequence[str] | None = None) -> None:
        self._resources = ExitStack()
        self._interrupt = Interrupt()
        self._stream: weakref.ReferenceType[Generator[GenerationChunk, None, None]] | None = None
        config = coerce_speculative(speculative)
        try:
            add_rpc_servers(rpc_servers)
            self.model = self._keep(Model(model_path, device=device, use_mmap=use_mmap, tensor_split=tensor_split))
            self.tokenizer = Tokenizer.from_gguf_if_any(os.fspath(model_path))
            self.draft_model = self._load_draft(draft_model_path, config, draft_device, use_mmap)
            kind = self.draft_model.info.kind if self.draft_model else None
            draft_name = None if draft_model_path is None else os.fspath(draft_model_path)
            method = resolve_method(config.method, kind, draft_name)
            self.speculative = SpeculativeConfig(**{**config.to_dict(), "method": method})
            self.speculative.schedule = self._schedule(config, n_ctx, n_batch, n_seq_max)
            n_out = n_outputs_max_per_seq if n_outputs_max_per_seq is not None else self._verify_block()
            kw: dict[str, Any] = {"n_batch": n_batch, "n_seq_max": n_seq_max, "n_threads": n_threads,
                                  "type_kv": type_kv, "flash_attn": flash_attn, "n_outputs_max_per_seq": n_out,
                                  "batch_invariant": batch_invariant}
            engine = self._make_engine(n_ctx, kw)
            self.context = self._keep(engine.target)
            self.draft_context = self._keep(engine.draft) if engine.draft is not None else None
            self.engine = self._keep(engine)
        except BaseException:
            self.close()
            raise

    # ---- construction ---------------------------------------------------------------------------

    def _keep(self, obj: _Closeable) -> _Closeable:
        """Close ``obj`` with the LLM (in reverse order of creation)."""
        self._resources.callback(obj.close)
        return obj

    def _load_draft(self, path: str | os.PathLike[str] | None, config: SpeculativeConfig, device: int | None,
                    use_mmap: bool) -> DraftModel | None:
        if path is None or config.method == "none":
            return None  # "none" does not even load a draft it was given
        # -1 asks for the target's device
        return self._keep(DraftModel(path, self.model, device=-1 if device is None else device, use_mmap=use_mmap))

    def _schedule(self, config: SpeculativeConfig, n_ctx: int, n_batch: int, n_seq_max: int) -> str:
        """The schedule that runs: "auto" resolved by the draft (confidence with a calibrated
        confidence head, else adaptive), or static where the context is too small for those to time
        their steps in (they calibrate on a verify of every sequence's block and a draft of twice
        the block)."""
        if config.schedule != "auto":
            return config.schedule
        if self.draft_model is None:
            return "static"  # (no steps to schedule)
        block = self._verify_block()
        if 0 < n_ctx < max(min(n_batch, n_seq_max * block), 2 * block):
            return "static"
        return config.resolved_schedule(self.draft_model.confidence_calibrated)

    def _verify_block(self) -> int:
        """Tokens one sequence verifies per step: its draft tokens plus the target's own."""
        if self.draft_model is None:
            return 1
        return _lib.check(_lib.lib().dspark_spec_n_draft(self.draft_model.handle, self.speculative.n_max)) + 1

    def _make_engine(self, n_ctx: int, context_options: dict[str, Any]) -> Engine:
        s = self.speculative
        eog = sorted(self.tokenizer.eog_ids) if self.tokenizer is not None else []
        engine = build_engine(self.model, self.draft_model, n_ctx=n_ctx, context_options=context_options,
                              n_max=s.n_max, n_min=s.n_min, p_min=s.p_min, draft_mode=s.draft_mode,
                              schedule=s.schedule, backend_sampling=s.backend_sampling,
                              markov_top_k=s.markov_top_k, eog=eog)
        self._interrupt.link(engine.request_abort)  # a C flag: nothing calls into Python per graph node
        return engine

    # ---- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the contexts and models (idempotent). The LLM cannot generate afterwards."""
        if getattr(self, "_stream", None) is not None:
            self._end_unfinished_stream()
        resources = getattr(self, "_resources", None)
        if resources is not None:
            resources.close()
        self._closed = True

    # ---- properties -----------------------------------------------------------------------------

    method = property(attrgetter("speculative.method"),
                      doc='The speculative method running: "dflash", "dspark" or "none".')
    n_ctx = property(attrgetter("context.n_ctx"))
    n_seq_max = property(attrgetter("context.n_seq_max"))
    n_vocab = property(attrgetter("model.n_vocab"))
    n_draft = property(attrgetter("engine.n_draft"),
                       doc='Draft tokens per step after clamping n_max to the draft (0 without drafting).')

    # ---- text -----------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``.

        Args:
            add_special: add BOS/EOS as the model's GGUF asks. Default True.
            parse_special: read control tokens written in the text (e.g. "<|im_start|>"). Default False.
        """
        return self._require_tokenizer().encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of ``tokens``; ``special`` (default False) shows control tokens as their text."""
        return self._require_tokenizer().decode(list(tokens), special=special)

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` ([{"role": ..., "content": ...}]) under the model's chat template."""
        return self._require_tokenizer().encode_chat(messages, add_generation_prompt=add_generation_prompt)

    # ---- generation -----------------------------------------------------------------------------

    def generate(self, prompt: Prompt, sampling_params: SamplingParams | None = None,
                 **options: Unpack[SamplingOptions]) -> GenerationResult:
        """Generate from one prompt.

        Args:
            prompt: text (tokenized with BOS as the model asks; control tokens written in it are
                read as such) or token ids. For several prompts use :meth:`generate_batch`.
            sampling_params: a SamplingParams; default SamplingParams() (greedy, 256 tokens).
            **options: SamplingParams fields that override it: temperature (default 0.0 =
                greedy), top_k (0 = off), top_p (1.0 = off), min_p (0.0 = off), seed (None =
                random), max_tokens (default 256; None = until the end or n_ctx), stop (strings:
                the text ends before the first one found), stop_token_ids (extra tokens that end
                generation like the model's end-of-generation tokens); logit_bias,
                presence_penalty, frequency_penalty, repeat_penalty, penalty_last_n; logprobs and
                prompt_logprobs (see SamplingParams).

        Returns:
            GenerationResult: text, tokens, finish_reason ("stop", "length", "context_full",
            "aborted"), stats; logprobs / prompt_logprobs when asked for. The text never contains what stopped it (stop string, stop token,
            end-of-generation token); ``tokens`` does include a stop / end-of-generation token.

        Raises:
            KeyboardInterrupt: Ctrl-C (main thread). The sequence is removed first; the LLM stays
                usable. (:meth:`abort` instead ends with finish_reason "aborted".)
            InvalidArgumentError: an empty prompt, a prompt that does not fit n_ctx, a bad option.
            TypeError: a list of prompts, or an unknown option.
        """
        request = self._request(prompt, with_options(sampling_params, options))
        return self._collect(self._start([request]), [request])[0]

    __call__ = generate

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None,
               **options: Unpack[SamplingOptions]) -> Generator[GenerationChunk, None, None]:
        """Generate from one prompt, yielding chunks as the engine commits tokens.

        Arguments as :meth:`generate`. The first chunk holds the prefill's token, each further
        chunk one verify step's tokens (several when drafts are accepted); the last chunk has
        ``finish_reason`` and ``stats``. Joining the chunks' text gives generate()'s text. Stopping
        the iteration early (break, close()) removes the sequence, and so does starting another
        generation on this LLM while the stream is unfinished (the stream then just ends).
        """
        request = self._request(prompt, with_options(sampling_params, options))
        return self._start([request], per_step=True)

    def generate_batch(self, prompts: Sequence[Prompt],
                       sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                       **options: Unpack[SamplingOptions]) -> list[GenerationResult]:
        """Generate from several prompts, ``n_seq_max`` at a time, each verify step batching them.

        Arguments and results as :meth:`generate`, one result per prompt in order;
        ``sampling_params`` may also be a list with one SamplingParams per prompt (as vLLM's
        ``generate``), so mixed temperatures, seeds and stops share a batch; ``options`` override
        fields of every one of them. A result depends only on its own prompt, parameters and
        seed: it is the same as generate() on the prompt alone, token for token (greedy and seeded
        sampled), on the CPU in every weight type (see docs/lossless.md, "Lossless for every weight type").
        """
        if isinstance(prompts, str):
            raise TypeError("generate_batch() takes a list of prompts; for one prompt use generate()")
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            per_prompt = [with_options(sampling_params, options)] * len(prompts)
        else:
            given = list(sampling_params)
            if len(given) != len(prompts):
                raise InvalidArgumentError(f"sampling_params has {len(given)} entries for {len(prompts)} prompts: "
                                           "give one SamplingParams, or one per prompt")
            if not all(isinstance(sp, SamplingParams) for sp in given):
                raise TypeError("sampling_params takes a SamplingParams or a list of them")
            per_prompt = [with_options(sp, options) for sp in given]
        requests = [self._request(p, sp, index=i) for i, (p, sp) in enumerate(zip(prompts, per_prompt))]
        return self._collect(self._start(requests), requests)

    def chat(self, messages: Messages, sampling_params: SamplingParams | None = None,
             **options: Unpack[SamplingOptions]) -> GenerationResult:
        """Reply to ``messages`` ([{"role": "user", "content": ...}, ...]) under the model's chat
        template; otherwise as :meth:`generate`. The reply ends at the end-of-turn token."""
        return self.generate(self.apply_chat_template(messages), sampling_params, **options)

    def stream_chat(self, messages: Messages, sampling_params: SamplingParams | None = None,
                    **options: Unpack[SamplingOptions]) -> Generator[GenerationChunk, None, None]:
        """:meth:`chat`, streamed as :meth:`stream` does."""
        return self.stream(self.apply_chat_template(messages), sampling_params, **options)

    def abort(self) -> None:
        """Stop the generation in progress (callable from any thread or from a stream's consumer).

        The engine stops at the next point where its caches are consistent; the running
        sequences end with finish_reason "aborted", keeping what they generated, and prompts
        not started yet end "aborted" with no tokens. The LLM stays usable.
        """
        self._interrupt.request()

    def reset(self) -> None:
        """Empty both KV caches (after editing them by hand through ``context`` / ``draft_context``).

        Ends an unfinished stream first."""
        self._check_open()
        self._end_unfinished_stream()
        self.context.kv_clear()
        if self.draft_context is not None:
            self.draft_context.kv.clear()

    # ---- internals ------------------------------------------------------------------------------

    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise InvalidArgumentError(f"{self.model.path} has no tokenizer: use token ids")
        return self.tokenizer

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            tokens = self._require_tokenizer().encode(prompt, add_special=True, parse_special=True)
        elif isinstance(prompt, (bytes, bytearray)):
            raise TypeError("a prompt is a str or a sequence of token ids, not bytes")
        else:
            items = list(prompt)
            if items and not all(isinstance(t, numbers.Integral) for t in items):
                raise TypeError("a prompt is a str or a sequence of token ids; for several prompts use "
                                "generate_batch()")
            tokens = [int(t) for t in items]
        if not tokens:
            raise InvalidArgumentError("the prompt is empty (no tokens)")
        return tokens

    def _request(self, prompt: Prompt, sampling: SamplingParams, index: int = 0) -> Request:
        stops = [sampling.stop] if isinstance(sampling.stop, str) else list(sampling.stop or [])
        if not all(isinstance(s, str) for s in stops):
            raise TypeError("stop takes strings; put token ids in stop_token_ids")
        if stops and self.tokenizer is None:
            raise InvalidArgumentError(f"stop strings need a tokenizer and {self.model.path} has none")
        stop_ids = [int(t) for t in (sampling.stop_token_ids or [])]
        bad = [t for t in stop_ids if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidArgumentError(f"stop_token_ids {bad} are outside the vocabulary "
                                       f"(0 .. {self.n_vocab - 1})")
        bias = [t for t in (sampling.logit_bias or {}) if not 0 <= int(t) < self.n_vocab]
        if bias:
            raise InvalidArgumentError(f"logit_bias: token ids {bias} are outside the vocabulary "
                                       f"(0 .. {self.n_vocab - 1})")
        return Request(self._prompt_tokens(prompt), sampling, stops, stop_ids, index,
                       constraint=self._constraint_for(sampling))

    def _constraint_for(self, sampling: SamplingParams) -> Any | None:
        """The token constraint of a request's json_schema / grammar (None without one), built by
        the structured-output module with this LLM's tokenizer."""
        if sampling.json_schema is None and sampling.grammar is None:
            return None
        try:
            from . import structured
        except ImportError as e:
            raise UnsupportedError("json_schema / grammar need dspark_ggml.structured (llguidance)") from e
        return structured.constraint_for(self._require_tokenizer(), sampling, self.n_vocab)

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise DSparkError("the LLM is closed")

    def _end_unfinished_stream(self) -> None:
        """Close a stream that was left suspended: the engine runs one generation at a time."""
        stream = self._stream() if self._stream is not None else None
        self._stream = None
        if stream is not None:
            stream.close()  # its cleanup removes its sequences

    def _start(self, requests: list[Request], per_step: bool = False) -> Generator[GenerationChunk, None, None]:
        self._check_open()
        self._end_unfinished_stream()
        stream = self._drive(requests, per_step)
        # a weak reference, so that a stream dropped by its consumer is still closed (and its
        # sequences removed) as soon as it is garbage
        self._stream = weakref.ref(stream)
        return stream

    def _drive(self, requests: list[Request], per_step: bool) -> Generator[GenerationChunk, None, None]:
        self._interrupt.clear()
        yield from DecodeLoop(self.engine, self.n_seq_max, self.tokenizer, self._interrupt, per_step).run(requests)

    @staticmethod
    def _collect(chunks: Generator[GenerationChunk, None, None],
                 requests: list[Request]) -> list[GenerationResult]:
        texts: list[list[str]] = [[] for _ in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        from_draft: list[list[bool]] = [[] for _ in requests]
        last: list[GenerationChunk | None] = [None] * len(requests)
        logprobs: list[list[TokenLogprob] | None] = [[] if r.sampling.logprobs is not None else None
                                                     for r in requests]
        prompt_logprobs: list[list[TokenLogprob | None] | None] = [None] * len(requests)
        try:
            for chunk in chunks:
                i = chunk.index
                texts[i].append(chunk.text)
                tokens[i] += chunk.tokens
                from_draft[i] += chunk.from_draft
                if chunk.logprobs is not None and logprobs[i] is not None:
                    logprobs[i] += chunk.logprobs  # type: ignore[operator]
                if chunk.prompt_logprobs is not None:
                    prompt_logprobs[i] = chunk.prompt_logprobs
                if chunk.finish_reason is not None:
                    last[i] = chunk
        finally:
            chunks.close()  # at once, even when the traceback of an exception keeps this frame alive
        results = []
        for i, (r, t, tok, fd, end) in enumerate(zip(requests, texts, tokens, from_draft, last)):
            assert end is not None and end.finish_reason is not None and end.stats is not None
            results.append(GenerationResult("".join(t), tok, end.finish_reason, end.stats, r.prompt, fd,
                                            logprobs=logprobs[i], prompt_logprobs=prompt_logprobs[i]))
        return results

    def __repr__(self) -> str:
        draft_model = getattr(self, "draft_model", None)
        draft = f", draft_model_path={draft_model.path!r}" if draft_model is not None else ""
        return f"LLM({self.model.path!r}{draft}, method={self.method!r}, n_ctx={self.n_ctx})"


def load(model_path: str | os.PathLike[str], draft_model_path: str | os.PathLike[str] | None = None,
         **kwargs: Any) -> LLM:
    """``LLM(model_path, draft_model_path=draft_model_path, **kwargs)``: see :class:`LLM`."""
    return LLM(model_path, draft_model_path=draft_model_path, **kwargs)
