"""`tramontane --self-test`: the engine's self-test (engine/cli/selftest.py: model, kernels,
vision, a user's first minutes in a chat, the GPU), then the app's own steps:

9. store      write a chat (text + image) with `Store` in a temporary data dir, reopen, read back
10. gui       build the main window offscreen, if the GUI modules are present

The bundle's `tramontane-cli self-test` runs this too, without the window unless `--gui`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from ..engine.cli import selftest as engine_selftest
from ..engine.cli.selftest import SelfTestFailure, sample_image


def store_step(state: dict) -> str:
    """Write a chat with its image in a temporary data folder, reopen it, read it back."""
    from ..engine.api import ChatMessage
    from .store import Store

    image = state.get("image") or sample_image()
    reply = state.get("reply", "reply ✓")
    with tempfile.TemporaryDirectory(prefix="tramontane-selftest-") as tmp:
        with Store(tmp) as st:
            chat_id = st.create_chat("self-test ✓")
            st.add_chat_message(chat_id, ChatMessage("user", [image, "What is in this picture?"]))
            st.add_message(chat_id, "assistant", reply)
        with Store(tmp) as st:  # reopened: what was committed is on disk
            chat = st.get_chat(chat_id)
            got = [(m.role, m.text) for m in chat.messages]
            want = [("user", "What is in this picture?"), ("assistant", reply)]
            if got != want or chat.title != "self-test ✓":
                raise SelfTestFailure(f"read back {chat.title!r} {got!r}, wrote {want!r}")
            images = chat.messages[0].images
            if len(images) != 1 or images[0].path.read_bytes() != image.data:
                raise SelfTestFailure("the attached image did not come back byte for byte")
    return "chat written, reopened and read back"


def window_step(state: dict) -> str:
    """Build the main window offscreen (no display needed) on an empty data folder."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    from .store import Store
    from .window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "tramontane"])
    with tempfile.TemporaryDirectory(prefix="tramontane-selftest-gui-") as tmp:
        st = Store(tmp)
        try:
            win = MainWindow(st, autoload=False)
            win.show()
            app.processEvents()
            size = win.size()
            win.close()
            win.deleteLater()  # gone now, not at exit: the self-test may run inside a live app
            app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            app.processEvents()
        finally:
            st.close()
    return f"main window {size.width()}x{size.height()} on '{app.platformName()}'"


def run_self_test(model: str | Path | None = None, mmproj: str | Path | None = None, *,
                  gui: bool | None = None, gpu: bool | None = None, out: TextIO | None = None) -> int:
    """The engine's steps, then the store and the window; 0 when all pass, 1 otherwise.

    `gui`: True requires the window step, False skips it, None runs it when PySide6 and the
    window module import. `gpu`: False skips the GPU step, otherwise it runs when torch sees a
    CUDA device."""
    steps = [("store", store_step)]
    why = {}
    if gui is not False:
        if gui is None and not _gui_available():
            steps.append(("gui", None))
            why["gui"] = "PySide6 or the window module is not installed"
        else:
            steps.append(("gui", window_step))
    return engine_selftest.run_self_test(model, mmproj, gpu=gpu, out=out, more_steps=steps,
                                         skipped_why=why)


def _gui_available() -> bool:
    import importlib.util

    try:
        return (importlib.util.find_spec("PySide6") is not None
                and importlib.util.find_spec("tramontane.app.window") is not None)
    except (ImportError, ValueError):
        return False


def run(args: argparse.Namespace | None = None) -> int:
    """Hook for `tramontane --self-test` (app/main.py's COMMANDS)."""
    return run_self_test(gui=None if not getattr(args, "no_gui", False) else False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tramontane --self-test", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF model to test with (default: the bundled tiny one)")
    parser.add_argument("--mmproj", help="its vision projector")
    parser.add_argument("--no-gui", action="store_true", help="skip the window step")
    parser.add_argument("--gui", action="store_true", help="require the window step (wins over "
                        "--no-gui: the bundle's `tramontane-cli self-test --gui`)")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU step")
    args = parser.parse_args(argv)
    gui = True if args.gui else False if args.no_gui else None
    return run_self_test(args.model, args.mmproj, gui=gui, gpu=False if args.no_gpu else None)


if __name__ == "__main__":
    sys.exit(main())
