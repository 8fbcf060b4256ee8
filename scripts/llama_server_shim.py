#!/usr/bin/env python3
"""Run `tramontane-cli serve` under llama-server's flags, so llama.cpp's own server test suite
(tools/server/tests, which starts the binary named by LLAMA_SERVER_BIN_PATH) runs against it:

    LLAMA_SERVER_BIN_PATH=$PWD/scripts/llama_server_shim.py TRAMONTANE_SHIM_MODEL=tests/fixtures/mistral3_tiny-f16.gguf \\
        python -m pytest -p no:cacheprovider LLAMA_CPP/tools/server/tests/unit/test_basic.py

What the suite would download (--hf-repo, --hf-file, --model-url) is replaced by the local GGUF in
TRAMONTANE_SHIM_MODEL (its projector beside it is found as `serve` finds it); nothing is fetched.
llama-server's flags with an equivalent become it (--port, --host, -m, -c, -np, --api-key,
--mmproj, --model-draft, --threads; --alias and --cors-origins one flag per item of their
comma-separated lists); llama.cpp-only ones are dropped, and named once on stderr.
llama-server allows every origin unless told otherwise; `serve` allows none, so the shim passes `--cors-origin *` when the suite gives no --cors-origins.
TRAMONTANE_CLI names the `tramontane-cli` to run (default: the one on PATH).
"""
from __future__ import annotations

import os
import sys

# llama-server's flags that take a value, as the suite's utils.py passes them, and the `serve`
# flag each one becomes (None: llama.cpp-only, dropped with its value).
VALUED = {
    "--port": "--port", "--host": "--host", "--model": "--model", "-m": "--model",
    "--ctx-size": "--context-length", "-c": "--context-length",
    "--parallel": "--parallel", "-np": "--parallel", "--alias": "--alias",
    "--api-key": "--api-key", "--mmproj": "--mmproj", "--threads": "--threads", "-t": "--threads",
    "--model-draft": "--draft-model", "-md": "--draft-model",
    "--cors-origins": None,  # a comma-separated list: one --cors-origin each (below)
    "--hf-repo": None, "-hf": None, "--hf-file": None, "-hff": None, "--model-url": None, "-mu": None,
    "--temp": None, "--seed": None, "-s": None, "--n-predict": None, "-n": None,
    "--batch-size": None, "-b": None, "--ubatch-size": None, "-ub": None,
    "--n-gpu-layers": None, "-ngl": None, "--pooling": None, "--tags": None,
    "-ctk": None, "-ctv": None, "-fa": None, "--slot-save-path": None,
    "--grp-attn-n": None, "--grp-attn-w": None, "--lora": None, "--spec-type": None,
    "--spec-draft-n-max": None, "--spec-draft-n-min": None, "--spec-synth-len": None,
    "--spec-synth-rates": None, "--reasoning-format": None, "--reasoning": None,
    "--chat-template": None, "--chat-template-file": None, "--mmproj-url": None,
    "--media-path": None, "--sleep-idle-seconds": None, "--cache-ram": None, "--tools": None,
    "--tools-runtime": None, "--mcp-servers-config": None, "--mcp-servers-json": None,
    "--models-dir": None, "--models-max": None, "--models-preset": None,
}
# llama-server's switches (no value): none has a `serve` equivalent (`serve` always renders the
# model's own chat format, batches continuously and answers /health and /slots-free).
SWITCHES = {
    "--offline", "--cont-batching", "--embedding", "--reranking", "--metrics", "--kv-unified",
    "--swa-full", "--slots", "--no-slots", "--verbose", "--context-shift", "--no-ui",
    "--no-models-autoload", "--jinja", "--no-jinja", "--no-mmproj", "--no-cache-idle-slots",
    "--ui-mcp-proxy", "--backend_sampling",
}


def serve_args(argv: list[str], local_model: str | None) -> tuple[list[str], list[str]]:
    """llama-server's argv (without the program) as `serve`'s, and the flags dropped."""
    out: list[str] = []
    dropped: list[str] = []
    model = None
    cors: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in SWITCHES:
            dropped.append(flag)
            i += 1
            continue
        if flag not in VALUED:
            raise SystemExit(f"llama_server_shim: {flag}: not a llama-server flag this shim knows")
        if i + 1 >= len(argv):
            raise SystemExit(f"llama_server_shim: {flag} needs a value")
        value, target = argv[i + 1], VALUED[flag]
        i += 2
        if flag == "--cors-origins":
            cors.extend(o.strip() for o in value.split(",") if o.strip())
        elif target == "--alias":  # llama-server's list, comma-separated; `serve` takes one each
            for alias in (a.strip() for a in value.split(",")):
                out += ["--alias", alias]
        elif target == "--model":
            model = value
        elif target is None:
            dropped.append(flag)
        else:
            out += [target, value]
            if target == "--draft-model":
                out += ["--spec", "draft"]
    model = model or local_model
    if model is None:
        raise SystemExit("llama_server_shim: no model: the suite named none on disk (set TRAMONTANE_SHIM_MODEL "
                         "to a local GGUF for what it would download)")
    for origin in cors or ["*"]:
        out += ["--cors-origin", origin]
    return ["--model", model, *out], dropped


def main() -> None:
    args, dropped = serve_args(sys.argv[1:], os.environ.get("TRAMONTANE_SHIM_MODEL"))
    if dropped:
        print(f"llama_server_shim: llama.cpp-only flags dropped: {' '.join(sorted(set(dropped)))}",
              file=sys.stderr, flush=True)
    cli = os.environ.get("TRAMONTANE_CLI", "tramontane-cli")
    os.execvp(cli, [cli, "serve", *args])


if __name__ == "__main__":
    main()
