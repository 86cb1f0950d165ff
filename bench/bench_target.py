"""Target decoding speed: prompt processing (pp) and token generation (tg) tokens/s, next to
llama.cpp's llama-bench on the same GGUF files in the same run.

    python bench/bench_target.py [--models qwen3-0.6b gemma4-moe qwen3moe FILE.gguf ...] [--dtypes f16 q8_0]
                                 [--threads 2] [--pp 64] [--tg 64] [--llama-bench PATH | --no-llama-cpp]

Models (random weights, written once into bench/results):
  qwen3-0.6b   a random Qwen3 with Qwen3-0.6B's shape (151936 vocab, hidden 1024, 28 layers, tied
               embeddings; ~0.6B parameters), in each of --dtypes (default; f16 and q8_0)
  gemma4-moe   Gemma-4 26B-A4B's layout (5 sliding : 1 global, K = V on global layers, experts next to
               a dense FFN) at hidden 1024, 12 layers, 32 experts top 4 (~0.7B), q8_0
  qwen3moe     Qwen3-30B-A3B's layout (every layer sparse) at hidden 1024, 16 layers, 32 experts top 4
               (~0.9B), q8_0
  FILE.gguf    any GGUF as it is
The MoE models (32000-token vocabulary) are made once with transformers (torch) and converted by our
converter. llama-bench is --llama-bench PATH, else the one bench/llama_cpp_build.py built when it
is there; the table then shows our / llama.cpp ratios (same machine, same moment: the ratio is what
to read, not the absolute figures). This script replaces bench_moe.py (= --models gemma4-moe
qwen3moe --tg 32).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

from common import RESULTS, cached_model, llama_bench, print_table, qwen3_0_6b, timed
import llama_cpp_build

from dspark_ggml.context import Context
from dspark_ggml.model import Model

N_VOCAB = 32000  # the MoE models' vocabulary
MOE_SHAPES = {
    # Gemma-4 26B-A4B's layout (5 sliding : 1 global, K = V on global layers, 128 experts top 8 next
    # to a dense FFN) at a 1024 hidden size, 12 layers and 32 experts, top 4.
    "gemma4-moe": dict(hidden_size=1024, intermediate_size=1024, num_hidden_layers=12, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=128, global_head_dim=256, num_global_key_value_heads=2,
                       layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2, sliding_window=512,
                       num_kv_shared_layers=0, num_experts=32, top_k_experts=4, moe_intermediate_size=512,
                       max_position_embeddings=4096),
    # Qwen3-30B-A3B's layout (every layer sparse, 128 experts top 8) at 1024 hidden, 16 layers, 32 experts top 4.
    "qwen3moe": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=16,
                     num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
                     moe_intermediate_size=512, max_position_embeddings=4096),
}


def _gemma4_checkpoint(out: Path) -> None:
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    from tests import hf_checkpoints as hf

    ids = hf.write_gemma4_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))  # padded to a realistic vocabulary
    tok.add_special_tokens([AddedToken(f"<unused{i}>", special=True, normalized=False)
                            for i in range(N_VOCAB - tok.get_vocab_size())])
    tok.save(str(out / "tokenizer.json"))
    cfg = hf.gemma4_text_config("moe", N_VOCAB, ids)
    cfg.update(MOE_SHAPES["gemma4-moe"], final_logit_softcapping=30.0)
    cfg["vocab_size_per_layer_input"] = N_VOCAB
    torch.manual_seed(0)
    Gemma4ForCausalLM(Gemma4TextConfig(**cfg)).to(torch.bfloat16).save_pretrained(str(out))


def _qwen3moe_checkpoint(out: Path) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from tests import hf_checkpoints as hf

    ids = hf.write_qwen_tokenizer(out)
    cfg = Qwen3MoeConfig(vocab_size=N_VOCAB, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], **MOE_SHAPES["qwen3moe"])
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(out))


def moe_model(name: str) -> Path:
    """A random MoE model of MOE_SHAPES, q8_0 (greedy_vs_llamacpp.py checks these files too)."""
    from dspark_ggml.convert import convert

    def write(path: Path) -> None:
        hf_dir = RESULTS / f"{name}-hf"
        shutil.rmtree(hf_dir, ignore_errors=True)
        hf_dir.mkdir(parents=True)
        (_gemma4_checkpoint if name == "gemma4-moe" else _qwen3moe_checkpoint)(hf_dir)
        convert(hf_dir, path, outtype="q8_0", progress=False)
        shutil.rmtree(hf_dir)

    return cached_model(f"{name}-random-q8_0.gguf", write)


def model_files(name: str, dtypes: list[str]) -> list[Path]:
    if name == "qwen3-0.6b":
        return [qwen3_0_6b(d) for d in dtypes]
    if name in MOE_SHAPES:
        return [moe_model(name)]
    if not Path(name).is_file():
        raise SystemExit(f"--models: {name} is neither qwen3-0.6b, {', '.join(MOE_SHAPES)} nor a GGUF file")
    return [Path(name)]


def ours(path: Path, threads: int, pp: int, tg: int, reps: int) -> tuple[float, float]:
    """(prompt tokens/s, generation tokens/s) at the Context level, as llama-bench measures."""
    model = Model(path)
    ctx = Context(model, n_ctx=max(pp, tg) + 16, n_batch=max(pp, 1), n_threads=threads)
    toks = np.random.default_rng(0).integers(0, model.n_vocab, size=max(pp, tg)).astype(np.int32)

    def prompt() -> None:
        ctx.kv_clear()
        ctx.decode(toks[:pp])

    def generate() -> None:
        ctx.kv_clear()
        for i in range(tg):
            ctx.decode(toks[i:i + 1], [i])

    t_pp = timed(prompt, reps)
    t_tg = timed(generate, reps)
    return pp / t_pp, tg / t_tg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3-0.6b"], metavar="MODEL",
                    help="qwen3-0.6b, gemma4-moe, qwen3moe or a GGUF file")
    ap.add_argument("--dtypes", nargs="+", default=["f16", "q8_0"], help="weight types of qwen3-0.6b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench (default: the one bench/llama_cpp_build.py built)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    args = ap.parse_args()
    exe = None if args.no_llama_cpp else args.llama_bench or llama_cpp_build.program("llama-bench")

    rows = []
    for path in (p for name in args.models for p in model_files(name, args.dtypes)):
        pp, tg = ours(path, args.threads, args.pp, args.tg, args.reps)
        theirs = llama_bench(exe, path, args.threads, args.pp, args.tg, args.reps) if exe else None
        for test, o, i in ((f"pp{args.pp}", pp, 0), (f"tg{args.tg}", tg, 1)):
            rows.append([path.name, test, round(o, 1)] + ([round(theirs[i], 1), round(o / theirs[i], 2)] if theirs else []))
    print(f"threads={args.threads}")
    print_table(["model", "test", "dspark-ggml t/s"] + (["llama.cpp t/s", "ratio"] if exe else []), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
