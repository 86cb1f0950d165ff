"""The `dspark-ggml` command line (also `python -m dspark_ggml`)."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from ._version import __version__
from .errors import DSparkError

# name -> (module, help); modules are imported only when their command runs
_COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("cli_info", "describe GGUF files: architecture, hyperparameters, tensors, sizes"),
}


def _load(module: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    import importlib

    mod = importlib.import_module(f"{__package__}.{module}")
    return mod.add_arguments, mod.run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspark-ggml", description="Speculative decoding with DFlash/DSpark drafts on ggml")
    p.add_argument("--version", action="version", version=f"dspark-ggml {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments, run = _load(module)
        add_arguments(sp)
        sp.set_defaults(_run=run)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except DSparkError as e:
        print(f"dspark-ggml {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
