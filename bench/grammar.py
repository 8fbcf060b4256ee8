"""What a grammar costs per generated token: llguidance's mask, its unpacking and applying it to
the logits, on the real 131072-token tekken vocabulary (the fixture GGUF of mistral-common's
tekken_240911), while a JSON reply is fed token by token. Compare with a decode step of the same
run's model: `--decode-ms` (e.g. 1000 / the decode tok/s of bench/cpu.py on the bench model).

    python bench/grammar.py [--decode-ms 14.9] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import Tokenizer
from tramontane.engine.runtime import grammar

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tekken_240911_tokenizer.gguf"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"]}
REPLY = {"name": "Jean-Pierre de la Fontaine, Paris", "age": 42,
         "tags": ["alpha", "beta", "gamma delta", "epsilon", "Zürich", "東京"]}


def one_round(tok, text: str, ids: list[int]) -> dict:
    constraint = grammar.GrammarConstraint(tok, text)
    logits = torch.randn(tok.vocab_size)
    parts = {"matcher": [], "unpack": [], "apply": []}
    for k in range(len(ids) + 1):
        t0 = time.perf_counter()
        new = ids[constraint._fed:k]
        if new:
            constraint.matcher.consume_tokens(new)
        constraint._fed = k
        constraint.matcher.unsafe_compute_mask_ptr(constraint._bitmask.data_ptr(), constraint._bitmask.numel() * 4)
        t1 = time.perf_counter()
        allowed = grammar.unpack_bitmask(constraint._bitmask, tok.vocab_size)
        t2 = time.perf_counter()
        logits.masked_fill(~allowed, float("-inf"))
        t3 = time.perf_counter()
        parts["matcher"].append(t1 - t0)
        parts["unpack"].append(t2 - t1)
        parts["apply"].append(t3 - t2)
    return {k: statistics.median(v) * 1e3 for k, v in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode-ms", type=float, default=None, help="a decode step of the model to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with open_gguf(FIXTURE) as gf:
        tok = Tokenizer.from_gguf(gf)
    t0 = time.perf_counter()
    grammar.ll_tokenizer(tok)
    print(f"llguidance tokenizer built once per model: {time.perf_counter() - t0:.2f} s ({tok.vocab_size} tokens)")
    ids = tok.encode(json.dumps(REPLY, ensure_ascii=False))
    for label, text in (("json_schema", grammar.json_schema_grammar(SCHEMA)),
                        ("json_object", grammar.json_object_grammar())):
        rounds = [one_round(tok, text, ids) for _ in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        total = sum(med.values())
        line = (f"{label}: {len(ids) + 1} steps, per token median ms: matcher {med['matcher']:.3f}, "
                f"unpack {med['unpack']:.3f}, apply {med['apply']:.3f}, total {total:.3f}")
        if args.decode_ms:
            line += f" = {100 * total / args.decode_ms:.1f} % of a {args.decode_ms:g} ms decode step"
        print(line)


if __name__ == "__main__":
    main()
