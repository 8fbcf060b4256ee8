"""What the OpenAI-compatible server adds to a generation: per request and per streamed token.

    python bench/server.py [--model M.gguf] [--device cpu|cuda|auto] [--tokens N] [--repeat R]

The same generation (same prompt, same KV session, greedy, on the engine's own thread) is timed
in-process and through the server. The client is another process, as real clients are (in this
one it would compete for the GIL), on one keep-alive loopback connection with plain http.client,
so its own cost stays small. A 1-token non-streamed reply gives the fixed cost per request, an
N-token streamed reply the cost per token; the two are timed alternately and the best of
--repeat kept, the run least disturbed by other work on a shared machine.
Goals: < 2 ms per request, < 5 % per streamed token.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.runtime.local import LocalEngine
from tramontane.engine.server.executor import ThreadExecutor
from tramontane.engine.server.http import OpenAIServer

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "tests", "fixtures", "mistral3_tiny-f32.gguf")
PROMPT = "Tell me about the north wind."

# The client process: for each line "MAX_TOKENS STREAM" on stdin, one request; prints its seconds.
CLIENT = """
import http.client, json, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for line in sys.stdin:
    max_tokens, stream = line.split()
    body = json.dumps({"messages": [{"role": "user", "content": sys.argv[2]}], "max_tokens": int(max_tokens),
                       "temperature": 0, "ignore_eos": True, "stream": stream == "1"}).encode()
    t = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.perf_counter() - t
    if resp.status != 200:
        sys.exit(data[:300])
    print(elapsed, flush=True)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=200, help="streamed reply length")
    ap.add_argument("--repeat", type=int, default=21)
    args = ap.parse_args(argv)

    engine = LocalEngine(args.model, None, device=args.device)
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0).start()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(server.port), PROMPT],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    messages = [ChatMessage.text("user", PROMPT)]

    def served(max_tokens: int, stream: bool) -> float:
        client.stdin.write(f"{max_tokens} {int(stream)}\n")
        client.stdin.flush()
        line = client.stdout.readline()
        if not line:
            sys.exit("the client process failed")
        return float(line)

    def in_process(max_tokens: int, stream: bool) -> float:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        executor.submit(lambda engine: engine.chat(
            messages, params, on_piece=(lambda piece: None) if stream else None, session_key=key)).result()
        return time.perf_counter() - t

    def best_of_both(max_tokens: int, stream: bool) -> tuple[float, float]:
        local, remote = [], []
        for _ in range(args.repeat):
            local.append(in_process(max_tokens, stream))
            remote.append(served(max_tokens, stream))
        return min(local), min(remote)

    try:
        served(1, False)  # the server now knows this conversation and its KV session
        key = server.conversations.key_for(messages)
        request_local, request_http = best_of_both(1, False)
        stream_local, stream_http = best_of_both(args.tokens, True)
    finally:
        client.stdin.close()
        client.wait()
        server.stop()
        executor.shutdown()
    per_request = (request_http - request_local) * 1e3
    per_token = (stream_http - stream_local) / args.tokens * 1e3
    share = (stream_http - stream_local) / stream_local * 100
    print(f"model {os.path.basename(args.model)} on {engine.model.device}")
    print(f"1-token reply        in-process {request_local * 1e3:8.2f} ms   server {request_http * 1e3:8.2f} ms")
    print(f"{args.tokens}-token stream     in-process {stream_local * 1e3:8.2f} ms   server {stream_http * 1e3:8.2f} ms")
    print(f"server overhead: {per_request:.2f} ms per request (goal < 2), {per_token:.3f} ms = {share:.1f} % "
          f"per streamed token (goal < 5 %)")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
