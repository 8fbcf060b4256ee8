"""A second question about a whole document against the first, in one run (issue 37).

    python bench/document_kv_reuse.py [--model M.gguf] [--pages N] [--device cpu|cuda|auto]

The document goes into the prompt whole (engine/documents/prompt.py) as the first message's
prefix, so the second question's prompt starts with the same tokens and the KV prefix cache
gives them back. Prints the time to first token of both questions (median of --repeat runs, the
first one cold each time), the document's reading time apart, and their ratio; the goal is the
second at <= 5 % of the first on the bench model (a real Mistral Small GGUF). The default model
is the tests' tiny one, whose prefill is so short that the ratio mostly shows fixed overheads.
Not a test: nothing under tests/ imports it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from tramontane.engine.api import ChatMessage, DocumentPart, SamplingParams
from tramontane.engine.documents.prompt import engine_documents_prompt
from tramontane.engine.runtime.local import LocalEngine

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "tests", "fixtures", "mistral3_tiny-f32.gguf")
ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
WORDS = "the wind from the north crosses the mountains and the harbour wall".split()


def document(pages: int, words_per_page: int) -> DocumentPart:
    """A Markdown file of `pages` sections: whole-mode text without a PDF library."""
    sections = [f"## Part {p + 1}\n\n" + " ".join(WORDS[(p + i) % len(WORDS)] for i in range(words_per_page))
                for p in range(pages)]
    return DocumentPart("\n\n".join(sections).encode(), "report.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--pages", type=int, default=2)
    ap.add_argument("--words-per-page", type=int, default=60)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    engine = LocalEngine(args.model, None, device=args.device)
    part = document(args.pages, args.words_per_page)
    first, second, reading = [], [], []
    for i in range(args.repeat):
        key = f"chat{i}"
        turn1 = [ChatMessage("user", [part, "What is this document about?"])]
        t = time.perf_counter()
        placed = engine_documents_prompt(engine, turn1, ONE.max_tokens)
        reading.append(time.perf_counter() - t)
        if placed.mode_of(part.sha256) != "whole":
            sys.exit(f"the document is not read whole in a context of {engine.context_size}: lower --pages")
        t = time.perf_counter()
        reply = engine.chat(placed.messages, ONE, session_key=key)
        first.append(time.perf_counter() - t)
        if reply.stats.reused_tokens:
            sys.exit(f"the first question reused {reply.stats.reused_tokens} tokens: forget_chat left blocks behind")
        asked = placed.messages
        turn2 = turn1 + [ChatMessage.text("assistant", reply.text), ChatMessage.text("user", "And its last part?")]
        t = time.perf_counter()
        placed = engine_documents_prompt(engine, turn2, ONE.max_tokens)
        reading.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = engine.chat(placed.messages, ONE, session_key=key)
        second.append(time.perf_counter() - t)
        reused, total = r.stats.reused_tokens, r.stats.prompt_tokens
        engine.forget_chat(asked)  # the next round's first question is read cold, as a new chat's
        engine.forget_chat(placed.messages)
    f, s = statistics.median(first), statistics.median(second)
    print(f"model {os.path.basename(args.model)} on {engine.model.device}: second prompt {total} tokens, "
          f"{reused} reused; reading the document {statistics.median(reading) * 1e3:.1f} ms a question")
    print(f"first question TTFT    {f * 1e3:9.2f} ms")
    print(f"second question TTFT   {s * 1e3:9.2f} ms")
    print(f"ratio second/first     {s / f:9.3f}   (goal <= 0.05 on the bench model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
