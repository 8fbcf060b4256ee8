"""Turn-2 TTFT with KV reuse against a cold prefill of the same prompt, in one run.

    python bench/kv_reuse.py [--model M.gguf] [--first-turn-words N] [--device cpu|cuda|auto]

Prints both TTFTs (median of --repeat runs) and their ratio; the goal is a reused turn 2 at
≤ 5 % of the cold prefill when the first turn is long.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.runtime.local import LocalEngine

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "tests", "fixtures", "mistral3_tiny-f32.gguf")
ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--first-turn-words", type=int, default=150)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    engine = LocalEngine(args.model, None, device=args.device)
    words = "the wind from the north crosses the mountains and".split()
    long_text = " ".join(words[i % len(words)] for i in range(args.first_turn_words))
    turn1 = [ChatMessage.text("user", long_text)]
    reply = engine.chat(turn1, ONE, session_key="warm").text
    turn2 = turn1 + [ChatMessage.text("assistant", reply), ChatMessage.text("user", "Summarise that.")]
    n_prompt = len(engine.encode(turn2).ids)
    if n_prompt >= engine.context_size:
        sys.exit(f"the prompt ({n_prompt} tokens) does not fit the context {engine.context_size}: "
                 f"lower --first-turn-words")

    warm, cold = [], []
    for i in range(args.repeat):
        engine.chat(turn1, ONE, session_key="warm")  # the cache holds turn 1 again
        t = time.perf_counter()
        r = engine.chat(turn2, ONE, session_key="warm")
        warm.append(time.perf_counter() - t)
        reused = r.stats.reused_tokens
        engine.forget_chat(turn2)  # its blocks leave the cache, as a deleted chat's do
        t = time.perf_counter()
        r = engine.chat(turn2, ONE, session_key=f"cold{i}")  # a chat with nothing cached
        cold.append(time.perf_counter() - t)
        if r.stats.reused_tokens:
            sys.exit(f"the cold run reused {r.stats.reused_tokens} tokens: forget_chat left blocks behind")
    w, c = statistics.median(warm), statistics.median(cold)
    print(f"model {os.path.basename(args.model)} on {engine.model.device}: turn-2 prompt {n_prompt} tokens, "
          f"{reused} reused")
    print(f"cold prefill TTFT   {c * 1e3:9.2f} ms")
    print(f"turn 2 with reuse   {w * 1e3:9.2f} ms")
    print(f"ratio reuse/cold    {w / c:9.3f}   (goal <= 0.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
