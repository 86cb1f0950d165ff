"""Byte-level BPE tokenizer for the demo target, trained on the TRAIN split of the corpus.

* Normalizer NFC, pre-tokenizer = the Qwen2 split regex (isolated) followed by byte-level mapping
  without its own regex, byte-level decoder: the same pipeline as Qwen2/Qwen3's tokenizer.json, so
  a GGUF converter labels it ``tokenizer.ggml.pre = "qwen2"``.
* ``N_BPE`` ordinary tokens (256 byte symbols + merges), then the special tokens appended at the end
  (as Qwen does): ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<|mask|>``.
* ChatML chat template in tokenizer_config.json.
"""

from __future__ import annotations

import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
VOCAB_SIZE = 4096
N_BPE = VOCAB_SIZE - len(SPECIALS)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(texts) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=N_BPE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == N_BPE, tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    assert tok.get_vocab_size() == VOCAB_SIZE
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {s: tok.token_to_id(s) for s in SPECIALS}


def save_hf(tok: Tokenizer, out_dir: str) -> None:
    """Write tokenizer.json + tokenizer_config.json the way a Qwen checkpoint has them."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    ids = special_ids(tok)
    added = {
        str(ids[s]): {
            "content": s, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for s in SPECIALS
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 2048,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
                   "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"]}, f, indent=2)
        f.write("\n")
