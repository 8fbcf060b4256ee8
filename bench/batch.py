"""Many clients at once: aggregate tokens/s and time to first token, Tramontane's server beside
llama.cpp's llama-server (continuous batching, -np slots) on the same GGUF, in one run.

    python bench/batch.py --model bench-Q4_K_M.gguf --llama-server /path/llama-server
                          [--clients 1 4 8] [--rounds 5] [--tokens 48] [--threads 2]

Both servers run as their own processes with the same thread count, both up for the whole
run; the clients are threads of this process (plain http.client, streamed chat completions,
greedy, ignore_eos, so every reply is exactly --tokens long). Rounds are paired: for each N,
round r runs ours then theirs (the order flips every round), so slow spells of a shared machine
fall on both; medians over rounds are reported, TTFT p50/p95 over every request at that N, and
the load average before and after. Both read the same prompts: a file whose chat template is a
llama.cpp template name (the bench model's "mistral-v7-tekken") is given to llama-server as that
built-in template, since its Jinja engine renders the bare name as the whole prompt (every
request the same 8 tokens, 7 of them cached: a one-token prefill); the prompt tokens of both
sides are printed.

--priority-prompt P (in this process, after the servers stop): the time to first token of a
priority request (the window's reply) with a P-token prompt, idle and while --parallel API
streams decode, alternated over --rounds (goal: at most 1.3x idle).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

QUESTIONS = ["the north wind", "sea salt", "old maps", "mountain passes", "river deltas", "lighthouses",
             "glaciers", "desert stars", "harbour cranes", "tide tables"]


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server on port {port} exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"the server on port {port} did not come up in {timeout:.0f} s")


def llama_template_args(model: str) -> list[str]:
    """llama-server's arguments for the file's chat template when it is a built-in name, not
    Jinja text (llama-server's Jinja engine would render the name itself as the prompt)."""
    from tramontane.engine.gguf import open_gguf

    with open_gguf(model) as gf:
        template = gf.string("tokenizer.chat_template", default="").strip()
    if template and "{" not in template and len(template) < 64:
        return ["--no-jinja", "--chat-template", template]
    return []


def one_request(port: int, prompt: str, tokens: int) -> tuple[float, float, int, int]:
    """(ttft, total seconds, completion tokens, prompt tokens) of one streamed greedy reply."""
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"port {port}: HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, chunks, usage, prompt_tokens = None, 0, None, 0
    for line in resp:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"]["completion_tokens"]
            prompt_tokens = event["usage"].get("prompt_tokens", 0)
        for choice in event.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    total = time.perf_counter() - t0
    conn.close()
    return ttft if ttft is not None else total, total, usage if usage is not None else chunks, prompt_tokens


def run_round(port: int, n: int, tokens: int, tag: str) -> tuple[float, list[float], list[int]]:
    """n clients at once, each one request: (aggregate tok/s, their TTFTs, their prompt tokens)."""
    results: list = [None] * n
    errors: list = []

    def client(i: int) -> None:
        try:
            results[i] = one_request(port, f"[{tag}-{i}] Tell me about {QUESTIONS[i % len(QUESTIONS)]}.", tokens)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(r[2] for r in results) / wall, [r[0] for r in results], [r[3] for r in results]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def priority_ttft(args) -> None:
    """The window's lane: a priority request's TTFT idle and beside --parallel running streams."""
    from tramontane.engine.api import SamplingParams
    from tramontane.engine.mistral3.chat_format import EncodedPrompt
    from tramontane.engine.runtime.batch import BatchScheduler
    from tramontane.engine.runtime.local import LocalEngine

    engine = LocalEngine(args.model, None, device="cpu", context_length=args.context)
    sched = BatchScheduler(engine.model, engine.tokenizer, slots=args.parallel, context_length=args.context).start()
    vocab = engine.tokenizer.vocab_size
    stream = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    window = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)

    def prompt(seed: int, n: int) -> EncodedPrompt:
        return EncodedPrompt([engine.tokenizer.bos_id] + [1000 + (seed * 7919 + i * 104729) % (vocab - 1000)
                                                          for i in range(n - 1)])

    idle, busy = [], []
    for r in range(args.rounds):
        idle.append(sched.generate(prompt(2 * r, args.priority_prompt), window, priority=True).stats.ttft_s)
        cancel = threading.Event()
        streams = [sched.submit(prompt(100 + 10 * r + i, 20), stream, cancel=cancel) for i in range(args.parallel)]
        while sched.active < args.parallel:
            time.sleep(0.01)
        time.sleep(0.5)  # they decode
        busy.append(sched.generate(prompt(2 * r + 1, args.priority_prompt), window, priority=True).stats.ttft_s)
        cancel.set()
        for f in streams:
            f.result()
    sched.close()
    engine.close()
    a, b = statistics.median(idle), statistics.median(busy)
    print(f"priority reply, {args.priority_prompt}-token prompt: TTFT idle {a:.2f} s, beside {args.parallel} "
          f"streams {b:.2f} s ({b / a:.2f}x; rounds idle {[round(x, 2) for x in idle]}, "
          f"busy {[round(x, 2) for x in busy]})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--parallel", type=int, default=8, help="sequences at once on both servers")
    ap.add_argument("--context", type=int, default=1024, help="tokens per slot")
    ap.add_argument("--ports", type=int, nargs=2, default=[18431, 18432])
    ap.add_argument("--priority-prompt", type=int, default=0, metavar="P",
                    help="then measure the priority lane's TTFT with a P-token prompt (0: skip)")
    args = ap.parse_args(argv)

    ours_port, theirs_port = args.ports
    env = dict(os.environ, TRAMONTANE_THREADS=str(args.threads))
    ours = subprocess.Popen([sys.executable, "-m", "tramontane.engine.cli.main", "serve", "--model", args.model,
                             "--device", "cpu", "--port", str(ours_port), "--parallel", str(args.parallel),
                             "--context-length", str(args.context)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs = subprocess.Popen([args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(theirs_port),
                               "-np", str(args.parallel), "-c", str(args.context * args.parallel),
                               "-t", str(args.threads), "-tb", str(args.threads), "-ngl", "0",
                               *llama_template_args(args.model)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(ours_port, ours)
        wait_ready(theirs_port, theirs)
        prompt_tokens = {}
        for port in (ours_port, theirs_port):  # warm-up: first-touch of the weights, threads
            prompt_tokens[port] = run_round(port, 2, 8, "warm")[2]
        print(f"model {os.path.basename(args.model)}, {args.threads} threads, {args.tokens} tokens a reply, "
              f"{args.rounds} paired rounds, -np {args.parallel} on both; prompt tokens ours "
              f"{prompt_tokens[ours_port]}, llama-server {prompt_tokens[theirs_port]}")
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        print(f"{'N':>3} | {'tok/s ours':>10} {'llama':>8} {'ratio':>6} | {'TTFT p50 ours':>13} {'llama':>7} | "
              f"{'p95 ours':>8} {'llama':>7}")
        for n in args.clients:
            rates = {"ours": [], "theirs": []}
            ttfts = {"ours": [], "theirs": []}
            for r in range(args.rounds):
                order = [("ours", ours_port), ("theirs", theirs_port)]
                for name, port in (order if r % 2 == 0 else order[::-1]):
                    rate, firsts, _ = run_round(port, n, args.tokens, f"{n}-{r}")  # the same prompts on both
                    rates[name].append(rate)
                    ttfts[name] += firsts
            a, b = statistics.median(rates["ours"]), statistics.median(rates["theirs"])
            print(f"{n:>3} | {a:>10.1f} {b:>8.1f} {a / b:>5.2f}x | {pct(ttfts['ours'], .5):>12.2f}s "
                  f"{pct(ttfts['theirs'], .5):>6.2f}s | {pct(ttfts['ours'], .95):>7.2f}s "
                  f"{pct(ttfts['theirs'], .95):>6.2f}s   (rounds ours {[round(x, 1) for x in rates['ours']]}, "
                  f"llama {[round(x, 1) for x in rates['theirs']]})", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        for proc in (ours, theirs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.priority_prompt:
        os.environ["TRAMONTANE_THREADS"] = str(args.threads)
        priority_ttft(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
