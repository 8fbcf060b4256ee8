"""Background jobs: results come back on the UI thread, failures in words, nothing after the owner goes."""
import threading
import time

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject  # noqa: E402

from tramontane.app.jobs import Jobs, describe_error  # noqa: E402
from tramontane.engine.library.hub import HubError  # noqa: E402


def test_result_arrives_on_the_ui_thread_without_blocking_it(qtbot):
    jobs = Jobs()
    release = threading.Event()
    got = []

    def work():
        release.wait(5)
        return threading.get_ident()

    t0 = time.perf_counter()
    jobs.run(work, lambda worker_thread: got.append((worker_thread, threading.get_ident())))
    assert time.perf_counter() - t0 < 0.2 and got == [] and jobs.busy
    release.set()
    qtbot.waitUntil(lambda: bool(got), timeout=5000)
    worker_thread, called_on = got[0]
    assert called_on == threading.get_ident() != worker_thread
    assert not jobs.busy


def test_failures_come_back_in_words(qtbot):
    jobs = Jobs()
    failed, done = [], []

    def hub_down():
        raise HubError("example/repo: the hub is unreachable (connection refused)")

    def broken():
        raise KeyError("size")

    jobs.run(hub_down, done.append, failed.append)
    jobs.run(broken, done.append, failed.append)
    qtbot.waitUntil(lambda: len(failed) == 2, timeout=5000)
    assert done == []
    assert sorted(failed) == ["KeyError: 'size'",
                              "example/repo: the hub is unreachable (connection refused)"]
    assert describe_error(OSError(28, "No space left on device")) == \
        "OSError: [Errno 28] No space left on device"


def test_nothing_is_called_once_the_owner_is_gone(qtbot):
    owner = QObject()
    jobs = Jobs(owner)
    release = threading.Event()
    called = []
    jobs.run(lambda: release.wait(5), called.append, called.append)
    t0 = time.perf_counter()
    owner.deleteLater()
    qtbot.waitUntil(lambda: _deleted(owner), timeout=2000)
    assert time.perf_counter() - t0 < 1.0  # closing a dialog does not wait for its jobs
    release.set()
    time.sleep(0.2)
    qtbot.wait(200)  # the queued outcome, if any, would be delivered here
    assert called == []


def _deleted(obj) -> bool:
    try:
        obj.objectName()
        return False
    except RuntimeError:
        return True
