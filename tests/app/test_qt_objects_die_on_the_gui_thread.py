"""tests/conftest.py frees what a Qt test leaves behind on the GUI thread. Without it, a failed
test's running QTimer, kept by its traceback's reference cycle, is freed by whichever thread next
runs the cyclic collector, and the next processEvents delivers a timer event to freed memory: the
segmentation fault a CI run died of (after tests/app, inside pytest-qt's processEvents)."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

TESTS = Path(__file__).resolve().parents[1]
OFF_THREAD = "Timers cannot be stopped from another thread"

TWO_TESTS = textwrap.dedent("""
    import gc
    import threading

    from PySide6.QtCore import QTimer


    class Ticker:  # like support.app_window.UiGaps: a parentless QTimer calling a plain object
        def __init__(self):
            self.timer = QTimer()
            self.timer.setInterval(1)
            self.timer.timeout.connect(self.tick)
            self.me = self  # a reference cycle (pytest's own frames make such cycles)

        def tick(self):
            pass


    def test_fails_with_its_timer_running(qtbot):
        ticker = Ticker()
        ticker.timer.start()
        qtbot.wait(20)
        assert False, "failed before stopping its timer"  # the traceback keeps `ticker`


    def test_the_next_failure_replaces_the_kept_traceback(qtbot):
        import sys

        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            setattr(sys, name, None)  # what pytest does at the next failure: `ticker` is garbage now


    def test_a_later_thread_runs_the_collector(qtbot):
        worker = threading.Thread(target=gc.collect)  # an engine or server thread allocating
        worker.start()
        worker.join()
        qtbot.wait(50)  # timer events for whatever is still registered
""")


def run_two_tests(tmp_path, *plugins):
    path = tmp_path / "test_two.py"
    path.write_text(TWO_TESTS)
    args = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-s", "--no-qt-log", *plugins, str(path)]  # Qt warnings: stderr
    env = {**os.environ, "PYTHONPATH": str(TESTS), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_without_the_net_a_freed_running_timer_crashes_the_run(tmp_path):
    # the hazard itself, so the test below proves something: the same two tests, bare
    proc = run_two_tests(tmp_path)
    # Qt says what went wrong; what follows is a use after free: mostly a crash, not always
    assert OFF_THREAD in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode in (-signal.SIGSEGV, 0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]


def test_with_the_net_the_failed_test_fails_and_the_run_goes_on(tmp_path):
    proc = run_two_tests(tmp_path, "-p", "conftest")  # tests/conftest.py, as every test here gets it
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 failed, 2 passed" in proc.stdout and OFF_THREAD not in proc.stderr
