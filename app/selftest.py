"""`tramontane --self-test`: prove an installation works end to end, without a network.

Steps, each printed as it passes or fails:

1. version    the package version (pyproject's, through the distribution metadata)
2. model      load the tiny bundled GGUF model + projector with `LocalEngine` on the CPU
3. vision     encode a small generated image through the projector (shape and finite values)
4. generate   a few greedy tokens for a prompt that holds that image
   gpu        the same on the GPU when torch sees a CUDA device (skipped, and said so, without)
5. store      write a chat (text + image) with `Store` in a temporary data dir, reopen, read back
6. gui        build the main window offscreen, if the GUI modules are present

Prints ``OK`` and returns 0 when all pass; otherwise prints which step failed and why, and
returns 1. The bundle ships the tiny model under `tramontane/resources/selftest/`
(packaging copies tests/fixtures' `mistral3_tiny-f32.gguf` and its projector there); a source
checkout falls back to `tests/fixtures/`. `TRAMONTANE_SELFTEST_MODEL` / `..._MMPROJ`, or the
arguments of `run_self_test`, point it at other files.
"""
from __future__ import annotations

import argparse
import io
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, TextIO

MODEL_NAME = "mistral3_tiny-f32.gguf"
MMPROJ_NAME = "mmproj-mistral3_tiny-f32.gguf"
RESOURCE_DIR = "selftest"  # inside the tramontane.resources package
MODEL_ENV = "TRAMONTANE_SELFTEST_MODEL"
MMPROJ_ENV = "TRAMONTANE_SELFTEST_MMPROJ"
GEN_TOKENS = 4


class SelfTestFailure(Exception):
    """A step found something wrong; the message says what."""


def _candidate_dirs() -> list[Path]:
    """Where the tiny model may live: the resources package (bundle / wheel), next to a frozen
    executable, then a source checkout's test fixtures."""
    dirs: list[Path] = []
    try:
        from importlib.resources import files

        dirs.append(Path(str(files("tramontane.resources") / RESOURCE_DIR)))
    except Exception:  # noqa: BLE001 - resources package missing: try the other places
        pass
    if getattr(sys, "frozen", False):
        exe_dir = Path(sys.executable).resolve().parent
        dirs += [exe_dir / RESOURCE_DIR, Path(getattr(sys, "_MEIPASS", exe_dir)) / RESOURCE_DIR]
    try:
        import tramontane.resources as res

        dirs.append(Path(res.__file__).resolve().parent.parent / "tests" / "fixtures")
    except Exception:  # noqa: BLE001
        pass
    return dirs


def find_model() -> tuple[Path, Path | None]:
    """The self-test model and projector paths (env overrides first)."""
    env_model = os.environ.get(MODEL_ENV)
    if env_model:
        env_mmproj = os.environ.get(MMPROJ_ENV)
        return Path(env_model), Path(env_mmproj) if env_mmproj else None
    searched = _candidate_dirs()
    for d in searched:
        if (d / MODEL_NAME).is_file():
            mmproj = d / MMPROJ_NAME
            return d / MODEL_NAME, mmproj if mmproj.is_file() else None
    where = ", ".join(str(d) for d in searched) or "(nowhere)"
    raise SelfTestFailure(f"the self-test model {MODEL_NAME} is not in this installation "
                          f"(looked in {where}); set {MODEL_ENV} to a GGUF model")


def _test_image() -> "ImagePart":  # noqa: F821
    """A small PNG made here: a colour gradient (no file needed, different sizes per axis)."""
    import numpy as np
    from PIL import Image

    from ..engine.api import ImagePart

    h, w = 42, 56
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (w + h - 2)], -1)
    buf = io.BytesIO()
    Image.fromarray(rgb.astype(np.uint8), "RGB").save(buf, "PNG")
    return ImagePart(buf.getvalue(), "selftest.png")


class _Runner:
    def __init__(self, out: TextIO):
        self.out = out
        self.failed: str | None = None

    def step(self, name: str, fn: Callable[[], str]) -> bool:
        """Run one step unless an earlier one failed; print `name: detail (time)`."""
        if self.failed:
            return False
        t0 = time.perf_counter()
        try:
            detail = fn()
        except SelfTestFailure as exc:
            self.failed = f"{name}: {exc}"
        except Exception as exc:  # noqa: BLE001 - the report must name any failure
            msg = str(exc).strip() or type(exc).__name__
            self.failed = f"{name}: {type(exc).__name__}: {msg}"
            if os.environ.get("TRAMONTANE_SELFTEST_TRACEBACK"):
                traceback.print_exc(file=self.out)
        if self.failed:
            print(f"  {name:<9} FAILED", file=self.out, flush=True)
            return False
        print(f"  {name:<9} ok   {detail} ({time.perf_counter() - t0:.2f} s)", file=self.out, flush=True)
        return True


def run_self_test(model: str | Path | None = None, mmproj: str | Path | None = None, *,
                  gui: bool | None = None, gpu: bool | None = None, out: TextIO | None = None) -> int:
    """Run every step; 0 when all pass, 1 (after printing what failed) otherwise.

    `gui`: True requires the window step, False skips it, None runs it when PySide6 and the
    window module import. `gpu`: False skips the GPU step, otherwise it runs when torch sees a
    CUDA device."""
    out = out or sys.stdout
    from tramontane import __version__

    print(f"Tramontane {__version__} self-test ({sys.platform}, Python {sys.version.split()[0]}"
          f"{', frozen' if getattr(sys, 'frozen', False) else ''})", file=out, flush=True)
    r = _Runner(out)
    state: dict = {}

    def version() -> str:
        if not __version__ or __version__.startswith("0+unknown"):
            raise SelfTestFailure("the package metadata is missing (version unknown)")
        return __version__

    def load() -> str:
        if model is not None:
            from ..engine.mistral3.config import find_mmproj

            paths = (Path(model), Path(mmproj) if mmproj else find_mmproj(model))
        else:
            paths = find_model()
        for p in paths:
            if p is not None and not p.is_file():
                raise SelfTestFailure(f"{p}: no such file")
        from ..engine.api import EngineError
        from ..engine.runtime.local import LocalEngine

        try:
            state["engine"] = LocalEngine(paths[0], paths[1], device="cpu", context_length=512)
        except EngineError as exc:
            raise SelfTestFailure(str(exc)) from None
        import torch

        return f"{state['engine'].description}, torch {torch.__version__}"

    def vision() -> str:
        engine = state["engine"]
        if not engine.has_vision:
            raise SelfTestFailure("the model was loaded without a vision projector")
        import torch

        state["image"] = image = _test_image()
        feats = engine.vision.encode_image(image)
        rows, cols = engine.vision.grid(image)
        expected = rows * cols
        if tuple(feats.shape) != (expected, engine.model.cfg.hidden):
            raise SelfTestFailure(f"projector gave features of shape {tuple(feats.shape)}, "
                                  f"expected ({expected}, {engine.model.cfg.hidden})")
        if not torch.isfinite(feats).all():
            raise SelfTestFailure("projector output has NaN/inf values")
        return f"{rows}x{cols} image tokens -> {tuple(feats.shape)}"

    def generate() -> str:
        from ..engine.api import ChatMessage, SamplingParams

        engine = state["engine"]
        msg = ChatMessage("user", [state["image"], "What is in this picture?"])
        pieces: list[str] = []
        params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, ignore_eos=True, seed=0)
        res = engine.chat([msg], params, on_piece=pieces.append, session_key="selftest")
        if len(res.token_ids) != GEN_TOKENS:
            raise SelfTestFailure(f"asked for {GEN_TOKENS} tokens, got {len(res.token_ids)} "
                                  f"(finish reason {res.finish_reason})")
        if "".join(pieces) != res.text:
            raise SelfTestFailure("streamed pieces differ from the final text")
        vocab = engine.model.cfg.vocab_size if hasattr(engine.model.cfg, "vocab_size") else None
        if vocab and not all(0 <= t < vocab for t in res.token_ids):
            raise SelfTestFailure(f"token ids out of range: {res.token_ids}")
        tps = res.stats.decode_tok_s
        state["reply"] = res.text
        return (f"{res.stats.prompt_tokens} prompt tokens, {len(res.token_ids)} generated"
                f"{f', {tps:.0f} tok/s' if tps and math.isfinite(tps) else ''}")

    def on_gpu() -> str:
        """The same prompt on the GPU (torch's CUDA build, and the Triton kernels where they
        apply): it must run and give the requested number of tokens."""
        import torch

        from ..engine.api import ChatMessage, EngineError, SamplingParams
        from ..engine.runtime.local import LocalEngine

        cpu = state["engine"]
        name = torch.cuda.get_device_name(0)
        try:
            eng = LocalEngine(cpu.model_path, cpu.mmproj_path, device="cuda", context_length=512)
        except EngineError as exc:
            raise SelfTestFailure(str(exc)) from None
        try:
            msg = ChatMessage("user", [state["image"], "What is in this picture?"])
            params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, ignore_eos=True, seed=0)
            res = eng.chat([msg], params)
        finally:
            eng.close()
        if len(res.token_ids) != GEN_TOKENS:
            raise SelfTestFailure(f"asked for {GEN_TOKENS} tokens on {name}, got {len(res.token_ids)}")
        return f"{name}, CUDA {torch.version.cuda}, {GEN_TOKENS} tokens generated"

    def store() -> str:
        from ..engine.api import ChatMessage
        from .store import Store

        image = state.get("image") or _test_image()
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

    def window() -> str:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
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
                app.processEvents()
            finally:
                st.close()
        return f"main window {size.width()}x{size.height()} on '{app.platformName()}'"

    r.step("version", version)
    r.step("model", load)
    r.step("vision", vision)
    r.step("generate", generate)
    if gpu is not False and not r.failed:
        import torch

        if torch.cuda.is_available():
            r.step("gpu", on_gpu)
        else:
            why = "a CPU build of torch" if torch.version.cuda is None else "no CUDA device or driver"
            print(f"  gpu       skipped ({why}: models run on the CPU)", file=out, flush=True)
    r.step("store", store)
    if gui is not False:
        if gui is None and not _gui_available():
            print("  gui       skipped (PySide6 or the window module is not installed)", file=out)
        else:
            r.step("gui", window)
    engine = state.get("engine")
    if engine is not None:
        engine.close()
    if r.failed:
        print(f"FAILED: {r.failed}", file=out, flush=True)
        return 1
    print("OK", file=out, flush=True)
    return 0


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
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU step")
    args = parser.parse_args(argv)
    return run_self_test(args.model, args.mmproj, gui=False if args.no_gui else None,
                         gpu=False if args.no_gpu else None)


if __name__ == "__main__":
    sys.exit(main())
