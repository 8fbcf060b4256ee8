"""Is the UI thread free? Measured so that a loaded machine does not make a test fail.

A wall-clock gap between two ticks of a UI timer mixes two things: time the UI thread spent on
its own work (a handler, a render, a sleep, a lock or GIL wait: the bugs) and time it was ready
to run but another process had the CPU (a busy CI machine: not a bug). Linux keeps both apart
per thread: CLOCK_THREAD_CPUTIME_ID (`time.thread_time`) is the CPU time the thread ran, and
the second field of /proc/thread-self/schedstat is the time it sat runnable in a run queue.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from PySide6.QtCore import QTimer


def _run_queue_wait() -> float:
    """Seconds this thread has been runnable but not on a CPU (Linux schedstat run_delay);
    0 where the kernel does not say (then `held` is the plain wall gap)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


class UiTurns:
    """A 5 ms QTimer on the UI thread. For each interval between two ticks (at most one timer
    period plus whatever the event loop did in between) it records:
      cpu:  the UI thread's own CPU time (our handlers; time other processes took is not in it),
      held: wall time minus the time it waited for a CPU: what it would have been on an idle
            machine (CPU work plus sleeps and lock/GIL waits of its own),
      wall: the plain gap, kept for the message."""

    def __init__(self, interval_ms: int = 5):
        self.cpu: list[float] = []
        self.held: list[float] = []
        self.wall: list[float] = []
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self.tick)
        self._mark()

    def _mark(self) -> None:
        self._wall, self._cpu, self._queued = time.perf_counter(), time.thread_time(), _run_queue_wait()

    def tick(self) -> None:
        wall, cpu, queued = time.perf_counter(), time.thread_time(), _run_queue_wait()
        self.wall.append(wall - self._wall)
        self.cpu.append(cpu - self._cpu)
        self.held.append(max(0.0, (wall - self._wall) - (queued - self._queued)))
        self._wall, self._cpu, self._queued = wall, cpu, queued

    def restart(self) -> None:
        """Forget the intervals so far and count from now."""
        self.cpu.clear()
        self.held.clear()
        self.wall.clear()
        self._mark()

    def copy(self) -> "UiTurns":
        """The turns so far, kept apart from the ones still to come."""
        kept = UiTurns.__new__(UiTurns)
        kept.cpu, kept.held, kept.wall = list(self.cpu), list(self.held), list(self.wall)
        return kept

    def worst(self) -> str:
        """The longest interval by CPU time, in words, for an assertion message."""
        i = max(range(len(self.cpu)), key=self.cpu.__getitem__)
        return (f"{self.cpu[i] * 1000:.0f} ms of UI-thread CPU in one turn (held "
                f"{self.held[i] * 1000:.0f} ms, wall {self.wall[i] * 1000:.0f} ms; "
                f"{len(self.cpu)} turns; longest held {max(self.held) * 1000:.0f} ms)")


class EngineCodeOnThisThread:
    """Records which engine or kernel functions run on the calling (UI) thread while active.

    The engine belongs on the worker thread whatever its speed: a tiny test model loads in
    10 ms, so a timing bound alone would not see a load moved onto the UI thread. A profile
    hook set with sys.setprofile sees only this thread's calls. `allowed` are modules the UI
    may use (the request and result types it builds)."""

    def __init__(self, *packages, allowed=()):
        self.dirs = tuple(os.path.dirname(p.__file__) + os.sep for p in packages)
        self._root = os.path.commonpath(self.dirs)
        self.allowed = frozenset(m.__file__ for m in allowed)
        self.seen: dict[str, int] = {}
        self._thread = threading.get_ident()

    def _hook(self, frame, event, _arg) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(self.dirs) and name not in self.allowed:
                key = f"{os.path.relpath(name, self._root)}:{frame.f_code.co_name}"
                self.seen[key] = self.seen.get(key, 0) + 1

    def __enter__(self):
        assert threading.get_ident() == self._thread
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)
