"""Message rendering: fenced code blocks, copy-code links, syntax highlighting (pygments and
the fallback), the status line."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QUrl  # noqa: E402
from PySide6.QtGui import QColor, QGuiApplication, QTextDocument  # noqa: E402

from tramontane.app.widgets import markdown as md  # noqa: E402
from tramontane.app.widgets.chat_view import MarkdownView, status_text  # noqa: E402
from tramontane.engine.api import GenerationStats  # noqa: E402

SAMPLE = """Intro with `inline` code.

```python
def f(x):
    s = \"\"\"two
lines\"\"\"
    return x  # done
```

Text between.

~~~~
````
not a fence end
````
~~~~

```js
let open = 1
"""


def test_code_blocks_and_links():
    blocks = md.code_blocks(SAMPLE)
    assert [(b.language, b.closed) for b in blocks] == [("python", True), ("", True), ("js", False)]
    assert blocks[0].code.splitlines()[0] == "def f(x):" and blocks[0].code.endswith("# done")
    assert blocks[1].code == "````\nnot a fence end\n````"  # a shorter/different fence is content
    assert blocks[2].code == "let open = 1\n"
    linked = md.with_copy_links(SAMPLE)
    for i in range(3):
        assert f"({md.COPY_SCHEME}:{i})" in linked
    assert md.code_blocks(linked) == blocks  # the links change no code


def _formats(doc: QTextDocument, text: str):
    """(start, length, colour name) of the highlighter's ranges on the first block == text."""
    block = doc.begin()
    while block.isValid() and block.text() != text:
        block = block.next()
    assert block.isValid(), text
    return [(r.start, r.length, r.format.foreground().color().name()) for r in block.layout().formats()]


@pytest.mark.parametrize("dark", [False, True])
def test_highlighting_with_pygments(qtbot, dark):
    pytest.importorskip("pygments")
    doc = QTextDocument()
    md.render_markdown(doc, SAMPLE, dark)
    colours = {k: QColor(v[1 if dark else 0]).name() for k, v in md._COLOURS.items()}
    first = _formats(doc, "def f(x):")
    assert (0, 3, colours["keyword"]) in first
    assert (4, 1, colours["function"]) in first
    # The triple-quoted string spans two lines: the whole block is lexed at once.
    assert any(c == colours["string"] for _, _, c in _formats(doc, "lines\"\"\""))
    assert any(c == colours["comment"] for _, _, c in _formats(doc, "    return x  # done"))
    assert _formats(doc, "Text between.") == []  # prose is not coloured
    # Code blocks get the tinted background.
    block = doc.begin()
    while block.text() != "def f(x):":
        block = block.next()
    assert block.blockFormat().background().color().name() == QColor(md.CODE_BACKGROUND[int(dark)]).name()
    # Links exist in the document for each block.
    html = doc.toHtml()
    assert f'href="{md.COPY_SCHEME}:0"' in html and f'href="{md.COPY_SCHEME}:2"' in html


def test_highlighting_fallback_without_pygments(qtbot, monkeypatch):
    monkeypatch.setattr(md, "pygments", None)
    doc = QTextDocument()
    md.render_markdown(doc, "```python\ndef f(): return 'x'  # c\n```\n")
    colours = {k: QColor(v[0]).name() for k, v in md._COLOURS.items()}
    got = _formats(doc, "def f(): return 'x'  # c")
    assert (0, 3, colours["keyword"]) in got
    assert (16, 3, colours["string"]) in got
    assert (21, 3, colours["comment"]) in got


def test_copy_link_copies_the_code(qtbot):
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown(SAMPLE, False)
    QGuiApplication.clipboard().clear()
    view._open_link(QUrl(f"{md.COPY_SCHEME}:1"))
    assert QGuiApplication.clipboard().text() == md.code_blocks(SAMPLE)[1].code
    view._open_link(QUrl(f"{md.COPY_SCHEME}:9"))  # out of range: nothing happens
    assert QGuiApplication.clipboard().text() == md.code_blocks(SAMPLE)[1].code
    assert view.height() > 100  # as tall as its content


def test_status_line():
    class Msg:
        state, finish_reason = "complete", "stop"
        decode_tok_s, ttft_s, prompt_tokens, generated_tokens, reused_tokens = 12.34, 0.5, 100, 20, 0

    live = GenerationStats(prompt_tokens=100, reused_tokens=80, generated_tokens=20, ttft_s=0.214,
                           decode_tok_s=41.27, context_used=120, context_size=4096)
    assert status_text(Msg(), live) == "41.3 tok/s · TTFT 0.21 s · context 120 / 4096 · 80 reused from cache"
    assert status_text(Msg()) == "12.3 tok/s · TTFT 0.50 s · context 120 · 0 reused from cache"
    Msg.finish_reason = "cancelled"
    assert status_text(Msg()).startswith("stopped · ")
    Msg.state = "interrupted"
    assert status_text(Msg()).startswith("interrupted")


def test_markdown_images_and_html_are_not_loaded(qtbot, tmp_path):
    from PySide6.QtGui import QImage

    secret = tmp_path / "secret.png"
    image = QImage(32, 32, QImage.Format.Format_RGB32)
    image.fill(0xFF0000)
    image.save(str(secret))
    url = QUrl.fromLocalFile(str(secret))
    view = MarkdownView()
    qtbot.addWidget(view)
    view.show()
    view.set_markdown(f"look: ![x]({url.toString()})\n\n<img src=\"{url.toString()}\">", False)
    qtbot.wait(20)  # layout and paint ask for the image
    resource = view.document().resource(QTextDocument.ResourceType.ImageResource, url)
    assert resource is None
    assert "<img" not in view.document().toHtml()
    assert "<img src=" in view.document().toPlainText()  # raw HTML is shown as text
    assert "x" in view.document().toPlainText()  # the alt text stays, as a link
    # Image syntax inside code is code, left alone.
    assert md.with_copy_links("`![a](b)`\n```\n![c](d)\n```").count("![") == 2
