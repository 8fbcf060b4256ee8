"""Edit and resend keeps what was there: the edited message gets versions (‹ 1/2 ›), and
switching back brings the old conversation after it back, its replies and their regenerated
versions included, also after a restart (issue 26, item 12)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from support.app_window import close_window, make_window, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def shown(store, chat_id):
    return [(m.id, m.role, m.text, m.versions, m.version)
            for m in store.get_chat(chat_id).messages]


def test_edit_and_resend_keeps_the_old_conversation_as_a_version(qtbot, tmp_path):
    data = tmp_path / "data"
    w1 = make_window(qtbot, data)
    send(qtbot, w1, "First question")
    send(qtbot, w1, "Second question")
    with qtbot.waitSignal(w1.replyFinished, timeout=30000):
        w1.view.widgets[-1].buttons["regenerate"].click()  # the last reply gets versions 1/2, 2/2
    chat_id = w1.session.current_chat_id
    before = shown(w1.store, chat_id)
    assert len(before) == 4 and before[3][3:] == (2, 1)

    first_user = w1.view.widgets[0]
    first_user.buttons["edit"].click()
    first_user.editor.setPlainText("A better first question")
    with qtbot.waitSignal(w1.replyFinished, timeout=30000):
        first_user.edit_send.click()
    after = shown(w1.store, chat_id)
    assert [(role, text if role == "user" else None, n, k) for _, role, text, n, k in after] == [
        ("user", "A better first question", 2, 1), ("assistant", None, 1, 0)]
    assert after[0][0] == before[0][0]  # the same message, in a new version
    switch = w1.view.widgets[0]
    assert switch.versions_label is not None and switch.versions_label.text() == "2/2"
    assert w1.store.get_chat_info(chat_id).message_count == 2

    # ‹ : the old question with everything that followed it, regenerated versions included.
    switch.version_buttons["previous"].click()
    old = [before[0][:3] + (2, 0)] + before[1:]  # the question, now version 1 of 2
    assert shown(w1.store, chat_id) == old
    assert [w.text for w in w1.view.widgets] == [m[2] for m in before]
    assert w1.view.widgets[0].versions_label.text() == "1/2"
    # What the model reads next is the conversation shown.
    assert [m.text_content for m in w1.store.engine_messages(chat_id)] == [m[2] for m in before]

    # › : the edited one again, and both survive a restart.
    w1.view.widgets[0].version_buttons["next"].click()
    assert shown(w1.store, chat_id) == after
    close_window(w1)

    w2 = make_window(qtbot, data, load=False)
    try:
        assert w2.session.current_chat_id == chat_id
        assert shown(w2.store, chat_id) == after
        w2.view.widgets[0].version_buttons["previous"].click()
        assert shown(w2.store, chat_id) == old
        assert w2.store.integrity_check() == "ok"
    finally:
        close_window(w2)
