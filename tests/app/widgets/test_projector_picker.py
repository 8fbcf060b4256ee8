"""Issue 35, items 1, 5, 6 and 10 on the real window: Model ▸ Projector… chooses or changes the
loaded model's projector (or none) among those that fit (engine/library/projector.py); a model
whose neighbours were refused says which and why; what was said about the previous model goes
when another loads; a dropped .gguf is offered as the model."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.app_window import drop_files, send  # noqa: E402
from tramontane.app.widgets.projector_picker import NONE_TEXT, PATH_ROLE  # noqa: E402
from tramontane.engine.library.projector import check_projector, pair_projector  # noqa: E402

TINY, Q256 = "mistral3_tiny-f32.gguf", "mistral3_q256-Q4_K_M.gguf"
TINY_PROJ, GELU_PROJ = "mmproj-mistral3_tiny-f32.gguf", "mmproj-mistral3_tiny_gelu-f32.gguf"


def folder_with(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(FIXTURES / name, folder / name)
    return folder


def loaded(qtbot, window, model, mmproj=""):
    window.model_loading.load_model(str(model), str(mmproj), check=False)
    qtbot.waitUntil(lambda: window.session.engine_info is not None and window.session.loading is None,
                    timeout=30000)
    return window.session.engine_info


def open_picker(qtbot, window):
    window.projector_action.trigger()
    qtbot.waitUntil(lambda: window.model_loading.projector_picker is not None, timeout=10000)
    return window.model_loading.projector_picker


def rows(picker):
    return [picker.list.item(i).text() for i in range(picker.list.count())]


def pick(qtbot, window, picker, text):
    picker.list.setCurrentRow(rows(picker).index(text))
    picker.accept()
    qtbot.waitUntil(lambda: window.session.loading is None and window.session.engine_info is not None,
                    timeout=30000)
    return window.session.engine_info


def test_the_projector_menu_changes_the_projector_or_takes_it_away(qtbot, idle_window, tmp_path):
    window = idle_window
    d = folder_with(tmp_path / "models", TINY, TINY_PROJ, GELU_PROJ)
    assert not window.projector_action.isEnabled()  # no model yet
    info = loaded(qtbot, window, d / TINY, d / TINY_PROJ)
    assert window.projector_action.isEnabled() and info.has_vision

    picker = open_picker(qtbot, window)
    assert rows(picker) == [TINY_PROJ, GELU_PROJ, NONE_TEXT]  # those that fit, the rule's first
    assert picker.chosen() == str(d / TINY_PROJ)  # the loaded one
    # a file from elsewhere that is no projector for it is refused with its reason, not offered
    other = folder_with(tmp_path / "elsewhere", Q256)
    picker.offer_file(str(other / Q256))
    qtbot.waitUntil(lambda: picker.error.isVisibleTo(picker), timeout=10000)
    assert picker.error.text() == check_projector(d / TINY, other / Q256).reason
    assert rows(picker) == [TINY_PROJ, GELU_PROJ, NONE_TEXT]
    info = pick(qtbot, window, picker, NONE_TEXT)
    assert info.model_path == str(d / TINY) and info.mmproj_path == "" and not info.has_vision
    assert window.model_bar.projector_label.text() == "text only"

    # and back, to another one that fits, from another folder
    fits = folder_with(tmp_path / "projectors", TINY_PROJ)
    picker = open_picker(qtbot, window)
    assert picker.chosen() == ""
    picker.offer_file(str(fits / TINY_PROJ))
    qtbot.waitUntil(lambda: picker.chosen() == str(fits / TINY_PROJ), timeout=10000)
    # two of one name are told apart by their folders, as the Models dialog's rows are
    assert rows(picker) == [f"{TINY_PROJ} — models", GELU_PROJ, f"{TINY_PROJ} — projectors", NONE_TEXT]
    assert picker.list.item(2).data(PATH_ROLE) == str(fits / TINY_PROJ)
    picker.accept()
    qtbot.waitUntil(lambda: window.session.engine_info is not None
                    and window.session.engine_info.mmproj_path == str(fits / TINY_PROJ), timeout=30000)
    assert window.session.engine_info.has_vision and window.model_bar.projector_label.text() == "vision"


def test_a_refused_projector_is_named_with_its_reason_when_the_model_opens(qtbot, idle_window, tmp_path):
    window = idle_window
    d = folder_with(tmp_path / "models", Q256, TINY_PROJ)
    note = pair_projector(d / Q256).note
    assert TINY_PROJ in note and note.endswith("The model loads without vision.")
    window.model_loading.open_as_model(str(d / Q256))  # as Open… and a dropped file do
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=60000)
    chip = window.model_bar.projector_label
    assert chip.text() == "text only" and chip.toolTip().startswith(note)
    assert chip.accessibleDescription() == note
    assert window.statusBar().currentMessage() == note
    # a model whose projector pairs has nothing to say
    window.model_loading.open_as_model(str(FIXTURES / TINY))
    qtbot.waitUntil(lambda: window.session.engine_info is not None
                    and window.session.engine_info.model_path == str(FIXTURES / TINY), timeout=30000)
    assert chip.text() == "vision" and chip.accessibleDescription() == ""


def test_what_was_said_about_the_previous_model_goes_when_another_loads(qtbot, window, tmp_path):
    """Issue 35, item 5: the red "… stays loaded" line, and a chat's "more than the model's
    context of N", stayed after another model (or context) was loaded."""
    from support.app_window import MODEL

    bad = tmp_path / "notamodel.gguf"
    bad.write_bytes(b"not GGUF at all" * 10)
    window.model_loading.load_model(str(bad))
    qtbot.waitUntil(lambda: "stays loaded" in window.composer.message.text(), timeout=10000)
    window.settings.context_length = 40
    loaded(qtbot, window, MODEL)
    assert not window.composer.message.isVisible()

    with qtbot.waitSignal(window.replyFailed, timeout=30000) as failed:
        window.replies.send("many words " * 30, [])
    chat_id = window.session.current_chat_id
    assert "context" in failed.args[0] and window.session.notices.get(chat_id) == failed.args[0]
    window.settings.context_length = 0
    loaded(qtbot, window, MODEL)
    assert chat_id not in window.session.notices
    assert window.view.notice.isHidden()


def test_a_dropped_gguf_is_offered_as_the_model(qtbot, idle_window, tmp_path):
    window = idle_window
    d = folder_with(tmp_path / "models", TINY, TINY_PROJ)
    drop_files(window, [d / TINY])
    qtbot.waitUntil(lambda: window.model_loading.model_offer is not None, timeout=5000)
    assert "not an image" not in window.composer.message.text()
    box = window.model_loading.model_offer
    assert TINY in box.text() and "Load it as the model?" in box.text()
    box.button(QMessageBox.StandardButton.Open).click()
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    info = window.session.engine_info
    assert info.model_path == str(d / TINY) and info.mmproj_path == str(d / TINY_PROJ)
    assert window.composer.images == []
