"""`dspark-ggml convert`: command-line front end of `dspark_ggml.convert.convert`."""
from __future__ import annotations

import argparse
import logging
import sys

from . import convert
from .errors import ConversionError
from .options import DRAFT_FORMATS, LAYER_CONVENTIONS
from .quant import OUTTYPE_CHOICES


def _bool_arg(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hf_dir", metavar="HF_DIR",
                        help="Hugging Face model directory (config.json + *.safetensors)")
    parser.add_argument("-o", "--outfile", required=True, metavar="OUT.gguf",
                        help="output GGUF file")
    parser.add_argument("--outtype", choices=OUTTYPE_CHOICES, default="f16",
                        help="type of the weight matrices (norms and 1-D tensors stay f32); "
                             "auto keeps a bf16/f16 checkpoint's type (default: f16)")
    parser.add_argument("--target-model-dir", metavar="DIR",
                        help="for a draft: the target model it was trained for (tokenizer, "
                             "vocabulary, shared embedding and lm head)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT.gguf if it exists")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not print the conversion decisions")
    group = parser.add_argument_group(
        "answers for checkpoints that leave something open (the converter refuses to guess "
        "and names the flag it needs)")
    group.add_argument("--sample-from-anchor", type=_bool_arg, metavar="{true,false}",
                       help="draft block layout: true = anchor-first (DSpark), false = anchor "
                            "then N masks (DFlash)")
    group.add_argument("--target-layer-convention", choices=LAYER_CONVENTIONS,
                       help="how the draft config numbers target layers: layer-output (id L = "
                            "output of layer L; DeepSpec/SpecForge/z-lab target_layer_ids) or "
                            "layer-input (id k = input of layer k; speculators "
                            "aux_hidden_state_layer_ids)")
    group.add_argument("--mask-token-id", type=int, metavar="ID",
                       help="id of the draft's mask token")
    group.add_argument("--block-size", type=int, metavar="N", help="draft block size")
    group.add_argument("--tokenizer-pre", metavar="NAME",
                       help="llama.cpp pre-tokenizer name (e.g. qwen2, llama-bpe) when the "
                            "tokenizer's split rule is not recognised")
    group.add_argument("--draft-format", choices=DRAFT_FORMATS,
                       help="skip draft format detection")


def run(args: argparse.Namespace) -> int:
    if not args.quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        logging.getLogger("gguf").setLevel(logging.WARNING)  # its own chatter about the writer
    overrides = {name: getattr(args, name) for name in (
        "sample_from_anchor", "target_layer_convention", "mask_token_id", "block_size",
        "tokenizer_pre", "draft_format")}
    try:
        path = convert(args.hf_dir, args.outfile, outtype=args.outtype,
                       target_model_dir=args.target_model_dir, force=args.force,
                       progress=not args.no_progress, **overrides)
    except ConversionError as e:
        print(f"dspark-ggml convert: error: {e}", file=sys.stderr)
        return 1
    except (TypeError, ValueError) as e:  # a bad override value
        print(f"dspark-ggml convert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dspark-ggml convert: interrupted; no output written", file=sys.stderr)
        return 130
    if not args.quiet:
        print(f"wrote {path}", file=sys.stderr)
    return 0
