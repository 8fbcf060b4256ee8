"""The window around a model that loads, fails, is refused or is a server's: what the bar, the
composer, the actions and the chat say at each step (first found by a user trying the window
again, issue 26). Each test drives the real window on the tiny model the way the report did."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from support.app_window import MMPROJ, MODEL, open_stored_chat, pick_server, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def test_regenerate_is_off_without_a_model(qtbot, idle_window):
    """Item 6: with no model, Regenerate (menu, Ctrl+R, ↻, the reply's button) and Edit are
    off, and a Ctrl+R that gets through says what to do instead of failing."""
    window = idle_window
    chat = open_stored_chat(window, "Old chat", "Hello", "Hi")
    reply, question = window.view.widgets[-1], window.view.widgets[0]
    assert not window.regenerate_action.isEnabled()
    assert not window.composer.regenerate_button.isEnabled()
    assert not reply.buttons["regenerate"].isEnabled() and not question.buttons["edit"].isEnabled()
    assert "load a model first" in reply.buttons["regenerate"].toolTip()
    window.replies.regenerate(None)
    assert window.session.pending is None
    assert "Load a model first" in window.view.notice.text()
    assert [m.text for m in window.store.get_chat(chat).messages] == ["Hello", "Hi"]

    window.model_loading.load_model(str(MODEL), str(MMPROJ))
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    assert window.regenerate_action.isEnabled() and window.composer.regenerate_button.isEnabled()
    assert window.view.widgets[-1].buttons["regenerate"].isEnabled()
    assert window.view.widgets[0].buttons["edit"].isEnabled()
    assert not window.view.notice.isVisible()  # item 5: "Load a model first" is no longer true


def test_server_and_local_states_do_not_mix(qtbot, window):
    """Item 7: on a server the local file's quant chip goes, and Unload (which would say "No
    model loaded" while the box shows the server) is off."""
    from support.fakevllm import FakeVLLM

    bar = window.model_bar
    assert bar.quant_label.isVisible() and bar.quant_label.text() == "F32"
    with FakeVLLM(models=["served-model"], reply="Hi.") as fake:
        pick_server(qtbot, window, fake)
        assert not bar.quant_label.isVisible()
        assert not bar.unload_button.isEnabled() and not window.unload_action.isEnabled()
        window.model_loading.unload_model()
        qtbot.wait(200)
        assert window.session.engine_info is not None and window.session.engine_info.remote
        assert "served-model" in bar.model_label.text()
        with qtbot.waitSignal(window.modelLoaded, timeout=30000):
            bar.model_combo.setCurrentIndex(bar.model_combo.findText("Local model"))
        assert bar.quant_label.isVisible() and bar.unload_button.isEnabled()


def test_stop_belongs_to_the_chat_that_is_writing(qtbot, window):
    """Item 14: a new chat opened while another writes shows Send, not a Stop that would stop
    the other chat; Enter there says why it waits; the sidebar shows which chat is writing."""
    from PySide6.QtCore import Qt

    from tramontane.app.widgets.chat_list import ChatIdRole

    window.session.param_overrides["max_tokens"] = 400
    window.composer.edit.setPlainText("A long answer, please")
    window.composer.send_button.click()
    qtbot.waitUntil(lambda: window.session.pending.message_id is not None, timeout=30000)  # the chat exists
    writing = window.session.current_chat_id
    assert window.composer.stop_button.isVisible() and window.stop_action.isEnabled()

    window.navigation.new_chat()
    assert not window.composer.stop_button.isVisible() and window.composer.send_button.isVisible()
    assert not window.stop_action.isEnabled()
    model = window.chat_model
    row = model.index(model.row_of(writing))
    assert row.data(ChatIdRole) == writing and "writing" in row.data(Qt.ItemDataRole.DisplayRole)
    window.replies.stop()  # Esc / Stop here: not this chat's reply
    qtbot.keyClicks(window.composer.edit, "hello")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    assert "still writing its reply" in window.composer.message.text()
    assert window.composer.edit.toPlainText() == "hello"  # kept, not lost
    with qtbot.waitSignal(window.replyFinished, timeout=60000) as blocker:
        pass
    reply = window.store.get_message(blocker.args[0])
    assert reply.chat_id == writing and reply.finish_reason != "cancelled"
    assert window.composer.message.text() == ""  # no longer true: gone
    assert "writing" not in model.index(model.row_of(writing)).data(Qt.ItemDataRole.DisplayRole)


def test_context_advice_that_can_work(qtbot, idle_window):
    """Item 3: on a file whose context limit (512) is reached, a full context does not say
    "raise the context length" nor count "513 of 512"; one message longer than the context is
    told to be shortened, not to start a new chat."""

    window = idle_window
    window.settings.context_length = 0  # the default: the file's 512
    window.model_loading.load_model(str(MODEL), str(MMPROJ))
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    assert window.session.engine_info.context_size == window.session.engine_info.context_limit == 512
    window.session.param_overrides = dict(window.session.param_overrides, max_tokens=1024)  # ignore_eos: fills it
    send(qtbot, window, "Hi")
    status = window.view.widgets[-1].status.text()
    assert "context full" in status and "raise the context" not in status, status
    assert "context 512 / 512" in status, status
    assert "512 of 512" in window.model_bar.context_meter.toolTip()

    window.navigation.new_chat()
    window.composer.edit.setPlainText("word " * 700)
    with qtbot.waitSignal(window.replyFailed, timeout=30000) as blocker:
        window.composer.submit()
    said = blocker.args[0]
    assert "This message is" in said and "shorten it" in said.lower(), said
    assert "new chat" not in said and "raise the context" not in said, said


def test_a_message_sent_while_the_model_loads_shows_at_once(qtbot, idle_window, monkeypatch):
    """Item 13: the message appears at once, marked as queued with the load's progress, and
    is answered when the load ends."""
    import threading

    from tramontane.engine.runtime import local

    release = threading.Event()
    real_init = local.LocalEngine.__init__

    def slow_init(self, *args, progress=None, **kwargs):
        if progress is not None:
            progress(0.4, "weights")
        release.wait(10)  # the load is held here (on the worker) until the test has looked
        real_init(self, *args, progress=progress, **kwargs)

    monkeypatch.setattr(local.LocalEngine, "__init__", slow_init)
    window = idle_window
    # unchecked: the load starts now, before the worker's first progress is delivered
    window.model_loading.load_model(str(MODEL), str(MMPROJ), check=False)
    window.composer.edit.setPlainText("Are you there?")
    window.composer.send_button.click()
    qtbot.waitUntil(lambda: window.view.queued is not None and "40 %" in window.view.queued.status.text())
    assert window.stack.currentWidget() is window.view
    assert window.view.queued.text == "Are you there?" and window.view.queued.isVisible()
    assert "Queued" in window.view.queued.status.text() and MODEL.name in window.view.queued.status.text()
    assert "load" in window.status_label.text()
    release.set()
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        pass
    assert window.view.queued is None
    assert [w.message.role for w in window.view.widgets] == ["user", "assistant"]
    assert window.view.widgets[0].text == "Are you there?"


def test_settings_offer_a_reload_and_the_theme(qtbot, window, monkeypatch):
    """Item 8: a changed context length offers "Reload to apply", which reloads with it; the
    theme is in Settings too, and View → Theme's items are radio buttons."""
    from tramontane.app.dialogs.settings import SettingsDialog

    def user_sets(dialog) -> int:
        dialog.context_length.setValue(128)
        dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
        dialog.accept()
        return 1

    monkeypatch.setattr(SettingsDialog, "exec", user_sets)
    assert window.session.engine_info.context_size == 512 and not window.reload_button.isVisible()
    window.dialogs.open_settings()
    assert window.reload_button.isVisible()
    assert window.appearance.theme == "dark" and window.theme_actions["dark"].isChecked()
    group = window.theme_actions["dark"].actionGroup()
    assert group is not None and group.isExclusive()
    assert not window.theme_actions["light"].isChecked()
    with qtbot.waitSignal(window.modelLoaded, timeout=30000):
        window.reload_button.click()
    assert window.session.engine_info.context_size == 128 and not window.reload_button.isVisible()


def test_rough_edges_of_the_sidebar_and_the_bar(qtbot, window, monkeypatch):
    """Items 10 and 15 (part): the rename dialog is wide enough for a title; Pin says Unpin on a
    pinned chat; Branch and Export are in the list's context menu; a code block's Copy says
    Copied; the memory figure follows the process; a reply shows tok/s while it is written;
    a reopened reply's context count says of how much."""
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QInputDialog

    from tramontane.app import model_loading

    send(qtbot, window, "Hi")
    chat = window.session.current_chat_id
    seen = {}

    def rename(dialog):
        seen["width"] = dialog.minimumWidth()
        dialog.setTextValue("A title of several words, as people write them")
        return 1

    monkeypatch.setattr(QInputDialog, "exec", rename)
    window.chats.rename_selected()
    assert seen["width"] >= 400
    assert window.store.get_chat_info(chat).title.startswith("A title of several")

    assert window.pin_action.text().replace("&", "") == "Pin"
    window.chats.toggle_pin_selected()
    window.navigation.refresh_chat_list()
    assert window.pin_action.text().replace("&", "") == "Unpin"
    assert {window.branch_action, window.export_action, window.pin_action} <= set(window.chat_list.actions())

    window.store.add_message(chat, "user", "code?")
    window.store.add_message(chat, "assistant", "```python\nprint(1)\n```")
    window.conversation.refresh_view()
    body = window.view.widgets[-1].body
    body.anchorClicked.emit(__import__("PySide6.QtCore", fromlist=["QUrl"]).QUrl("copy-code:0"))
    assert QGuiApplication.clipboard().text() == "print(1)" and body.copied_block == 0

    monkeypatch.setattr(model_loading, "memory_words", lambda device: "9.9 GB RAM (process)")
    window.model_loading.refresh_memory()
    assert "9.9 GB RAM" in window.model_bar.device_label.text()

    window.session.param_overrides["max_tokens"] = 200
    notes = []
    window.session.streamed.connect(lambda _text: notes.append(window.view.streaming.status.text()
                                                             if window.view.streaming else ""))
    with qtbot.waitSignal(window.replyFinished, timeout=60000):
        window.composer.edit.setPlainText("Go on")
        window.composer.submit()
    assert any("tok/s" in n for n in notes), notes[-3:]

    window.session.live_stats.clear()  # as after a restart: the stored numbers only
    window.conversation.refresh_view()
    assert "/ 512" in window.view.widgets[-1].status.text()


def test_model_bar_fits_1100_px_with_a_server_and_the_limit_note(qtbot, idle_window):
    """Item 4: at 1100 px, with a server in the box and the file-limit note, the device line is
    whole and the projector shows (a chip; its file in the tooltip)."""
    from PySide6.QtWidgets import QLabel

    window = idle_window
    window.store.set_setting("remote_servers", [
        {"name": "lab", "base_url": "http://127.0.0.1:9/v1", "api_key": "",
         "default_model": "mistral-small-3.1-24b-instruct-2503", "models": ["mistral-small-3.1-24b-instruct-2503"]}])
    window.model_bar.model_combo.reload()
    window.settings.context_length = 4096  # above the file's 512: the bar says "file limit"
    window.resize(1100, 760)
    window.model_loading.load_model(str(MODEL), str(MMPROJ))
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    qtbot.wait(50)
    bar = window.model_bar
    assert "file limit" in bar.device_label.text()
    assert QLabel.text(bar.device_label) == bar.device_label.text(), "the device line is cut"
    assert bar.projector_label.isVisible() and bar.projector_label.text() == "vision"
    assert bar.projector_label.toolTip() == str(MMPROJ)
    assert window.width() == 1100


def test_a_strip_image_is_visible_and_the_viewer_fits(qtbot, window, tmp_path):
    """Item 10 (part): a 1×5000 strip (accepted: the engine reads it within bounded memory) shows
    as a chip one can see, with its size, and in the chat as its name and size, not as a blank
    line; the image viewer opens fitted to its window, and "Actual size" shows 100 %."""
    from support.app_window import png_bytes
    from tramontane.app.widgets.chat_view import ImageViewer

    strip = tmp_path / "strip.png"
    strip.write_bytes(png_bytes(1, 5000))
    window.composer.add_files([str(strip)])
    chip = window.composer.chips[0]
    assert chip.picture.text() == "1×5000" and chip.picture.width() >= 24
    send(qtbot, window, "what is it?")
    thumb = window.view.widgets[-2].thumbs[0]
    assert thumb.text() == "strip.png (1×5000)" and thumb.width() >= 40

    big = tmp_path / "big.png"
    big.write_bytes(png_bytes(3000, 2000))
    viewer = ImageViewer(big, "big.png", window)
    viewer.resize(800, 600)
    viewer.show()
    qtbot.waitExposed(viewer)
    shown = viewer.label.pixmap()
    assert shown.width() <= 800 and shown.height() <= 600 and viewer.zoom_label.text().endswith("%")
    assert abs(shown.width() / shown.height() - 1.5) < 0.02  # the aspect kept
    viewer.size_button.click()
    assert viewer.label.pixmap().width() == 3000 and viewer.zoom_label.text().endswith("100 %")
    viewer.close()


def test_a_deleted_chat_can_be_brought_back(qtbot, window, monkeypatch):
    """Item 10 (part): Delete offers Undo, which brings the chat back whole (its versions too);
    without it the chat is deleted when the offer ends or at quit."""
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    send(qtbot, window, "Keep me")
    user = window.view.widgets[0].message.id
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        window.replies.edit_and_resend(user, "Keep me, edited")
    chat = window.session.current_chat_id
    before = [(m.id, m.text, m.versions) for m in window.store.get_chat(chat).messages]
    window.chats.delete_selected()
    assert window.chat_model.row_of(chat) == -1 and window.session.current_chat_id is None
    assert window.undo_button.isVisible() and "Keep me" in window.undo_button.text()
    window.undo_button.click()
    assert window.session.current_chat_id == chat and window.chat_model.row_of(chat) >= 0
    assert [(m.id, m.text, m.versions) for m in window.store.get_chat(chat).messages] == before

    window.chats.delete_chat(chat)
    window.undo_button.timer.setInterval(10)
    window.undo_button.timer.start()
    qtbot.waitUntil(lambda: not window.undo_button.isVisible(), timeout=5000)
    assert [c.id for c in window.store.list_chats()] == []


def test_dragging_images_over_the_window_shows_where_they_go(qtbot, window, tmp_path):
    """Item 10 (part): an overlay over the conversation while images are dragged; gone at the
    drop (the image is attached) or when the drag leaves."""
    from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDragLeaveEvent, QDropEvent
    from PySide6.QtWidgets import QApplication

    from support.app_window import png_bytes

    image = tmp_path / "cat.png"
    image.write_bytes(png_bytes(16, 16))
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(image))])
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, QDragEnterEvent(QPoint(300, 300), *args))
    assert window.drops.overlay.isVisible() and "Drop images" in window.drops.overlay.text()
    window.grab().save(str(tmp_path / "drop.png"))
    QApplication.sendEvent(window, QDragLeaveEvent())
    assert not window.drops.overlay.isVisible()
    QApplication.sendEvent(window, QDragEnterEvent(QPoint(300, 300), *args))
    QApplication.sendEvent(window, QDropEvent(QPointF(300, 300), *args))
    assert not window.drops.overlay.isVisible() and len(window.composer.images) == 1


def test_the_inline_editor_opens_unscrolled(qtbot, window):
    """Item 15 (part): Edit on a long message opens an editor as tall as the text allows (14
    lines), at its start, not scrolled to its end."""
    text = "\n".join(f"line {i} of a question" for i in range(30))
    open_stored_chat(window, "Long question", text, "ok")
    question = window.view.widgets[0]
    question.buttons["edit"].click()
    qtbot.wait(20)
    bar = question.editor.verticalScrollBar()
    assert question.editor.toPlainText() == text
    assert bar.value() == 0, (bar.maximum(), bar.value())  # at the start: line 0 shows
    line = question.editor.fontMetrics().lineSpacing()
    assert question.editor.height() >= 12 * line  # as tall as it may be, not a three-line box


def test_the_load_progress_text_is_not_cut(qtbot, idle_window):
    """Item 15 (part): the stage of a load shows beside the model's name; the bar keeps "40 %"
    (with the stage in it, it wrapped and was cut)."""
    bar = idle_window.model_bar
    bar.show_loading("Mistral-Small-3.1-24B-Instruct-2503-Q4_K_M.gguf")
    bar.show_progress(0.4, "repacking Q4_K weights for the CPU kernels")
    assert bar.progress.format() == "%p %" and bar.progress.text() == "40 %"
    assert bar.model_label.text().endswith("· repacking Q4_K weights for the CPU kernels")


def test_tables_have_single_thin_lines(qtbot, idle_window):
    """Item 10 (part): a Markdown table in a reply: collapsed 1 px borders, padded cells and a
    tinted header row (Qt's default, spaced double borders, looked like old HTML)."""
    from PySide6.QtGui import QTextTable

    window = idle_window
    open_stored_chat(window, "Tables", "compare", "| Model | Size |\n|---|---|\n| 3B | 2.2 GB |\n| 24B | 15 GB |")
    document = window.view.widgets[-1].body.document()
    tables = [f for f in document.rootFrame().childFrames() if isinstance(f, QTextTable)]
    assert len(tables) == 1
    fmt = tables[0].format()
    assert fmt.borderCollapse() and fmt.border() == 1 and fmt.cellSpacing() == 0 and fmt.cellPadding() == 6
    header, body = tables[0].cellAt(0, 0).format(), tables[0].cellAt(1, 0).format()
    assert header.background().color() != body.background().color()


def test_a_branch_is_named_as_one(qtbot, window):
    """Item 10 (part): a branch's title starts with "Branch:", visible in the sidebar (the
    "(branch)" at its end was cut off, so both chats looked the same)."""
    from PySide6.QtCore import Qt

    send(qtbot, window, "A question long enough to be cut off in the sidebar")
    source = window.session.current_chat_id
    branch = window.chats.branch_at(None, source)
    title = window.store.get_chat_info(branch).title
    assert title == "Branch: A question long enough to be cut off in the sidebar"
    row = window.chat_model.index(window.chat_model.row_of(branch))
    assert row.data(Qt.ItemDataRole.DisplayRole).startswith("Branch: ")
