"""`tramontane-cli self-test`: the installation check of `tramontane --self-test`
(app/selftest.py) from a terminal, without the window step unless asked.

Loads the bundled tiny model with its projector and runs a user's first minutes on it (an
image turn, a follow-up from the KV cache, stop, a second chat, regenerate), the store round
trip, and the same on the GPU with CUDA graphs where torch sees one; one line per step, then
`OK` (exit 0) or `FAILED: <step>: <why>` (exit 1). On Windows the GUI executable has no
console: this is where the self-test's output can be read.
"""
from __future__ import annotations


def add_parsers(sub) -> None:
    p = sub.add_parser("self-test", help="check this installation on the bundled tiny model "
                                         "(engine, GPU, store; --gui adds the window)")
    p.add_argument("--model", help="GGUF model to test with (default: the bundled tiny one)")
    p.add_argument("--mmproj", help="its vision projector (default: found beside --model)")
    p.add_argument("--gui", action="store_true", help="also open the main window (offscreen "
                   "without a display)")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU steps")
    p.set_defaults(func=_self_test)


def _self_test(args) -> int:
    from ...app.selftest import run_self_test

    return run_self_test(args.model, args.mmproj, gui=True if args.gui else False,
                         gpu=False if args.no_gpu else None)
