"""Speculative decoding end to end, Tramontane's server beside llama.cpp's llama-server in the
same mode on the same GGUF files, in one run (issue 38, bench (c)): prompt lookup and a draft model.

    python bench/spec.py --model TARGET.gguf [--draft-model DRAFT.gguf] [--llama-server /path/llama-server]
                         [--runs ngram:copy draft:text] [--clients 1 8] [--rounds 3] [--tokens 128]
                         [--spec-tokens 8] [--threads 2]

Servers, each its own process with the same thread count and -np slots, all up for the whole
run: ours plain, ours speculating in each mode run (`serve --spec ngram`, `serve --spec draft
--draft-model F`), llama-server plain and speculating in the same modes (`--spec-type
ngram-simple`, or the n-gram type its --help offers, --llama-spec to choose; `--spec-type
draft-simple --model-draft F` where its --help has them). Without --llama-server only ours run.

Tasks (--runs MODE:TASK, default ngram:copy, and draft:text with --draft-model), each client its
own held-out stdlib file (bench/train_pair.py's held-out split), sent raw to /v1/completions (no
chat template: both servers read the same tokens; both sides' prompt tokens are printed),
greedy with ignore_eos:
- copy: a passage, then the same passage with an identifier renamed, cut after its first line
  (train_pair's copy prompt): prompt lookup's task;
- text: --lines lines of code from a `def` a third into the file, to continue: the draft
  model's task (nothing to copy but the file's own start).
A model that copies (a real one, or train_pair's trained target) lets prompt lookup draft;
random weights never copy, so on them this measures what speculation costs when it does not pay.

Rounds are paired: for each run and N, every round runs ours plain, ours speculating, llama
plain and llama speculating one after another, the order rotated each round, so slow spells of
a shared machine fall on all; medians over rounds. Printed: aggregate tok/s per configuration,
the ratios spec/plain on each side and ours/llama in each mode, drafted and accepted tokens as
each server reports them (both: the response's timings.draft_n / draft_n_accepted), and whether
each side's speculative text is its plain text (greedy speculation is lossless: it must be).
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


def text_prompt(text: str, lines: int) -> str | None:
    """`lines` lines from the first `def` where copy_prompt starts looking, to continue."""
    from train_pair import passage_starts

    all_lines = text.splitlines()
    starts = passage_starts(all_lines)
    if not starts:
        return None
    return "\n".join(all_lines[starts[0]:starts[0] + lines]) + "\n"


def held_out_prompts(task: str, n: int, lines: int) -> list[str]:
    """n prompts of `task` (copy or text) from the held-out stdlib files (train_pair's split)."""
    from train_pair import copy_prompt, corpus_files

    make = {"copy": copy_prompt, "text": text_prompt}[task]
    out: list[str] = []
    for path in corpus_files()[1]:
        prompt = make(path.read_text(encoding="utf-8", errors="replace"), lines)
        if prompt:
            out.append(prompt)
        if len(out) == n:
            return out
    if not out:
        sys.exit(f"bench/spec.py: no {task} prompt could be made from the standard library's held-out files")
    return [out[i % len(out)] for i in range(n)]  # fewer files than clients: passages shared


def llama_help(binary: str) -> str:
    try:
        return subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"bench/spec.py: {binary} --help failed: {exc}")


def offers(text: str, flag: str) -> bool:
    return re.search(rf"(^|[\s,]){re.escape(flag)}[\s,=]", text) is not None


def llama_draft_args(text: str, binary: str, draft: str, k: int, threads: int) -> list[str]:
    """llama-server's arguments for a draft model proposing at most k tokens, read off its --help:
    `--spec-type draft-simple` where it has spec types, the draft's length under the name this
    build gives it, the draft on the CPU with our thread count."""
    if not offers(text, "--model-draft"):
        sys.exit(f"bench/spec.py: {binary} has no --model-draft (a build without draft models)")
    args = ["--model-draft", draft, "-ngld", "0"]
    if "draft-simple" in text:
        args += ["--spec-type", "draft-simple"]
    for flag in ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"):
        if offers(text, flag):
            args += [flag, str(k)]
            break
    else:
        print(f"bench/spec.py: {binary} --help names no draft length: its default", file=sys.stderr)
    for flag in ("--threads-draft", "-td"):
        if offers(text, flag):
            args += [flag, str(threads)]
            break
    return args


def llama_ngram_args(text: str, binary: str, wanted: str | None, k: int) -> list[str]:
    """llama-server's arguments for n-gram speculation with at most k drafts, read off its --help
    (the spec types and flag names change between builds)."""
    if "--spec-type" not in text:
        sys.exit(f"bench/spec.py: {binary} has no --spec-type (a build without n-gram speculation)")
    offered = [t for t in NGRAM_PREFERENCE if t in text]
    kind = wanted or (offered[0] if offered else "")
    if not kind or kind not in text:
        sys.exit(f"bench/spec.py: {binary} --help offers none of {wanted or NGRAM_PREFERENCE} for --spec-type")
    from tramontane.engine.runtime.speculative import NGRAM_SIZES

    args = ["--spec-type", kind]
    # its names for the longest draft of that type (builds of late 2026 refuse the old --draft-max)
    for flag in (f"--spec-{kind}-size-m", f"--spec-{kind}-n-max"):
        if offers(text, flag):
            args += [flag, str(k)]
            break
    else:
        print(f"bench/spec.py: {binary} --help names no draft length for {kind}: its default", file=sys.stderr)
    # the n-gram looked up: ours' longest (ngram-simple's default, 12, drafts nothing when it
    # exceeds the draft length: its copy must be at least the n-gram long)
    if offers(text, f"--spec-{kind}-size-n"):
        args += [f"--spec-{kind}-size-n", str(min(max(NGRAM_SIZES), k))]
    return args


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
    def __init__(self, name: str, port: int):
        self.name, self.port = name, port


def one_request(cfg: Config, prompt: str, tokens: int) -> dict:
    body = json.dumps({"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True, "stream": False}).encode()
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
    ap.add_argument("--draft-model", default=None, help="a draft model for the draft mode (both servers)")
    ap.add_argument("--runs", nargs="+", default=None, metavar="MODE:TASK",
                    help="modes (ngram, draft) and tasks (copy, text) to measure "
                         "(default: ngram:copy, and draft:text with --draft-model)")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary (default: only ours)")
    ap.add_argument("--llama-spec", default=None, help="llama-server's n-gram --spec-type (default: the first of "
                    + ", ".join(NGRAM_PREFERENCE) + " its --help offers)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=8, metavar="K")
    ap.add_argument("--lines", type=int, default=16, help="lines of each prompt's passage")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--parallel", type=int, default=8, help="sequences at once on every server")
    ap.add_argument("--context", type=int, default=1024, help="tokens per slot")
    ap.add_argument("--port", type=int, default=18441, help="first of the consecutive ports (two per mode, plus two)")
    args = ap.parse_args(argv)
    runs = [tuple(r.split(":")) for r in (args.runs or ["ngram:copy"] + (["draft:text"] if args.draft_model else []))]
    for run in runs:
        if len(run) != 2 or run[0] not in ("ngram", "draft") or run[1] not in ("copy", "text"):
            sys.exit(f"bench/spec.py: --runs takes MODE:TASK with MODE ngram or draft and TASK copy or text, "
                     f"got {':'.join(run)!r}")
    modes = list(dict.fromkeys(mode for mode, _ in runs))
    if "draft" in modes and not args.draft_model:
        sys.exit("bench/spec.py: a draft run needs --draft-model FILE")

    prompts = {task: held_out_prompts(task, max(args.clients), args.lines) for task in {t for _, t in runs}}
    env = dict(os.environ, TRAMONTANE_THREADS=str(args.threads))
    serve = [sys.executable, "-m", "tramontane.engine.cli.main", "serve", "--model", args.model, "--device", "cpu",
             "--parallel", str(args.parallel), "--context-length", str(args.context)]
    procs: list[subprocess.Popen] = []
    configs: dict[str, int] = {}  # name: port
    how: dict[str, str] = {}

    def start(name: str, cmd: list[str], environ=None) -> None:
        port = args.port + len(procs)
        procs.append(subprocess.Popen(cmd + ["--port", str(port)], env=environ,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs[-1].port = port
        configs[name] = port

    start("ours-plain", serve, env)
    for mode in modes:
        spec = ["--spec", mode, "--spec-tokens", str(args.spec_tokens)]
        spec += ["--draft-model", args.draft_model] if mode == "draft" else []
        start(f"ours-{mode}", serve + spec, env)
        how[f"ours-{mode}"] = "serve " + " ".join(spec)
    if args.llama_server:
        text = llama_help(args.llama_server)
        base = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "-np", str(args.parallel),
                "-c", str(args.context * args.parallel), "-t", str(args.threads), "-tb", str(args.threads), "-ngl", "0"]
        start("llama-plain", base)
        for mode in modes:
            spec = (llama_ngram_args(text, args.llama_server, args.llama_spec, args.spec_tokens) if mode == "ngram"
                    else llama_draft_args(text, args.llama_server, args.draft_model, args.spec_tokens, args.threads))
            start(f"llama-{mode}", base + spec)
            how[f"llama-{mode}"] = "llama-server " + " ".join(spec)
    try:
        for proc in procs:
            wait_ready(proc.port, proc)
        for name, port in configs.items():  # warm-up: first touch of the weights, prefixes cached on every side
            for task_prompts in prompts.values():
                run_round(Config(name, port), task_prompts[:2], 8)
        print(f"model {os.path.basename(args.model)}"
              + (f", draft {os.path.basename(args.draft_model)}" if args.draft_model else "")
              + f", {args.threads} threads, {args.tokens} tokens a reply (greedy, ignore_eos), "
              f"{args.rounds} paired rounds, -np {args.parallel}")
        for name, line in how.items():
            print(f"  {name}: {line}")
        print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
        for mode, task in runs:
            sides = [s for s in ("ours", "llama") if f"{s}-plain" in configs]
            cfgs = [Config(f"{side}-{kind}", configs[f"{side}-{kind}"]) for side in sides for kind in ("plain", mode)]
            for n in args.clients:
                measure_clients(cfgs, mode, task, prompts[task][:n], args.rounds, args.tokens)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def measure_clients(configs: list[Config], mode: str, task: str, prompts: list[str], rounds: int, tokens: int) -> None:
    """Paired rounds of len(prompts) clients on each configuration, printed."""
    rates: dict[str, list[float]] = {c.name: [] for c in configs}
    counts = {c.name: [0, 0] for c in configs}
    texts: dict[str, list[str]] = {}
    prompt_tokens: dict[str, list[int]] = {}
    for r in range(rounds):
        shift = r % len(configs)
        for cfg in configs[shift:] + configs[:shift]:
            rate, replies = run_round(cfg, prompts, tokens)
            rates[cfg.name].append(rate)
            counts[cfg.name][0] += sum(x["drafted"] for x in replies)
            counts[cfg.name][1] += sum(x["accepted"] for x in replies)
            texts.setdefault(cfg.name, [x["text"] for x in replies])
            prompt_tokens.setdefault(cfg.name, [x["prompt_tokens"] for x in replies])
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"\n{mode} on {task}, N = {len(prompts)}: prompt tokens "
          + ", ".join(f"{k} {v[:3]}" for k, v in prompt_tokens.items() if k.endswith("plain")))
    for cfg in configs:
        drafted, accepted = counts[cfg.name]
        note = (f"drafted {drafted}, accepted {accepted} ({100 * accepted / drafted:.0f} %)" if drafted
                else "no drafted tokens reported")
        print(f"  {cfg.name:<12} {med[cfg.name]:8.1f} tok/s   rounds {[round(x, 1) for x in rates[cfg.name]]}"
              + ("" if cfg.name.endswith("plain") else f"   {note}"))
    for side in ("ours", "llama"):
        if f"{side}-{mode}" in med:
            same = texts[f"{side}-{mode}"] == texts[f"{side}-plain"]
            print(f"  {side}: spec / plain {med[f'{side}-{mode}'] / med[f'{side}-plain']:.2f}x, "
                  f"speculative text {'==' if same else '!='} plain text")
    if f"llama-{mode}" in med:
        print(f"  ours / llama: spec {med[f'ours-{mode}'] / med[f'llama-{mode}']:.2f}x, "
              f"plain {med['ours-plain'] / med['llama-plain']:.2f}x", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
