"""PySide6 6.12.0 on CPython < 3.12 loses a reference to None on every void Qt call
(setText, setMarkdown...) and aborts the interpreter after a few thousand ("deallocating None").
pyproject excludes that release on those Pythons; this keeps whatever is installed honest."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("PySide6")

SCRIPT = """
from PySide6.QtGui import QGuiApplication, QTextDocument
app = QGuiApplication([])
doc = QTextDocument()
for i in range(200000):
    doc.setPlainText("x")  # returns void
print("survived")
"""


def test_many_void_qt_calls_do_not_abort_the_interpreter():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr[-2000:]
