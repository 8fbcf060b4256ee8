"""A chat bound to a server reopens bound to it after quit and relaunch: the model box shows
the server's model and the next message goes to the server, not to the local model that the
window loads by itself at start (issue 26, item 1)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from support.app_window import close_window, make_window, pick_server, send  # noqa: E402
from support.fakevllm import FakeVLLM  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def test_server_chat_reopens_on_its_server(qtbot, tmp_path):
    data = tmp_path / "data"
    with FakeVLLM(models=["served-model"], reply="Hi from the server.") as fake:
        w1 = make_window(qtbot, data)  # the local model loaded: it is the "last model"
        pick_server(qtbot, w1, fake)
        send(qtbot, w1, "hello server")
        chat_id = w1.session.current_chat_id
        close_window(w1)
        asked = len(fake.requests)

        w2 = make_window(qtbot, data, load=False, autoload=True)  # as a user relaunches it
        try:
            assert w2.session.current_chat_id == chat_id
            combo = w2.model_bar.model_combo
            assert combo.currentText() == "served-model — lab"
            qtbot.waitUntil(lambda: w2.session.engine_info is not None and w2.session.loading is None, timeout=30000)
            assert w2.session.engine_info.remote and "served-model" in w2.model_bar.model_label.text()
            reply_id = send(qtbot, w2, "and again")
            assert w2.store.get_message(reply_id).text == "Hi from the server."
            assert len(fake.requests) > asked
            assert combo.currentText() == "served-model — lab"
            # A local chat still starts the local model.
            with qtbot.waitSignal(w2.modelLoaded, timeout=30000):
                combo.setCurrentIndex(combo.findText("Local model"))
            assert not w2.session.engine_info.remote
        finally:
            close_window(w2)
