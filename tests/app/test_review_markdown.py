"""Found by using the window: a code line longer than the message was cut off at the right edge
(Qt keeps code lines unbroken and the message has no horizontal scroll bar), so the rest of the
line could not be read at all. Code now wraps inside the message."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.chat_view import MarkdownView  # noqa: E402


@pytest.mark.parametrize("lang", ["python", ""])
@pytest.mark.parametrize("dark", [False, True])
def test_long_code_lines_wrap_inside_the_message(qtbot, lang, dark):
    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(320, 100)
    view.show()
    line = "value = 'a long string literal " + "that keeps going " * 12 + "' + str(42)"
    view.set_markdown(f"Before\n\n```{lang}\n{line}\nshort = 1\n```\n\nAfter", dark)
    QApplication.processEvents()
    doc = view.document()
    assert doc.size().width() <= view.viewport().width() + 1  # nothing past the right edge
    assert doc.toPlainText().count("that keeps going") == 12  # all of it is still there
    # The wrapped code takes several lines, so the widget grew to show them all.
    block = next(b for b in _blocks(doc) if b.text().startswith("value ="))
    assert block.layout().lineCount() > 1
    assert view.height() >= int(doc.size().height())


def _blocks(doc):
    b = doc.begin()
    while b.isValid():
        yield b
        b = b.next()
