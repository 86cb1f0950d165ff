"""The `dspark-ggml` command line (also `python -m dspark_ggml`).

Each command lives in its own module (this package's, or ``convert.cli`` / ``server.cli``) with
``add_arguments(parser)`` and ``run(args) -> int``; only the module of the command being run is
imported, so `dspark-ggml --help` and `convert` never load the native library. Registering a
command is one line in ``_COMMANDS``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from .._version import __version__
from ..errors import DSparkError

# name -> (module under the dspark_ggml package, help), in the order `--help` lists them
_ROOT = __package__.rsplit(".", 1)[0]
_COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("cli.generate", "generate text from a prompt, target only or with a DFlash/DSpark draft"),
    "chat": ("cli.chat", "chat with a model through its chat template (reads stdin)"),
    "convert": ("convert.cli", "convert a Hugging Face target or DFlash/DSpark draft to GGUF"),
    "info": ("cli.info", "describe GGUF files: architecture, hyperparameters, tensors, sizes"),
    "quantize": ("cli.quantize", "quantize a GGUF model to llama-quantize's types and mixtures (Q4_K_M, Q8_0, ...)"),
    "check": ("cli.check", "check a draft's conversion: acceptance as converted vs the likely alternatives"),
    "perplexity": ("cli.perplexity", "perplexity on a text and KL divergence from a base model, as llama-perplexity"),
    "bench": ("cli.bench", "compare target-only and speculative decoding: tokens/s, tau, acceptance"),
    "serve": ("server.cli", "serve an OpenAI-compatible HTTP API with continuous batching (the [server] extra)"),
    "rpc-server": ("cli.rpc_server", "lend this machine's device to others over ggml's RPC protocol (--rpc)"),
}


AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _load(module: str) -> tuple[AddArguments, Run]:
    import importlib

    mod = importlib.import_module(f"{_ROOT}.{module}")
    return mod.add_arguments, mod.run


def _command_in(argv: Sequence[str]) -> str | None:
    """The command named in argv: its first word that is not an option (the top level has no
    options that take a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the command named in ``argv`` (default: every command) gets its arguments."""
    p = argparse.ArgumentParser(prog="dspark-ggml",
                                description="Speculative decoding with DFlash/DSpark drafts on ggml")
    p.add_argument("--version", action="version", version=f"dspark-ggml {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    wanted = _command_in(argv) if argv is not None else None
    for name, (module, help_text) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if argv is None or name == wanted:
            add_arguments, run = _load(module)
            add_arguments(sp)
            sp.set_defaults(_run=run)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors reported as one line, not a traceback. The tokenizer's and converter's own error
    classes count only once their (pure-Python) modules are loaded: nothing else can raise them."""
    errors: list[type[BaseException]] = [DSparkError]
    for module, name in ((f"{_ROOT}.tokenizer.errors", "TokenizerError"),
                         (f"{_ROOT}.convert.errors", "ConversionError")):
        mod = sys.modules.get(module)
        if mod is not None:
            errors.append(getattr(mod, name))
    return tuple(errors)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not isinstance(e, _user_errors()):
            raise
        print(f"dspark-ggml {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
