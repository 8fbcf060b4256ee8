"""`tramontane-cli self-test`: prove the engine of an installation works end to end, without
a network; `tramontane --self-test` (app/selftest.py) runs these steps, then the store's and the
window's.

Steps, each printed as it passes or fails:

1. version    the package version (pyproject's, through the distribution metadata)
2. model      load the tiny bundled GGUF model + projector with `LocalEngine` on the CPU
   kernels    the native CPU kernels (tramontane.kernels._cpu) load and multiply right; a
              frozen build must have them, a source checkout says when they are not built
3. vision     encode a small generated image through the projector (shape and finite values)
   then a user's first minutes in a chat, as the app's worker drives the engine:
4. turn1      a first message holding that image: a few greedy tokens, streamed
5. turn2      a follow-up in the same chat: the first turn's prompt (image included) must come
              from the KV cache (the prefill that continues a cached prefix)
6. stop       a third message whose reply is stopped after its first piece (Stop button)
7. new-chat   a message in a second chat: it reuses no more than what it shares with the first;
              the first chat's KV stays as the prefix cache's blocks
8. regenerate the stopped reply again, back in the first chat: its KV comes back from the
              prefix cache's blocks and the prompt is (almost) all cached
   gpu, gpu-* the same on the GPU with CUDA graphs decoding, when torch sees a CUDA device
              (skipped, and said so, without)

Prints ``OK`` and returns 0 when all pass; otherwise prints which step failed and why, and
returns 1. On Windows the GUI executable has no console: the bundle's `tramontane-cli
self-test` is where the output can be read. The bundle ships the tiny model under
`tramontane/resources/selftest/` (packaging copies tests/fixtures' `mistral3_tiny-f32.gguf` and
its projector there); a source checkout falls back to `tests/fixtures/`.
`TRAMONTANE_SELFTEST_MODEL` / `..._MMPROJ`, or the arguments of `run_self_test`, point it at
other files.
"""
from __future__ import annotations

import io
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence, TextIO

from ...env import read_env, variable

MODEL_NAME = "mistral3_tiny-f32.gguf"
MMPROJ_NAME = "mmproj-mistral3_tiny-f32.gguf"
RESOURCE_DIR = "selftest"  # inside the tramontane.resources package
MODEL_ENV = variable("selftest_model")
GEN_TOKENS = 4
STOP_MAX_TOKENS = 64  # the stop step's reply would be this long; it is stopped after one piece
QUESTIONS = ("What is in this picture?", "And which colours does it have?", "Tell me more.")
FIRST_CHAT, SECOND_CHAT = "selftest-1", "selftest-2"  # session keys (the app uses chat ids)


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
    env = read_env()
    if env.selftest_model:
        return env.selftest_model, env.selftest_mmproj
    searched = _candidate_dirs()
    for d in searched:
        if (d / MODEL_NAME).is_file():
            mmproj = d / MMPROJ_NAME
            return d / MODEL_NAME, mmproj if mmproj.is_file() else None
    where = ", ".join(str(d) for d in searched) or "(nowhere)"
    raise SelfTestFailure(f"the self-test model {MODEL_NAME} is not in this installation "
                          f"(looked in {where}); set {MODEL_ENV} to a GGUF model")


def sample_image() -> "ImagePart":  # noqa: F821
    """A small PNG made here: a colour gradient (no file needed, different sizes per axis)."""
    import numpy as np
    from PIL import Image

    from ..api import ImagePart

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
            if read_env().selftest_traceback:
                traceback.print_exc(file=self.out)
        if self.failed:
            print(f"  {name:<10} FAILED", file=self.out, flush=True)
            return False
        print(f"  {name:<10} ok   {detail} ({time.perf_counter() - t0:.2f} s)", file=self.out, flush=True)
        return True


def run_self_test(model: str | Path | None = None, mmproj: str | Path | None = None, *,
                  gpu: bool | None = None, out: TextIO | None = None,
                  more_steps: Sequence[tuple[str, Callable[[dict], str] | None]] = (),
                  skipped_why: dict[str, str] | None = None) -> int:
    """Run every step; 0 when all pass, 1 (after printing what failed) otherwise.

    `gpu`: False skips the GPU step, otherwise it runs when torch sees a CUDA device.
    `more_steps`: (name, step) run after the engine's, each step given the state the engine's
    steps left (`image`: the turn1 image); a None step is printed as skipped (`skipped_why[name]`)."""
    out = out or sys.stdout
    from tramontane import __version__

    print(f"Tramontane {__version__} self-test ({sys.platform}, Python {sys.version.split()[0]}"
          f"{', frozen' if getattr(sys, 'frozen', False) else ''})", file=out, flush=True)
    r = _Runner(out)
    state: dict = {}
    skipped_why = skipped_why or {}
    r.step("version", lambda: _check_version(__version__))
    r.step("model", lambda: _load(state, model, mmproj))
    r.step("kernels", _check_kernels)
    r.step("vision", lambda: _check_vision(state))
    if not r.failed:
        _Conversation(state, "engine").run(r)
    if gpu is not False and not r.failed:
        _gpu_steps(r, state, out)
    for name, step in more_steps:  # the app's: the store, the window
        if step is None:
            print(f"  {name:<10} skipped ({skipped_why.get(name, 'not asked for')})", file=out, flush=True)
        else:
            r.step(name, lambda step=step: step(state))
    engine = state.get("engine")
    if engine is not None:
        engine.close()
    if r.failed:
        print(f"FAILED: {r.failed}", file=out, flush=True)
        return 1
    print("OK", file=out, flush=True)
    return 0


def _check_version(version: str) -> str:
    if not version or version.startswith("0+unknown"):
        raise SelfTestFailure("the package metadata is missing (version unknown)")
    return version


def _load(state: dict, model: str | Path | None, mmproj: str | Path | None) -> str:
    """The model and its projector on the CPU, as state["engine"]."""
    if model is not None:
        from ..library.projector import find_projector

        paths = (Path(model), Path(mmproj) if mmproj else find_projector(model))
    else:
        paths = find_model()
    for p in paths:
        if p is not None and not p.is_file():
            raise SelfTestFailure(f"{p}: no such file")
    from ..api import EngineError
    from ..runtime.local import LocalEngine

    try:
        state["engine"] = LocalEngine(paths[0], paths[1], device="cpu", context_length=512)
    except EngineError as exc:
        raise SelfTestFailure(str(exc)) from None
    import torch

    return f"{state['engine'].description}, torch {torch.__version__}"


def _check_kernels() -> str:
    import torch

    from ...kernels import cpu_native
    from ...kernels.ggml_types import F32

    if not cpu_native.AVAILABLE:
        why = f"the native CPU kernels are not built ({cpu_native.IMPORT_ERROR})"
        if getattr(sys, "frozen", False):
            raise SelfTestFailure(f"{why}: this build lacks tramontane.kernels._cpu")
        return (f"{why}: torch's slower CPU path runs; {cpu_native.NO_KERNELS_FIX}")
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 64, generator=gen), torch.randn(32, 64, generator=gen)
    y = cpu_native.matmul(x, F32, w, 32, 64)
    if not torch.allclose(y, x @ w.T, rtol=1e-4, atol=1e-4):
        raise SelfTestFailure(f"the native {cpu_native.variant()} matmul differs from torch's "
                              f"by {(y - x @ w.T).abs().max().item():.3g}")
    return f"native CPU kernels {cpu_native.variant()} on {cpu_native.threads()} thread(s)"


def _check_vision(state: dict) -> str:
    """The sample image through the projector; it is kept as state["image"] for turn1."""
    engine = state["engine"]
    if not engine.has_vision:
        raise SelfTestFailure("the model was loaded without a vision projector")
    import torch

    state["image"] = image = sample_image()
    feats = engine.vision.encode_image(image)
    rows, cols = engine.vision.grid(image)
    expected = rows * cols
    if tuple(feats.shape) != (expected, engine.model.cfg.hidden):
        raise SelfTestFailure(f"projector gave features of shape {tuple(feats.shape)}, "
                              f"expected ({expected}, {engine.model.cfg.hidden})")
    if not torch.isfinite(feats).all():
        raise SelfTestFailure("projector output has NaN/inf values")
    return f"{rows}x{cols} image tokens -> {tuple(feats.shape)}"


def _gpu_steps(r: _Runner, state: dict, out: TextIO) -> None:
    """The GPU step and the conversation on it when torch sees a CUDA device; else why not."""
    import torch

    if not torch.cuda.is_available():
        why = "a CPU build of torch" if torch.version.cuda is None else "no CUDA device or driver"
        print(f"  gpu        skipped ({why}: models run on the CPU)", file=out, flush=True)
        return
    try:
        if r.step("gpu", lambda: _load_on_gpu(state)):
            _Conversation(state, "gpu_engine").run(r, "gpu-")
    finally:
        if state.get("gpu_engine") is not None:
            state.pop("gpu_engine").close()


def _load_on_gpu(state: dict) -> str:
    """Load the same files on the GPU (torch's CUDA build, the Triton kernels where they
    apply, CUDA graphs for decoding), as state["gpu_engine"]; the conversation steps then run on it."""
    import torch

    from ..api import EngineError
    from ..runtime.local import LocalEngine

    cpu = state["engine"]
    name = torch.cuda.get_device_name(0)
    try:
        state["gpu_engine"] = eng = LocalEngine(cpu.model_path, cpu.mmproj_path, device="cuda",
                                                context_length=512)
    except EngineError as exc:
        raise SelfTestFailure(str(exc)) from None
    if not eng.model.on_gpu:
        raise SelfTestFailure(f"asked for the GPU, the model was loaded on the CPU ({name}: "
                              f"torch {torch.__version__}, CUDA {torch.version.cuda})")
    if read_env().cuda_graphs and eng.pool.decode_graphs is None:
        raise SelfTestFailure("CUDA graph decoding is off for a model on the GPU")
    graphs = "on" if eng.pool.decode_graphs is not None else "off (TRAMONTANE_CUDA_GRAPHS=0)"
    return f"{name}, CUDA {torch.version.cuda}, CUDA graphs {graphs}"


class _Conversation:
    """A user's first minutes on the engine in state[key], as the app's worker drives it
    (steps turn1, turn2, stop, new-chat, regenerate; each needs the one before)."""

    def __init__(self, state: dict, key: str):
        self.state = state
        self.key = key
        self.msgs: list = []
        self.first_prompt = 0
        self.stopped: list = []

    def run(self, r: _Runner, prefix: str = "") -> None:
        r.step(f"{prefix}turn1", self.turn1)
        r.step(f"{prefix}turn2", self.turn2)
        r.step(f"{prefix}stop", self.stop)
        r.step(f"{prefix}new-chat", self.new_chat)
        r.step(f"{prefix}regenerate", self.regenerate)

    def ask(self, messages, session: str, max_tokens: int = GEN_TOKENS, stop_after: int = 0):
        """engine.chat as the worker calls it; checks what every reply must satisfy."""
        import threading

        from ..api import SamplingParams

        engine = self.state[self.key]
        pieces: list[str] = []
        cancel = threading.Event()

        def on_piece(piece: str) -> None:
            pieces.append(piece)
            if stop_after and len(pieces) >= stop_after:
                cancel.set()  # the Stop button: the UI thread sets the request's event

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, seed=0)
        res = engine.chat(messages, params, on_piece=on_piece, cancel=cancel, session_key=session)
        if "".join(pieces) != res.text:
            raise SelfTestFailure("the streamed pieces differ from the reply's text")
        vocab = engine.model.cfg.vocab_size
        if not all(0 <= t < vocab for t in res.token_ids):
            raise SelfTestFailure(f"token ids out of range: {res.token_ids}")
        return res

    def turn1(self) -> str:
        from ..api import ChatMessage

        msgs = [ChatMessage("user", [self.state["image"], QUESTIONS[0]])]
        res = self.ask(msgs, FIRST_CHAT)
        _expect_tokens(res, GEN_TOKENS, "first turn")
        if res.stats.reused_tokens:
            raise SelfTestFailure(f"a new chat reused {res.stats.reused_tokens} cached tokens")
        self.msgs = msgs + [ChatMessage.text("assistant", res.text)]
        self.first_prompt = res.stats.prompt_tokens
        self.state.setdefault("reply", res.text)
        detail = ""
        engine = self.state[self.key]
        if engine.model.on_gpu and read_env().cuda_graphs:
            graphs = engine.pool.decode_graphs.graphs if engine.pool.decode_graphs is not None else {}
            if not graphs:
                raise SelfTestFailure("the reply was decoded without a CUDA graph")
            detail = f", decoded in {len(graphs)} CUDA graph(s)"
        return (f"image + question: {res.stats.prompt_tokens} prompt tokens, "
                f"{len(res.token_ids)} generated{_speed(res)}{detail}")

    def turn2(self) -> str:
        from ..api import ChatMessage

        msgs = self.msgs + [ChatMessage.text("user", QUESTIONS[1])]
        res = self.ask(msgs, FIRST_CHAT)
        _expect_tokens(res, GEN_TOKENS, "second turn")
        reused, first = res.stats.reused_tokens, self.first_prompt
        if reused <= 0:
            raise SelfTestFailure("no prompt token came from the KV cache: the second turn "
                                  "recomputed the whole chat")
        if reused < first:
            raise SelfTestFailure(f"only {reused} prompt tokens came from the KV cache; the first "
                                  f"turn's {first} (image included) should have")
        self.msgs = msgs + [ChatMessage.text("assistant", res.text)]
        return (f"follow-up: {reused} of {res.stats.prompt_tokens} prompt tokens cached, "
                f"{len(res.token_ids)} generated{_speed(res)}")

    def stop(self) -> str:
        from ..api import ChatMessage

        msgs = self.msgs + [ChatMessage.text("user", QUESTIONS[2])]
        res = self.ask(msgs, FIRST_CHAT, max_tokens=STOP_MAX_TOKENS, stop_after=1)
        if res.finish_reason != "cancelled":
            raise SelfTestFailure(f"the reply was not stopped (finish reason {res.finish_reason}, "
                                  f"{len(res.token_ids)} tokens)")
        if not 0 < len(res.token_ids) < STOP_MAX_TOKENS:
            raise SelfTestFailure(f"stopped after {len(res.token_ids)} of {STOP_MAX_TOKENS} tokens")
        if res.stats.reused_tokens <= 0:
            raise SelfTestFailure("the third turn took nothing from the KV cache")
        self.stopped = msgs  # regenerate replaces the stopped reply
        return f"reply stopped after {len(res.token_ids)} of {STOP_MAX_TOKENS} tokens"

    def new_chat(self) -> str:
        from ..api import ChatMessage

        from ..runtime.prefix_keys import common_prefix

        first = self.state[self.key].encode(self.msgs).ids  # what the engine's slot holds
        res = self.ask([ChatMessage.text("user", "Hello!")], SECOND_CHAT)
        _expect_tokens(res, GEN_TOKENS, "second chat")
        shared = common_prefix(first, res.prompt_token_ids)  # the chat format's opening
        if res.stats.reused_tokens > shared:
            raise SelfTestFailure(f"a new chat reused {res.stats.reused_tokens} cached tokens, more than the "
                                  f"{shared} it shares with the first chat")
        return (f"second chat: {res.stats.prompt_tokens} prompt tokens; the first chat's KV kept as the "
                f"prefix cache's blocks")

    def regenerate(self) -> str:
        res = self.ask(self.stopped, FIRST_CHAT)
        _expect_tokens(res, GEN_TOKENS, "regenerate")
        reused, prompt = res.stats.reused_tokens, res.stats.prompt_tokens
        if reused <= 0:
            raise SelfTestFailure("nothing of the first chat came back from the prefix cache")
        return (f"stopped reply again: {reused} of {prompt} prompt tokens cached, "
                f"{len(res.token_ids)} generated{_speed(res)}")


def _expect_tokens(res, n: int, what: str) -> None:
    if len(res.token_ids) != n or res.finish_reason != "length":
        raise SelfTestFailure(f"{what}: asked for {n} tokens, got {len(res.token_ids)} "
                              f"(finish reason {res.finish_reason})")


def _speed(res) -> str:
    tps = res.stats.decode_tok_s
    return f", {tps:.0f} tok/s" if tps and math.isfinite(tps) else ""


def add_parsers(sub) -> None:
    p = sub.add_parser("self-test", help="check this installation on the bundled tiny model "
                                         "(engine, GPU; `tramontane --self-test` adds the store and "
                                         "the window)")
    p.add_argument("--model", help="GGUF model to test with (default: the bundled tiny one)")
    p.add_argument("--mmproj", help="its vision projector (default: found beside --model)")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU steps")
    p.set_defaults(func=_self_test)


def _self_test(args) -> int:
    return run_self_test(args.model, args.mmproj, gpu=False if args.no_gpu else None)
