"""`python -m dspark_ggml.convert HF_DIR -o OUT.gguf ...` (same as `dspark-ggml convert`)."""
from __future__ import annotations

import argparse
import sys

from .cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ggml.convert",
                                     description="Convert a Hugging Face model to GGUF.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
