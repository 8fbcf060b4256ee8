"""The settings table: JSON values by key, kept across a restart."""
from __future__ import annotations

import pytest

from tramontane.app.store import Store, StoreError


def test_settings_round_trip_and_persist(tmp_path):
    with Store(tmp_path) as s:
        assert s.get_setting("last_chat") is None and s.get_setting("x", 5) == 5
        s.set_setting("last_chat", 3)
        s.set_setting("last_model", "/models/ministral.gguf")
        s.set_setting("default_system_prompt", "Réponds en français.")
        s.set_setting("window", {"w": 800, "h": 600, "split": [1, 2]})
        s.set_setting("last_chat", 4)
        s.delete_setting("last_model")
        with pytest.raises(StoreError, match="'bad': not JSON"):
            s.set_setting("bad", {1, 2})
    with Store(tmp_path) as s:
        assert s.settings() == {"last_chat": 4, "default_system_prompt": "Réponds en français.",
                                "window": {"w": 800, "h": 600, "split": [1, 2]}}
