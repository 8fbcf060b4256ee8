"""The conversation view on the real window: a centred column of readable width, message
actions shown on hover and by keyboard, "Copied" after a copy."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QEvent, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QEnterEvent, QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from support.app_window import send  # noqa: E402
from tramontane.app.widgets.chat_view import COLUMN_WIDTH, COPIED_MS  # noqa: E402


def hover(widget, inside: bool) -> None:
    if inside:
        QApplication.sendEvent(widget, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    else:
        QApplication.sendEvent(widget, QEvent(QEvent.Type.Leave))


def test_messages_sit_in_a_readable_centred_column(qtbot, window):
    send(qtbot, window, "Hello")
    window.resize(1600, 900)
    qtbot.wait(50)
    reply = window.view.widgets[-1]
    left = reply.mapTo(window.view.viewport(), reply.rect().topLeft()).x()
    right_margin = window.view.viewport().width() - (left + reply.width())
    assert reply.width() <= COLUMN_WIDTH + 2  # not the whole 1600 px
    assert abs(left - right_margin) <= 24  # centred (the scroll bar may take a few px)


def test_actions_show_on_hover_and_by_keyboard(qtbot, window):
    send(qtbot, window, "Hello")
    user, reply = window.view.widgets
    for w in (user, reply):
        assert all(b.isHidden() for b in w.buttons.values())  # quiet until wanted
    hover(reply, True)
    assert not reply.buttons["copy"].isHidden() and not reply.buttons["regenerate"].isHidden()
    assert user.buttons["edit"].isHidden()
    hover(reply, False)
    assert reply.buttons["copy"].isHidden()
    # The keyboard: focus in the message shows its actions, and Tab reaches them.
    user.body.setFocus()
    qtbot.waitUntil(lambda: not user.buttons["edit"].isHidden(), timeout=2000)
    assert user.buttons["edit"].focusPolicy() & Qt.FocusPolicy.TabFocus
    assert all(not b.icon().isNull() for b in user.buttons.values())
    window.composer.edit.setFocus()
    qtbot.waitUntil(lambda: user.buttons["edit"].isHidden(), timeout=2000)


def test_copy_says_copied_for_a_moment(qtbot, window):
    send(qtbot, window, "Hello")
    reply = window.view.widgets[-1]
    hover(reply, True)
    reply.buttons["copy"].click()
    assert QGuiApplication.clipboard().text() == reply.text
    assert reply.buttons["copy"].text() == "Copied"
    assert reply.buttons["copy"].toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonTextBesideIcon
    qtbot.waitUntil(lambda: reply.buttons["copy"].text() == "Copy", timeout=COPIED_MS + 2000)


def test_regenerate_keeps_the_replies_as_versions(qtbot, window):
    send(qtbot, window, "Hello")
    reply_id = window.view.widgets[-1].message.id
    for _ in range(2):
        with qtbot.waitSignal(window.replyFinished, timeout=30000):
            window.replies.regenerate()
    reply = window.view.widgets[-1]
    assert reply.message.id == reply_id and reply.versions_label.text() == "3/3"
    assert not reply.version_buttons["next"].isEnabled()
    reply.version_buttons["previous"].click()
    reply = window.view.widgets[-1]
    assert reply.versions_label.text() == "2/3" and reply.version_buttons["next"].isEnabled()
    stored = window.store.reply_versions(reply_id)
    assert [v["shown"] for v in stored] == [0, 1, 0] and reply.text == stored[1]["text"]


def test_a_file_name_with_an_ampersand_is_shown_as_named(qtbot, window, tmp_path):
    """'notes & plans.txt' on its button: Qt would take '&' as a shortcut marker, underline the
    space after it and hide the '&' (seen on a screenshot as 'notes _plans.txt')."""
    from PySide6.QtGui import QKeySequence

    from support.app_window import drop_files, wait_read

    path = tmp_path / "notes & plans.txt"
    path.write_text("The meeting moved to Thursday.\n")
    drop_files(window.composer, [path])
    wait_read(qtbot, window)
    send(qtbot, window, "When is the meeting?")
    user = window.view.widgets[0]
    (button,) = user.document_buttons
    assert QKeySequence.mnemonic(button.text()).isEmpty(), button.text()  # no shortcut marker left
    assert button.text().replace("&&", "&").endswith("notes & plans.txt")
