"""While the window runs, cyclic garbage is collected on the GUI thread only: a cycle made and
dropped on a worker thread is not collected there, and is collected by the GUI thread's timer
once Python's threshold for its generation is passed."""
import gc
import threading
import weakref

from tramontane.app.gui_gc import GuiThreadCollector


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_cycles_are_collected_by_the_gui_thread_not_the_worker(qtbot):
    gc.enable()  # as in the app before the window starts (the test session turns it off for Qt tests)
    collector = GuiThreadCollector()
    try:
        assert not gc.isenabled()
        refs = []

        def worker():  # allocates far past every threshold: automatic collection would run here
            for _ in range(50_000):
                refs.append(weakref.ref(Node()))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert sum(r() is not None for r in refs) > 45_000  # nothing collected off the GUI thread
        qtbot.waitUntil(lambda: all(r() is None for r in refs), timeout=5000)
    finally:
        collector.stop()
    assert gc.isenabled()


def test_a_collection_is_only_run_when_due():
    collector = GuiThreadCollector()
    try:
        gc.collect()
        assert collector.collect_if_due() == -1  # counts just reset: nothing due
        junk = [Node() for _ in range(gc.get_threshold()[0] + 10)]
        del junk
        assert collector.collect_if_due() >= 0
    finally:
        collector.stop()
