"""Prompt-lookup speculation end to end, Tramontane's server beside llama.cpp's llama-server in
the same mode on the same GGUF, in one run (issue 38, bench (c)).

    python bench/spec.py --model FILE.gguf [--llama-server /path/llama-server] [--clients 1 8]
                         [--rounds 3] [--tokens 128] [--spec-tokens 8] [--threads 2]

Four servers, each its own process with the same thread count and -np slots, all up for the
whole run: ours plain, ours speculating (`serve --spec ngram`), llama-server plain, llama-server
speculating (`--spec-type ngram-simple`, or the n-gram type its --help offers, --llama-spec to
choose). If this checkout's `serve` has no --spec yet, one server of ours serves both, the
speculating requests asking for it in the body ("speculation": "ngram", "speculative.n_max": K); the
header line says which. Without --llama-server only ours run.

The task is copy-heavy: a held-out stdlib passage, then the same passage with an identifier
renamed, cut after its first line (bench/train_pair.py's copy prompt), sent raw to
/v1/completions (no chat template: both servers read the same tokens; both sides' prompt tokens
are printed), greedy with ignore_eos, each client its own passage. A model that copies (a real
one, or bench/train_pair.py's trained target: `--model /tmp/tramontane-pair/stdlib-target-f32.gguf`)
lets prompt lookup draft; random weights never copy, so on them this measures what speculation
costs when it does not pay.

Rounds are paired: for each N, every round runs the four configurations one after another, the
order rotated each round, so slow spells of a shared machine fall on all; medians over rounds.
Printed: aggregate tok/s per configuration, the ratios spec/plain on each side and ours/llama in
each mode, drafted and accepted tokens as each server reports them (both: the response's
timings.draft_n / draft_n_accepted), and whether each side's speculative text is its plain text
(greedy speculation is lossless: it must be).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from batch import wait_ready  # noqa: E402  (bench/batch.py: up and serving /v1/models)

NGRAM_PREFERENCE = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")


def copy_prompts(n: int, lines: int) -> list[str]:
    """n copy-with-a-change prompts from the held-out stdlib files (train_pair's split and prompt)."""
    from train_pair import copy_prompt, corpus_files

    out: list[str] = []
    for path in corpus_files()[1]:
        prompt = copy_prompt(path.read_text(encoding="utf-8", errors="replace"), lines)
        if prompt:
            out.append(prompt)
        if len(out) == n:
            return out
    if not out:
        sys.exit("bench/spec.py: no copy prompt could be made from the standard library's held-out files")
    return [out[i % len(out)] for i in range(n)]  # fewer files than clients: passages shared


def llama_spec_args(binary: str, wanted: str | None, k: int) -> tuple[list[str], str]:
    """llama-server's arguments for n-gram speculation with at most k drafts, read off its --help
    (the spec types and flag names change between builds), and the type chosen."""
    try:
        text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"bench/spec.py: {binary} --help failed: {exc}")
    if "--spec-type" not in text:
        sys.exit(f"bench/spec.py: {binary} has no --spec-type (a build without n-gram speculation)")
    offered = [t for t in NGRAM_PREFERENCE if t in text]
    kind = wanted or (offered[0] if offered else "")
    if not kind or kind not in text:
        sys.exit(f"bench/spec.py: {binary} --help offers none of {wanted or NGRAM_PREFERENCE} for --spec-type")
    from tramontane.engine.runtime.speculative import NGRAM_SIZES

    def offers(flag: str) -> bool:
        return re.search(rf"(^|[\s,]){re.escape(flag)}[\s,]", text) is not None

    args = ["--spec-type", kind]
    # its names for the longest draft of that type (builds of late 2026 refuse the old --draft-max)
    for flag in (f"--spec-{kind}-size-m", f"--spec-{kind}-n-max"):
        if offers(flag):
            args += [flag, str(k)]
            break
    else:
        print(f"bench/spec.py: {binary} --help names no draft length for {kind}: its default", file=sys.stderr)
    # the n-gram looked up: ours' longest (ngram-simple's default, 12, drafts nothing when it
    # exceeds the draft length: its copy must be at least the n-gram long)
    if offers(f"--spec-{kind}-size-n"):
        args += [f"--spec-{kind}-size-n", str(min(max(NGRAM_SIZES), k))]
    return args, kind


def ours_has_spec_flag() -> bool:
    text = subprocess.run([sys.executable, "-m", "tramontane.engine.cli.main", "serve", "--help"],
                          capture_output=True, text=True, timeout=120).stdout
    return re.search(r"--spec[\s,\[{]", text) is not None


def spec_counts(body) -> tuple[int, int]:
    """(drafted, accepted) wherever the response puts them: timings.draft_n / draft_n_accepted
    (llama-server's, and ours), or a usage's accepted + rejected counts; (0, 0) when it says
    nothing."""
    drafted = accepted = rejected = 0
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, (dict, list)):
                    stack.append(value)
                elif isinstance(value, int) and not isinstance(value, bool):
                    name = key.lower()
                    if "accept" in name:
                        accepted += value
                    elif "reject" in name:  # OpenAI's accepted/rejected_prediction_tokens
                        rejected += value
                    elif "draft" in name:
                        drafted += value
        elif isinstance(node, list):
            stack.extend(node)
    return drafted or accepted + rejected, accepted


class Config:
    def __init__(self, name: str, port: int, extra: dict | None = None):
        self.name, self.port, self.extra = name, port, extra or {}


def one_request(cfg: Config, prompt: str, tokens: int) -> dict:
    body = json.dumps({"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True, "stream": False, **cfg.extra}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", cfg.port, timeout=900)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{cfg.name} (port {cfg.port}): HTTP {resp.status}: {data[:300]!r}")
    reply = json.loads(data)
    usage = reply.get("usage") or {}
    drafted, accepted = spec_counts({"usage": usage, "timings": reply.get("timings") or {}})
    return {"tokens": usage.get("completion_tokens", 0), "prompt_tokens": usage.get("prompt_tokens", 0),
            "text": reply["choices"][0]["text"], "drafted": drafted, "accepted": accepted}


def run_round(cfg: Config, prompts: list[str], tokens: int) -> tuple[float, list[dict]]:
    """len(prompts) clients at once, one request each: (aggregate tok/s, their replies)."""
    results: list = [None] * len(prompts)
    errors: list = []

    def client(i: int) -> None:
        try:
            results[i] = one_request(cfg, prompts[i], tokens)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(r["tokens"] for r in results) / wall, results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary (default: only ours)")
    ap.add_argument("--llama-spec", default=None, help="llama-server's --spec-type (default: the first of "
                    + ", ".join(NGRAM_PREFERENCE) + " its --help offers)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=8, metavar="K")
    ap.add_argument("--lines", type=int, default=16, help="lines of the passage to copy")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--parallel", type=int, default=8, help="sequences at once on every server")
    ap.add_argument("--context", type=int, default=1024, help="tokens per slot")
    ap.add_argument("--port", type=int, default=18441, help="first of four consecutive ports")
    args = ap.parse_args(argv)

    prompts = copy_prompts(max(args.clients), args.lines)
    env = dict(os.environ, TRAMONTANE_THREADS=str(args.threads))
    serve = [sys.executable, "-m", "tramontane.engine.cli.main", "serve", "--model", args.model, "--device", "cpu",
             "--parallel", str(args.parallel), "--context-length", str(args.context)]
    flag = ours_has_spec_flag()
    procs: list[subprocess.Popen] = []
    configs: list[Config] = []

    def start(cmd: list[str], port: int, environ=None) -> None:
        procs.append(subprocess.Popen(cmd, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs[-1].port = port

    p = args.port
    start(serve + ["--port", str(p)], p, env)
    configs.append(Config("ours-plain", p))
    if flag:
        start(serve + ["--port", str(p + 1), "--spec", "ngram", "--spec-tokens", str(args.spec_tokens)], p + 1, env)
        configs.append(Config("ours-spec", p + 1))
        how = f"serve --spec ngram --spec-tokens {args.spec_tokens}"
    else:  # the same server, speculation asked for per request
        configs.append(Config("ours-spec", p, {"speculation": "ngram", "speculative.n_max": args.spec_tokens}))
        how = (f'one serve, "speculation": "ngram", "speculative.n_max": {args.spec_tokens} in the body '
               f'(no serve --spec here)')
    llama_how = ""
    if args.llama_server:
        spec_args, kind = llama_spec_args(args.llama_server, args.llama_spec, args.spec_tokens)
        base = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "-np", str(args.parallel),
                "-c", str(args.context * args.parallel), "-t", str(args.threads), "-tb", str(args.threads), "-ngl", "0"]
        start(base + ["--port", str(p + 2)], p + 2)
        configs.append(Config("llama-plain", p + 2))
        start(base + ["--port", str(p + 3), *spec_args], p + 3)
        configs.append(Config("llama-spec", p + 3))
        llama_how = " ".join(spec_args)
    try:
        for proc in procs:
            wait_ready(proc.port, proc)
        for cfg in configs:  # warm-up: first touch of the weights, the prompts' prefixes cached on every side
            run_round(cfg, prompts[:2], 8)
        print(f"model {os.path.basename(args.model)}, {args.threads} threads, {args.tokens} tokens a reply "
              f"(greedy, ignore_eos), {args.rounds} paired rounds, -np {args.parallel}; ours: {how}"
              + (f"; llama-server: {llama_how}" if llama_how else "; no llama-server"))
        print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
        for n in args.clients:
            rates: dict[str, list[float]] = {c.name: [] for c in configs}
            counts = {c.name: [0, 0] for c in configs}
            texts: dict[str, list[str]] = {}
            prompt_tokens: dict[str, list[int]] = {}
            for r in range(args.rounds):
                shift = r % len(configs)
                for cfg in configs[shift:] + configs[:shift]:
                    rate, replies = run_round(cfg, prompts[:n], args.tokens)
                    rates[cfg.name].append(rate)
                    counts[cfg.name][0] += sum(x["drafted"] for x in replies)
                    counts[cfg.name][1] += sum(x["accepted"] for x in replies)
                    texts.setdefault(cfg.name, [x["text"] for x in replies])
                    prompt_tokens.setdefault(cfg.name, [x["prompt_tokens"] for x in replies])
            med = {name: statistics.median(v) for name, v in rates.items()}
            print(f"\nN = {n}: prompt tokens " + ", ".join(f"{k} {v[:3]}" for k, v in prompt_tokens.items()
                                                          if not k.endswith("spec")))
            for cfg in configs:
                drafted, accepted = counts[cfg.name]
                note = (f"drafted {drafted}, accepted {accepted} ({100 * accepted / drafted:.0f} %)" if drafted
                        else "no drafted tokens reported")
                print(f"  {cfg.name:<12} {med[cfg.name]:8.1f} tok/s   rounds {[round(x, 1) for x in rates[cfg.name]]}"
                      + (f"   {note}" if cfg.name.endswith("spec") else ""))
            for side in ("ours", "llama"):
                if f"{side}-spec" in med:
                    same = texts[f"{side}-spec"] == texts[f"{side}-plain"]
                    print(f"  {side}: spec / plain {med[f'{side}-spec'] / med[f'{side}-plain']:.2f}x, "
                          f"speculative text {'==' if same else '!='} plain text")
            if "llama-spec" in med:
                print(f"  ours / llama: spec {med['ours-spec'] / med['llama-spec']:.2f}x, "
                      f"plain {med['ours-plain'] / med['llama-plain']:.2f}x", flush=True)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
