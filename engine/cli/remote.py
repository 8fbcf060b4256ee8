"""`tramontane-cli run --server URL --model NAME ...`: one chat turn against an
OpenAI-compatible server, streamed to stdout (or one JSON object with --json).

engine/cli.py calls `run_remote(args)` when `--server` is given; `add_run_arguments(parser)`
declares every option this needs (`add_remote_arguments` only the server-specific ones, for a
parser that already has the shared run options). Exit codes: 0 done, 1 the server or the
stream failed (message on stderr), 2 bad arguments, 130 interrupted by Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from ..api import ChatMessage, EngineError, ImagePart, SamplingParams
from ..remote.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S, RemoteEngine


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", metavar="URL",
                        help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="environment variable that holds the server's API key")
    parser.add_argument("--timeout", type=float, default=DEFAULT_READ_TIMEOUT_S, metavar="S",
                        help="longest silence accepted from the server (seconds)")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_remote_arguments(parser)
    parser.add_argument("--model", required=True, help="model name as the server lists it")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--image", action="append", default=[], metavar="PATH")
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--max-tokens", type=int, default=SamplingParams.max_tokens)
    parser.add_argument("--temperature", type=float, default=SamplingParams.temperature)
    parser.add_argument("--top-p", type=float, default=SamplingParams.top_p)
    parser.add_argument("--top-k", type=int, default=SamplingParams.top_k)
    parser.add_argument("--min-p", type=float, default=SamplingParams.min_p)
    parser.add_argument("--repetition-penalty", type=float,
                        default=SamplingParams.repetition_penalty)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of streaming text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tramontane-cli run",
                                     description="Chat once with an OpenAI-compatible server.")
    add_run_arguments(parser)
    return parser


def _arg(args: argparse.Namespace, name: str, default=None):
    value = getattr(args, name, None)
    return default if value is None else value


def run_remote(args: argparse.Namespace) -> int:
    server = _arg(args, "server")
    model = _arg(args, "model")
    prompt = _arg(args, "prompt")
    if not server or not model or prompt is None:
        print("error: run --server needs --server URL, --model NAME and --prompt TEXT",
              file=sys.stderr)
        return 2
    api_key = None
    key_var = _arg(args, "api_key_env")
    if key_var:
        api_key = os.environ.get(key_var)
        if not api_key:
            print(f"error: --api-key-env: the environment variable {key_var} is not set",
                  file=sys.stderr)
            return 2
    as_json = bool(_arg(args, "json", False))
    try:
        images = [ImagePart.from_path(p) for p in _arg(args, "image", [])]
        messages = []
        if _arg(args, "system"):
            messages.append(ChatMessage.text("system", args.system))
        # images first, then the prompt: the same message the local `run` builds
        messages.append(ChatMessage("user", [*images, prompt]))
        defaults = SamplingParams()
        params = SamplingParams(
            max_tokens=_arg(args, "max_tokens", defaults.max_tokens),
            temperature=_arg(args, "temperature", defaults.temperature),
            top_p=_arg(args, "top_p", defaults.top_p),
            top_k=_arg(args, "top_k", defaults.top_k),
            min_p=_arg(args, "min_p", defaults.min_p),
            repetition_penalty=_arg(args, "repetition_penalty", defaults.repetition_penalty),
            seed=_arg(args, "seed"),
            ignore_eos=bool(_arg(args, "ignore_eos", False)))
        engine = RemoteEngine(server, model, api_key,
                              connect_timeout=min(DEFAULT_CONNECT_TIMEOUT_S,
                                                  _arg(args, "timeout", DEFAULT_READ_TIMEOUT_S)),
                              read_timeout=_arg(args, "timeout", DEFAULT_READ_TIMEOUT_S))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    cancel = threading.Event()
    try:
        result = engine.chat(messages, params, on_piece=None if as_json else show,
                             cancel=cancel)
    except EngineError as exc:
        if not as_json:
            sys.stdout.write("\n")
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        cancel.set()
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        engine.close()

    stats = result.stats
    error = getattr(result, "error", None)
    if as_json:
        print(json.dumps({
            "text": result.text,
            "token_ids": list(result.token_ids),
            "prompt_token_ids": list(result.prompt_token_ids),
            "finish_reason": result.finish_reason,
            "ttft_s": stats.ttft_s,
            "prefill_tok_s": stats.prefill_tok_s,
            "decode_tok_s": stats.decode_tok_s,
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "usage": getattr(result, "usage", None),
            "error": error,
        }, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(f"[{stats.prompt_tokens} prompt tokens, {stats.generated_tokens} generated, "
              f"TTFT {stats.ttft_s:.3f}s, prefill {stats.prefill_tok_s:.1f} tok/s, decode "
              f"{stats.decode_tok_s:.1f} tok/s, {stats.finish_reason}, {engine.description}]",
              file=sys.stderr)
    if result.finish_reason == "interrupted":
        print(f"error: the reply was interrupted: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_remote(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
