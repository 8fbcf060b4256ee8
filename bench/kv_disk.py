"""Reopening a chat after a restart: its first reply with the prefix cache's blocks read from disk
against a cold read of the same prompt, in one run.

    python bench/kv_disk.py [--model M.gguf] [--words N] [--threads T] [--repeat R]

Turn 1 (a long user message) runs on an engine with a disk tier, which is then closed. Each
repetition loads a new engine on the same folder (a restart: nothing in memory) and times
turn 2 (turn 1, its reply, a short question; one token) from the `chat` call to the first token,
disk reads and checks included; the cold side is an engine without any prefix cache on the same
prompt. Medians of wall time and of process CPU time (all threads: on a loaded machine CPU time
moves less than wall time). The files were just written, so they are read from the page cache.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.runtime.local import LocalEngine
from tramontane.engine.runtime.threads import apply_threads

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "tests", "fixtures", "mistral3_tiny-f32.gguf")
ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
REPLY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def timed(engine, messages, key):
    wall, cpu = time.perf_counter(), time.process_time()
    r = engine.chat(messages, ONE, session_key=key)
    return time.perf_counter() - wall, time.process_time() - cpu, r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--words", type=int, default=700, help="turn 1's length in words")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    apply_threads(args.threads)

    folder = tempfile.mkdtemp(prefix="kv-disk-bench-")
    try:
        words = "the wind from the north crosses the mountains and brings cold air to the valley".split()
        turn1 = [ChatMessage.text("user", " ".join(words[i % len(words)] for i in range(args.words)))]
        first = LocalEngine(args.model, None, device="cpu", kv_disk_dir=folder)
        reply = first.chat(turn1, REPLY, session_key="chat").text
        first.close()
        turn2 = turn1 + [ChatMessage.text("assistant", reply), ChatMessage.text("user", "Summarise that.")]

        cold_engine = LocalEngine(args.model, None, device="cpu", kv_host_budget_mb=0)  # reuses nothing
        cold, disk = [], []
        for i in range(args.repeat):
            w, c, r = timed(cold_engine, turn2, f"cold{i}")
            assert r.stats.reused_tokens == 0
            cold.append((w, c))
            cold_engine.forget_session(f"cold{i}")
            restarted = LocalEngine(args.model, None, device="cpu", kv_disk_dir=folder)
            w, c, r = timed(restarted, turn2, "chat")
            disk.append((w, c))
            reused, n_prompt = r.stats.reused_tokens, r.stats.prompt_tokens
            restarted.close()
        files = sum(f.endswith(".kv") for f in os.listdir(folder))
        mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    cw, cc = statistics.median(w for w, _ in cold), statistics.median(c for _, c in cold)
    dw, dc = statistics.median(w for w, _ in disk), statistics.median(c for _, c in disk)
    print(f"model {os.path.basename(args.model)}: turn-2 prompt {n_prompt} tokens, {reused} from disk "
          f"({files} block files, {mb:.0f} MiB in the folder)")
    print(f"cold prefill    TTFT {cw * 1e3:9.1f} ms wall  {cc * 1e3:9.1f} ms CPU")
    print(f"blocks on disk  TTFT {dw * 1e3:9.1f} ms wall  {dc * 1e3:9.1f} ms CPU")
    print(f"ratio disk/cold      {dw / cw:9.3f}  wall      {dc / cc:9.3f}  CPU   (median of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
