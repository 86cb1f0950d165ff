"""Train the tokenizer on the TRAIN split, write it into OUT/target/, and tokenize the corpus.

Outputs:
* OUT/target/tokenizer.json, tokenizer_config.json, special_tokens_map.json
* OUT/data/train_stream.npy: every TRAIN document and every second chat sample
  (corpus.chat_samples), each followed by <|endoftext|>, in an order shuffled with the seed.
* OUT/data/heldout_stream.npy: every HELD-OUT document followed by <|endoftext|>, in file order.
* OUT/corpus.json: the exact file lists.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import corpus
import tokenizer as T
from common import Timer, log, write_json


def encode_docs(tok, texts, eos):
    parts = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        parts.append(np.asarray(e.ids, dtype=np.int32))
        parts.append(np.asarray([eos], dtype=np.int32))
    return np.concatenate(parts)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/demo_pair_out")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    timer = Timer()
    docs = corpus.load_docs()
    train, held = corpus.split(docs)
    tok = T.build_tokenizer([d.text for d in train])
    tdir = os.path.join(args.out, "target")
    T.save_hf(tok, tdir)
    eos = tok.token_to_id("<|endoftext|>")
    chats = corpus.chat_samples(docs)[::2]
    texts = [d.text for d in train] + chats
    order = np.random.default_rng(args.seed).permutation(len(texts))
    train_stream = encode_docs(tok, [texts[i] for i in order], eos)
    held_stream = encode_docs(tok, [d.text for d in held], eos)
    os.makedirs(os.path.join(args.out, "data"), exist_ok=True)
    np.save(os.path.join(args.out, "data", "train_stream.npy"), train_stream)
    np.save(os.path.join(args.out, "data", "heldout_stream.npy"), held_stream)
    write_json(os.path.join(args.out, "corpus.json"), {
        "stdlib": corpus.stdlib_root(),
        "train_files": [d.relpath for d in train],
        "heldout_files": [d.relpath for d in held],
        "chat_samples_used": len(chats),
        "train_stream_tokens": int(len(train_stream)),
        "heldout_stream_tokens": int(len(held_stream)),
    })
    log(f"tokenizer: {tok.get_vocab_size()} tokens, specials {T.special_ids(tok)}; train stream "
        f"{len(train_stream)} tokens ({len(train)} files + {len(chats)} chats), held-out {len(held_stream)} "
        f"tokens ({len(held)} files) ({timer():.1f}s)")


if __name__ == "__main__":
    main()
