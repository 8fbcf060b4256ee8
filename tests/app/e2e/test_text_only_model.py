"""Found by using the window: images attached while a vision model was loaded stayed in the
composer after loading a text-only model; sending saved the message, the reply failed with
"this model has no vision projector", and from then on every message in that chat failed the
same way. Regenerating in such a chat first dropped the old reply, then failed: the reply was
lost. The window now refuses before anything is saved or dropped, and says what to do."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from tramontane.engine.api import ImagePart  # noqa: E402

from support.app_window import GREEDY, MMPROJ, MODEL, load_and_wait, png_bytes  # noqa: E402


@pytest.fixture
def window(idle_window):
    idle_window.session.param_overrides = dict(GREEDY, max_tokens=6, ignore_eos=True)
    return idle_window


def load(qtbot, window, mmproj: Path | None) -> None:
    load_and_wait(qtbot, window, MODEL, mmproj)
    assert window.session.engine_info is not None
    assert window.session.engine_info.has_vision == (mmproj is not None)


def test_attached_images_are_kept_and_refused_on_a_text_only_model(qtbot, window, tmp_path):
    load(qtbot, window, MMPROJ)
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes(40, 28))
    assert window.composer.add_files([str(image)]) == 1
    load(qtbot, window, None)  # the user switches to a model without its projector

    window.composer.edit.setPlainText("What is in it?")
    window.composer.submit()
    qtbot.wait(200)
    assert window.session.pending is None
    assert window.store.list_chats() == []  # nothing saved
    assert window.composer.images and window.composer.edit.toPlainText() == "What is in it?"
    assert window.composer.message.isVisible() and "projector" in window.composer.message.text()

    # Removing the image sends the text.
    window.composer.clear_images()
    with qtbot.waitSignal(window.replyFinished, timeout=30000):
        window.composer.submit()


def test_regenerate_in_an_image_chat_on_a_text_only_model_keeps_the_reply(qtbot, window):
    store = window.store
    chat_id = store.create_chat("pictures")
    store.add_message(chat_id, "user", "What is this?", [ImagePart(png_bytes(30, 20), "a.png")])
    reply_id = store.begin_reply(chat_id)
    store.finish_reply(reply_id, "A striped square.", None)
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    load(qtbot, window, None)

    window.replies.regenerate(None)
    qtbot.wait(300)
    assert window.session.pending is None
    messages = store.get_chat(chat_id).messages
    assert [m.text for m in messages] == ["What is this?", "A striped square."]
    assert "projector" in window.session.notices.get(chat_id, "")

    # A new message in that chat is refused the same way, before it is saved.
    window.composer.edit.setPlainText("and now?")
    window.composer.submit()
    qtbot.wait(200)
    assert window.session.pending is None and len(store.get_chat(chat_id).messages) == 2
    assert "projector" in window.composer.message.text()


def test_load_a_model_first_hint_goes_away_once_a_model_is_loaded(qtbot, window):
    """The "Load a model first" hint stayed under the composer after the model was loaded."""
    window.composer.edit.setPlainText("hello")
    window.composer.submit()
    assert window.composer.message.isVisible() and "Load a model" in window.composer.message.text()
    load(qtbot, window, MMPROJ)
    assert not window.composer.message.isVisible()
    assert window.composer.edit.toPlainText() == "hello"  # what was typed is still there
