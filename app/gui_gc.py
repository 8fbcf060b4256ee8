"""Python's cyclic garbage collection on the GUI thread only.

Automatic collection runs in whichever thread happens to allocate: the engine worker, the jobs
pool, the MCP and server threads. A Qt object freed there (a closed dialog or window left in a
reference cycle, with a running QTimer) cannot stop its timers from another thread, and the next
event for it reaches freed memory: a segfault with no Python frame of ours on the stack (found
in the test suite, tests/app/test_qt_objects_die_on_the_gui_thread.py). So automatic collection
is off while the window runs, and a timer on the GUI thread collects when Python's own
thresholds say a collection is due, generation by generation, as the automatic one would.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

CHECK_EVERY_MS = 250


class GuiThreadCollector(QObject):
    """Create on the GUI thread; collection stays off elsewhere until `stop()`."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        gc.disable()
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_EVERY_MS)
        self._timer.timeout.connect(self.collect_if_due)
        self._timer.start()

    def collect_if_due(self) -> int:
        """Collect the oldest generation whose count has passed its threshold; -1 when none."""
        counts = gc.get_count()
        for generation in (2, 1, 0):
            if counts[generation] > self._thresholds[generation]:
                gc.collect(generation)
                return generation
        return -1

    def stop(self) -> None:
        self._timer.stop()
        gc.enable()
