"""The window is on screen before the engine is imported (issue 26, first run): the start-up
probe (TRAMONTANE_STARTUP_PROBE) says when the window showed and what was imported by then;
a bare PySide6 window from the same environment is the reference."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("pytestqt")

BARE = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
from tramontane.app.main import process_age_s
app = QApplication(sys.argv)
w = QMainWindow()
w.resize(1100, 760)
w.show()
QTimer.singleShot(0, lambda: (print(f"bare: window shown {process_age_s():.2f} s", file=sys.stderr), w.close()))
app.exec()
"""


def run(args, tmp_path) -> str:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TRAMONTANE_STARTUP_PROBE="exit",
               TRAMONTANE_DATA_DIR=str(tmp_path / "data"), TRAMONTANE_MODELS_DIR=str(tmp_path / "models"),
               HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_window_shows_before_the_engine_is_imported(tmp_path):
    from support.app_window import MMPROJ, MODEL
    from tramontane.app.config import AppSettings
    from tramontane.app.store import Store

    with Store(tmp_path / "data") as store:  # a last model to autoload, as after a first session
        AppSettings(store).last_model = (str(MODEL), str(MMPROJ))
    app = [run(["-m", "tramontane.app.main"], tmp_path) for _ in range(2)]
    bare = [run(["-c", BARE], tmp_path) for _ in range(2)]
    shown = [float(re.search(r"window shown ([\d.]+) s after", out).group(1)) for out in app]
    reference = [float(re.search(r"bare: window shown ([\d.]+) s", out).group(1)) for out in bare]
    print(f"window on screen: app {min(shown):.2f} s, bare PySide6 window {min(reference):.2f} s")
    for out in app:
        assert "imported by then: none of torch, numpy" in out, out
    # The app's own modules and the chats come before the window; the engine does not.
    assert min(shown) < 5 * min(reference) + 0.3, (shown, reference)
