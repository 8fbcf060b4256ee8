"""The thought's block above a reply (app/widgets/reasoning_block.py): open while the model
thinks, folded when the answer begins unless the user chose, its own Copy, plain text."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from tramontane.app.widgets.reasoning_block import ReasoningBlock


def block(qtbot) -> ReasoningBlock:
    b = ReasoningBlock()
    qtbot.addWidget(b)
    return b


def test_hidden_until_there_is_a_thought(qtbot):
    b = block(qtbot)
    assert b.isHidden()
    b.set_thought("", seconds=None)
    assert b.isHidden()
    b.set_thought("x", seconds=3.0)
    assert not b.isHidden() and not b.expanded and b.body.isHidden()  # stored: folded
    assert b.title == "Thought for 3 s"


def test_open_while_thinking_then_folded_when_the_answer_begins(qtbot):
    b = block(qtbot)
    b.set_thought("Two", thinking=True)
    assert b.expanded and not b.body.isHidden() and b.title.startswith("Thinking…")
    b.set_thought("Two and two", thinking=True)
    b.answer_started()
    assert not b.expanded and b.body.isHidden() and b.title.startswith("Thought for")
    assert b.seconds is not None
    b.set_thought("Two and two")  # the same thought again, as stored, before its time is saved
    assert b.title.startswith("Thought for ")  # the time measured here stays


def test_the_users_choice_stands_when_the_answer_begins(qtbot):
    b = block(qtbot)
    b.show()
    b.set_thought("a", thinking=True)
    chosen = []
    b.chosen.connect(chosen.append)
    qtbot.mouseClick(b.toggle, Qt.MouseButton.LeftButton)  # closed while it thinks
    assert chosen == [False] and not b.expanded
    b.set_thought("ab", thinking=True)
    assert not b.expanded  # more thought does not reopen it
    qtbot.mouseClick(b.toggle, Qt.MouseButton.LeftButton)
    b.answer_started()
    assert chosen == [False, True] and b.expanded  # opened by the user: stays open


def test_copy_and_plain_text(qtbot):
    b = block(qtbot)
    thought = "<b>not bold</b> & <img src=x>"
    b.set_thought(thought, seconds=1.0, cut=True)
    assert b.body.textFormat() == Qt.TextFormat.PlainText and b.body.text() == thought
    assert b.title == "Thought for 1 s (stopped)"
    b.copy.click()
    assert QGuiApplication.clipboard().text() == thought and b.copy.text() == "Copied"
