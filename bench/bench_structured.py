"""The cost of structured output per token: the demo pair (SmolLM2-135M-Instruct + its DSpark draft)
answering chat prompts free and under a JSON schema, with the draft and target-only.

    python bench/bench_structured.py [--n-prompts 8] [--max-tokens 96] [--threads 2]

Greedy, one sequence at a time. Per row: tokens decoded (after the prefill's), decode ms per token,
the grammar's own ms per token (llguidance's mask and commit callbacks, GrammarConstraint.seconds,
prefill's mask included), and tau. The constrained rows' decode time includes the grammar's.
"""
from __future__ import annotations

import argparse

from common import print_table

import dspark_ggml as dg
from dspark_ggml import demo, structured

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                         "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}}
NAMES = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena"]


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Describe a person named {NAMES[i % len(NAMES)]}, their age, city "
                                         "and hobbies, as JSON."}] for i in range(n)]


def run(llm: dg.LLM, chats: list[list[dict]], max_tokens: int, schema: dict | None) -> list[object]:
    made: list[structured.GrammarConstraint] = []
    build = structured.constraint_for

    def recording(*args, **kwargs):  # keep each request's constraint to read its time
        c = build(*args, **kwargs)
        if c is not None:
            made.append(c)
        return c

    structured.constraint_for = recording
    try:
        llm.generate(llm.apply_chat_template(chats[0]), max_tokens=8, json_schema=schema)  # warm-up
        made.clear()
        n_tokens, t_decode, n_steps, n_accepted = 0, 0.0, 0, 0
        for chat in chats:
            r = llm.generate(llm.apply_chat_template(chat), max_tokens=max_tokens, json_schema=schema)
            n_tokens += len(r.tokens) - 1  # the prefill's token is not decoding
            t_decode += r.stats.t_decode_ms
            n_steps += r.stats.n_steps
            n_accepted += r.stats.n_accepted
    finally:
        structured.constraint_for = build
    grammar_ms = sum(c.seconds for c in made) * 1e3
    tau = (n_accepted + n_steps) / n_steps if n_steps else 0.0
    return [n_tokens, t_decode / n_tokens, grammar_ms / n_tokens if schema else 0.0, tau]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    target = demo.target_path()
    chats = prompts(args.n_prompts)
    rows = []
    for draft in (demo.DRAFT_PATH, None):
        with dg.LLM(target, draft_model_path=draft, n_threads=args.threads, n_ctx=1024) as llm:
            for schema in (None, SCHEMA):
                rows.append(["dspark" if draft else "target only", "json_schema" if schema else "free",
                             *run(llm, chats, args.max_tokens, schema)])
    print_table(["decoding", "output", "tokens", "decode ms/token", "grammar ms/token", "tau"], rows)


if __name__ == "__main__":
    main()
