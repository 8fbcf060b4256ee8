"""The process environment, read in one place: every `TRAMONTANE_*` variable the program reads is
a field of `Env`, and `read_env()` is the one function that looks at `os.environ` for them.

`read_env()` reads the environment again on every call (a dozen dictionary look-ups), so what a
test sets with monkeypatch.setenv, or `--data-dir` puts there at start, is what the next reader
sees; nothing is cached here. The table of every variable, with its default, is in
docs/DESIGN.md ("Environment variables"); tests/test_env.py holds the two to each other. The
building and packaging scripts read their own variables (listed in that table too): they run
before this package is installed.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path


def _on_unless_blank_or_zero(raw: str | None) -> bool:
    return (raw or "").strip() not in ("", "0")


def _off_only_if_zero(raw: str | None) -> bool:
    return raw != "0"


def _any_text(raw: str | None) -> bool:
    return bool(raw)


def _text(raw: str | None) -> str:
    return raw or ""


def _name(raw: str | None) -> str | None:
    return (raw or "").strip() or None


def _path(raw: str | None) -> Path | None:
    return Path(raw).expanduser() if raw else None


def _tristate(raw: str | None) -> bool | None:
    choice = (raw or "").strip()
    return None if not choice else choice not in ("0", "no", "false")


def _positive_count(raw: str | None) -> int | None:
    text = (raw or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _path_list(raw: str | None) -> tuple[Path, ...] | None:
    return None if raw is None else tuple(Path(p) for p in raw.split(os.pathsep) if p)


def _setting(variable: str, parse: Callable[[str | None], object]):
    """A field read from `variable` (None when it is not set) through `parse`."""
    return field(metadata={"variable": variable, "parse": parse})


@dataclass(frozen=True)
class Env:
    """What the environment asks of this process. Each field names its variable; the defaults
    are what an unset variable means."""

    # How generation runs
    cpu_exact: bool = _setting("TRAMONTANE_CPU_EXACT", _on_unless_blank_or_zero)
    """float32 torch matmuls on the CPU instead of the native kernels' int8 activations
    (kernels.linear.is_cpu_exact reads it once)."""
    cpu_variant: str | None = _setting("TRAMONTANE_CPU_VARIANT", _name)
    """the native kernels' variant (avx2, avx512, generic, neon, ...) where this CPU runs it;
    else the best one it runs."""
    cuda_graphs: bool = _setting("TRAMONTANE_CUDA_GRAPHS", _off_only_if_zero)
    """decode steps on a GPU replayed from captured CUDA graphs; "0" turns that off."""
    triton_aot: bool | None = _setting("TRAMONTANE_TRITON_AOT", _tristate)
    """GPU kernels launched from the ahead-of-time artifacts (True), through Triton's JIT
    (False: "0", "no", "false"), or None: decided by kernels.triton_compat.aot_mode."""
    triton_aot_dir: Path | None = _setting("TRAMONTANE_TRITON_AOT_DIR", _path)
    """the folder of the ahead-of-time artifacts instead of the installed one."""
    threads_text: str = _setting("TRAMONTANE_THREADS", _text)
    """the native kernels' default thread count, as written (`threads` checks it)."""
    torch_threads: int | None = _setting("TRAMONTANE_TORCH_THREADS", _positive_count)
    """torch's intra-op threads beside the native pool (None: 1); anything but a positive
    integer counts as unset."""

    # Where things are
    data_dir: Path | None = _setting("TRAMONTANE_DATA_DIR", _path)
    """the app's data folder (chats, images, the lock) instead of the per-user one."""
    models_dir: Path | None = _setting("TRAMONTANE_MODELS_DIR", _path)
    """the models folder instead of `<user data dir>/Tramontane/models`."""
    model_places: tuple[Path, ...] | None = _setting("TRAMONTANE_MODEL_PLACES", _path_list)
    """os.pathsep-separated folders the app looks in for other apps' GGUF files instead of
    the usual places (set but empty: none); None when unset."""

    # The self-test and the start-time probe
    selftest_model: Path | None = _setting("TRAMONTANE_SELFTEST_MODEL", _path)
    """the self-test's model instead of the bundled tiny one."""
    selftest_mmproj: Path | None = _setting("TRAMONTANE_SELFTEST_MMPROJ", _path)
    """the projector beside selftest_model (read only when that is set)."""
    selftest_traceback: bool = _setting("TRAMONTANE_SELFTEST_TRACEBACK", _any_text)
    """a failed self-test step prints its traceback too."""
    startup_probe: str = _setting("TRAMONTANE_STARTUP_PROBE", _text)
    """measure the start (app/main.py): "1" prints when the window was on screen and what was
    imported by then, "exit" also quits there."""
    launch_time_text: str = _setting("TRAMONTANE_LAUNCH_TIME", _text)
    """the frozen app's start-time measure (packaging/entry_gui.py), as written: when it was
    launched, seconds since the epoch (`launch_time` checks it); once its window is visible it
    prints how long that took, and quits."""

    @property
    def threads(self) -> int | None:
        """TRAMONTANE_THREADS as a count (None: unset); ValueError for anything but a positive integer."""
        text = self.threads_text.strip()
        if not text:
            return None
        try:
            count = int(text)
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"TRAMONTANE_THREADS must be a positive integer, got {self.threads_text!r}")
        return count


    @property
    def launch_time(self) -> float | None:
        """TRAMONTANE_LAUNCH_TIME as seconds since the epoch (None: unset); ValueError for
        anything but a number."""
        text = self.launch_time_text.strip()
        if not text:
            return None
        try:
            return float(text)
        except ValueError:
            raise ValueError("TRAMONTANE_LAUNCH_TIME must be the launch time in seconds since the epoch "
                             f"(date +%s.%N), got {self.launch_time_text!r}") from None


def read_env(environ: Mapping[str, str] | None = None) -> Env:
    """The settings in `environ` (os.environ when None), read now."""
    source = os.environ if environ is None else environ
    return Env(**{f.name: f.metadata["parse"](source.get(f.metadata["variable"])) for f in fields(Env)})


def variable(field_name: str) -> str:
    """The environment variable behind one of Env's fields ('data_dir' -> 'TRAMONTANE_DATA_DIR')."""
    return VARIABLES[field_name]


VARIABLES: dict[str, str] = {f.name: f.metadata["variable"] for f in fields(Env)}
