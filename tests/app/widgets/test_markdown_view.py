"""Found by using the window: a code line longer than the message was cut off at the right edge
(Qt keeps code lines unbroken and the message has no horizontal scroll bar), so the rest of the
line could not be read at all. Code now wraps inside the message."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.widgets.chat_view import MarkdownView  # noqa: E402


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


def test_links_are_readable_on_both_schemes(qtbot):
    """The "Copy code" link and model links kept Qt's default dark blue on the dark message
    background (Qt bakes the application palette's link colour in when it reads Markdown)."""
    from PySide6.QtGui import QColor

    view = MarkdownView()
    qtbot.addWidget(view)
    for dark, background in ((True, QColor("#23272e")), (False, QColor("#ffffff"))):
        view.set_markdown("```python\nx = 1\n```\n\nSee [a link](https://example.com) here", dark)
        anchors = [f for f in _fragments(view.document()) if f.charFormat().isAnchor()]
        assert [f.text() for f in anchors] == ["Copy", "a link"]  # "python" is the label before it
        for fragment in anchors:
            colour = fragment.charFormat().foreground().color()
            assert contrast(colour, background) >= 4.5, (dark, fragment.text(), colour.name())
        plain = next(f for f in _fragments(view.document()) if f.text().startswith("See"))
        assert not plain.charFormat().isAnchor()


def _fragments(doc):
    for block in _blocks(doc):
        it = block.begin()
        while not it.atEnd():
            yield it.fragment()
            it += 1


def contrast(a, b) -> float:
    """WCAG 2 contrast ratio of two QColors."""
    def luminance(c):
        def lin(v):
            v /= 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
        return 0.2126 * lin(c.red()) + 0.7152 * lin(c.green()) + 0.0722 * lin(c.blue())
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
