"""The saved servers and what a chat runs on (no widgets): storage round trip, field checks."""
from __future__ import annotations

import json

import pytest

from tramontane.app.remote_endpoints import RemoteEndpoint, RemoteEndpointList
from tramontane.engine.api import EngineError


class GetSetSettings:
    """A key/value store with get(key) (no default) and set(key, value) that keeps strings."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def get(self, key):
        return self.values.get(key)

    def set(self, key, value):
        self.values[key] = json.dumps(value)


class StoreLikeSettings:
    def __init__(self):
        self.values: dict = {}

    def get_setting(self, key, default=None):
        return json.loads(self.values[key]) if key in self.values else default

    def set_setting(self, key, value):
        self.values[key] = json.dumps(value)


@pytest.mark.parametrize("settings_cls", [dict, GetSetSettings, StoreLikeSettings])
def test_server_list_round_trip(settings_cls):
    settings = settings_cls()
    servers = RemoteEndpointList(settings)
    assert servers.load() == []
    configs = [RemoteEndpoint("a", "http://h:1/v1", "sk-x", "m", ["m", "n"]),
               RemoteEndpoint("b", "http://h:2")]
    servers.save(configs)
    assert RemoteEndpointList(settings).load() == configs
    assert RemoteEndpointList(settings).find("b") == configs[1]
    assert "sk-x" not in repr(configs[0])


def test_server_config_checks_fields():
    with pytest.raises(EngineError, match="server name: must not be empty"):
        RemoteEndpoint(" ", "http://h").check()
    with pytest.raises(EngineError, match="server 'x'.*expected http"):
        RemoteEndpoint("x", "gopher://h").check()
    with pytest.raises(EngineError, match="no model chosen"):
        RemoteEndpoint("x", "http://h").engine()
