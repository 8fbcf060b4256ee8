"""`tramontane-cli`: one parser for every subcommand, one error handler.

Every error a user can cause (missing file, refused architecture, bad image, context overflow,
a server that refuses) ends as one line on stderr naming the file or the option, and exit code 2
(1 when a reply started and then failed: an interrupted stream, a checksum mismatch) — never a
traceback. Subcommand modules only declare their options (`add_parsers`) and raise.
"""
from __future__ import annotations

import argparse
import copy
import sys

from ..api import EngineError
from ..gguf import GGUFError
from . import bench, inspect, models, run, selftest, serve
from ..runtime.threads import apply_threads
from .run import CommandFailed

SUBCOMMAND_MODULES = (inspect, run, serve, bench, models, selftest)  # order of `--help`


def _shows_default(action: argparse.Action) -> bool:
    return (bool(action.option_strings) and action.help is not argparse.SUPPRESS
            and action.default is not None and action.default is not False
            and action.default != [] and action.default is not argparse.SUPPRESS
            and "default" not in (action.help or ""))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option that has a default says it in --help, options without a help text too
    (argparse's ArgumentDefaultsHelpFormatter skips those)."""

    def _format_action(self, action):
        if _shows_default(action):
            action = copy.copy(action)
            action.help = f"{action.help} (default: %(default)s)" if action.help else "(default: %(default)s)"
        return super()._format_action(action)


class CliParser(argparse.ArgumentParser):
    """A mistyped option is one line naming it and where help is, not the whole usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from tramontane import __version__

    parser = CliParser(prog="tramontane-cli",
                       description="Tramontane: Mistral 3-family GGUF models from a terminal.")
    parser.add_argument("--version", action="version", version=f"Tramontane {__version__}")  # as the app says it
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CliParser)
    for module in SUBCOMMAND_MODULES:
        module.add_parsers(sub)
    return parser


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


def _is_out_of_memory(exc: BaseException) -> bool:
    # torch.OutOfMemoryError (CUDA) is a RuntimeError; so is the CPU allocator's refusal.
    text = str(exc)
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "out of memory" in text or "can't allocate memory" in text)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _tolerant_stdout()
    try:
        _check_text_arguments(args)
        if getattr(args, "threads", None) is not None:
            apply_threads(args.threads)
        return int(args.func(args) or 0)
    except CommandFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (GGUFError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"error: {exc.filename}: no such file", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as exc:
        if not _is_out_of_memory(exc):
            raise
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
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
