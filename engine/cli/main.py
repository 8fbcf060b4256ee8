"""`tramontane-cli`: the engine from a terminal.

Every error a user can cause (missing file, refused architecture, bad image, context overflow)
ends as one line on stderr naming the file, and a non-zero exit code — never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..api import EngineError
from ..gguf import GGUFError, open_gguf


def _info(args) -> int:
    from ..mistral3.config import describe, find_mmproj

    with open_gguf(args.model) as gf:
        info = describe(gf)
    if info.get("architecture") != "clip":
        mmproj = find_mmproj(args.model)
        info["projector_found"] = str(mmproj) if mmproj else None
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key.ljust(width)}  {value}")
    return 0 if info.get("kind") != "unsupported" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tramontane-cli", description=__doc__.splitlines()[0])
    from tramontane import __version__

    parser.add_argument("--version", action="version", version=f"tramontane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="describe a GGUF file (architecture, sizes, quant types, tokenizer)")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_info)

    p = sub.add_parser("tokenize", help="token ids of TEXT (without BOS)")
    p.add_argument("--model", required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("text")
    p.set_defaults(func=lambda a: _lazy("inspect", "tokenize_main")(a.model, a.text, a.json))

    # Subcommands that live in their own modules register themselves.
    _lazy("run", "add_parsers")(sub)
    _lazy("models", "add_parser")(sub)
    _lazy("selftest", "add_parsers")(sub)
    return parser


def _lazy(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def _tolerant_stdout() -> None:
    """Model text on a terminal that is not UTF-8 (a Windows console, PYTHONIOENCODING=latin-1):
    characters it cannot show become '?' instead of ending the run with a traceback."""
    try:
        if (sys.stdout.encoding or "").lower().replace("-", "") not in ("utf8", "utf_8"):
            sys.stdout.reconfigure(errors="replace")
    except (AttributeError, ValueError, OSError):
        pass  # not a reconfigurable text stream (replaced by the caller): leave it alone


def _check_text_arguments(args) -> None:
    """Text typed on the command line must be UTF-8: bytes that are not arrive as lone
    surrogates (Python's surrogateescape) that no tokenizer can encode. Paths may hold them."""
    for name in ("prompt", "system", "text"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raw = value[exc.start].encode("utf-8", "surrogateescape")
                raise EngineError(f"{'TEXT' if name == 'text' else '--' + name}: not valid UTF-8 "
                                  f"(byte 0x{raw.hex()} at character {exc.start})") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _tolerant_stdout()
    try:
        _check_text_arguments(args)
        return int(args.func(args) or 0)
    except (GGUFError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"error: {exc.filename}: no such file", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except (MemoryError, RuntimeError) as exc:
        # torch.OutOfMemoryError (CUDA) is a RuntimeError; so is the CPU allocator's refusal.
        text = str(exc)
        if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
                or "out of memory" in text or "can't allocate memory" in text):
            raise
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        print(f"error: out of memory ({first}): lower --context-length, or use a smaller model "
              f"or --device cpu", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as a program killed by SIGPIPE would,
        # and point stdout at /dev/null so the interpreter's final flush cannot fail again.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
