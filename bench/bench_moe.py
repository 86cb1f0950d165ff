"""Mixture-of-experts targets: prompt (pp) and generation (tg) tokens/s of a random Gemma-4 MoE and a
random Qwen3-MoE of realistic shape, scaled down to fit 2 cores, next to llama.cpp's llama-bench on
the same GGUF files.

    python bench/bench_moe.py [--threads 2] [--llama-bench PATH] [--models gemma4-moe qwen3moe]

The models (~0.7-0.8B parameters each, 32 experts, top 4, 32000-token vocabulary, q8_0) are made
once with transformers and converted by our converter into bench/results. Without --llama-bench the
llama.cpp programs built by bench/llama_cpp_build.py are used when present.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
from bench_target import llama_bench, ours  # noqa: E402
from common import RESULTS, cached_model, print_table  # noqa: E402
import llama_cpp_build  # noqa: E402

N_VOCAB = 32000
SHAPES = {
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

    import hf_checkpoints as hf

    ids = hf.write_gemma4_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))  # padded to a realistic vocabulary
    tok.add_special_tokens([AddedToken(f"<unused{i}>", special=True, normalized=False)
                            for i in range(N_VOCAB - tok.get_vocab_size())])
    tok.save(str(out / "tokenizer.json"))
    cfg = hf.gemma4_text_config("moe", N_VOCAB, ids)
    cfg.update(SHAPES["gemma4-moe"], final_logit_softcapping=30.0)
    cfg["vocab_size_per_layer_input"] = N_VOCAB
    torch.manual_seed(0)
    Gemma4ForCausalLM(Gemma4TextConfig(**cfg)).to(torch.bfloat16).save_pretrained(str(out))


def _qwen3moe_checkpoint(out: Path) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    import hf_checkpoints as hf

    ids = hf.write_qwen_tokenizer(out)
    cfg = Qwen3MoeConfig(vocab_size=N_VOCAB, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], **SHAPES["qwen3moe"])
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(out))


def model_path(name: str) -> Path:
    from dspark_ggml.convert import convert

    def write(path: Path) -> None:
        hf_dir = RESULTS / f"{name}-hf"
        shutil.rmtree(hf_dir, ignore_errors=True)
        hf_dir.mkdir(parents=True)
        (_gemma4_checkpoint if name == "gemma4-moe" else _qwen3moe_checkpoint)(hf_dir)
        convert(hf_dir, path, outtype="q8_0", progress=False)
        shutil.rmtree(hf_dir)

    return cached_model(f"{name}-random-q8_0.gguf", write)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=list(SHAPES))
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench (default: the one bench/llama_cpp_build.py built)")
    args = ap.parse_args()
    exe = args.llama_bench or llama_cpp_build.program("llama-bench")

    rows = []
    for name in args.models:
        path = model_path(name)
        pp, tg = ours(path, args.threads, args.pp, args.tg, args.reps)
        if exe:
            lpp, ltg = llama_bench(str(exe), path, args.threads, args.pp, args.tg, args.reps)
            rows.append([name, f"pp{args.pp}", round(pp, 1), round(lpp, 1), round(pp / lpp, 2)])
            rows.append([name, f"tg{args.tg}", round(tg, 1), round(ltg, 1), round(tg / ltg, 2)])
        else:
            rows += [[name, f"pp{args.pp}", round(pp, 1)], [name, f"tg{args.tg}", round(tg, 1)]]
    headers = ["model", "test", "dspark-ggml t/s"] + (["llama.cpp t/s", "ratio"] if exe else [])
    print(f"threads={args.threads}")
    print_table(headers, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
