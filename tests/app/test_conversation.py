"""app/conversation.py: what the window shows of the open chat and the engine, here the actions
that are on only when they can act."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from support.app_window import MMPROJ, MODEL, close_window, load_and_wait, make_window, send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def test_unload_and_regenerate_are_enabled_only_when_they_can_act(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", load=False)
    try:
        assert not window.unload_action.isEnabled()
        assert not window.regenerate_action.isEnabled()
        load_and_wait(qtbot, window, MODEL, MMPROJ)
        assert window.unload_action.isEnabled()
        assert not window.regenerate_action.isEnabled()  # an empty chat: nothing to regenerate
        send(qtbot, window, "Hi")
        assert window.regenerate_action.isEnabled()
        window.navigation.new_chat()
        assert not window.regenerate_action.isEnabled()
        window.unload_action.trigger()
        qtbot.waitUntil(lambda: window.session.engine_info is None, timeout=30000)
        assert not window.unload_action.isEnabled()
    finally:
        close_window(window)
