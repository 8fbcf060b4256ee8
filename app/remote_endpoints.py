"""Remote endpoints as the app keeps them: the saved list of OpenAI-compatible servers and
what a chat runs on (the local model or a model on one of them). No widgets: the Servers
dialog (dialogs/remote_endpoints.py) and the window both use this.

Persistence goes through any settings object passed in: one with `get_setting(key, default)`
/ `set_setting(key, value)` (the app's Store), or `get(key[, default])` / `set(key,
value)`, or a plain dict. Servers are saved under `remote_servers` as a JSON list of
{name, base_url, api_key, default_model, models}. The key is stored there (the settings
table, never a chat export) and is never shown: `RemoteEndpoint.__repr__` leaves it out.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engine.api import EngineError
from ..engine.remote.client import RemoteEngine
from ..engine.remote.transport import RemoteError, parse_base_url

SETTINGS_KEY = "remote_servers"


@dataclass
class RemoteEndpoint:
    name: str
    base_url: str
    api_key: str = field(default="", repr=False)
    default_model: str = ""
    models: list[str] = field(default_factory=list)  # last list the server gave

    def check(self) -> None:
        """Raises EngineError naming the field that is wrong."""
        if not self.name.strip():
            raise EngineError("server name: must not be empty")
        try:
            parse_base_url(self.base_url)
        except RemoteError as exc:
            raise EngineError(f"server {self.name!r}: {exc}") from None

    def engine(self, model: str | None = None, **kwargs) -> RemoteEngine:
        model = model or self.default_model or (self.models[0] if self.models else "")
        if not model:
            raise EngineError(f"server {self.name!r}: no model chosen (test the connection "
                              "to list the server's models)")
        return RemoteEngine(self.base_url, model, self.api_key or None, **kwargs)

    @classmethod
    def from_dict(cls, obj: Any) -> "RemoteEndpoint | None":
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        models = obj.get("models")
        return cls(name=obj["name"], base_url=str(obj.get("base_url") or ""),
                   api_key=str(obj.get("api_key") or ""),
                   default_model=str(obj.get("default_model") or ""),
                   models=[str(m) for m in models] if isinstance(models, list) else [])


class RemoteEndpointList:
    """The saved servers, read from and written to the settings object."""

    def __init__(self, settings: Any):
        self._settings = settings

    def _get(self) -> Any:
        s = self._settings
        if hasattr(s, "get_setting"):
            return s.get_setting(SETTINGS_KEY, None)
        try:
            return s.get(SETTINGS_KEY, None)
        except TypeError:  # a get(key) without a default
            return s.get(SETTINGS_KEY)

    def _set(self, value: Any) -> None:
        s = self._settings
        if hasattr(s, "set_setting"):
            s.set_setting(SETTINGS_KEY, value)
        elif hasattr(s, "set"):
            s.set(SETTINGS_KEY, value)
        else:
            s[SETTINGS_KEY] = value

    def load(self) -> list[RemoteEndpoint]:
        raw = self._get()
        if isinstance(raw, str):  # a settings backend that keeps only strings
            try:
                raw = json.loads(raw)
            except ValueError:
                raw = None
        if not isinstance(raw, list):
            return []
        return [c for c in (RemoteEndpoint.from_dict(o) for o in raw) if c is not None]

    def save(self, servers: list[RemoteEndpoint]) -> None:
        self._set([asdict(s) for s in servers])

    def find(self, name: str) -> RemoteEndpoint | None:
        return next((s for s in self.load() if s.name == name), None)


@dataclass(frozen=True)
class EngineChoice:
    """What a chat runs on: the local model (server None) or `model` on the named server."""

    server: str | None = None
    model: str | None = None

    @property
    def is_local(self) -> bool:
        return self.server is None


def engine_for_choice(choice: EngineChoice, servers: RemoteEndpointList, **kwargs) -> RemoteEngine | None:
    """The RemoteEngine for a remote choice; None for the local model."""
    if choice.is_local:
        return None
    config = servers.find(choice.server)
    if config is None:
        raise EngineError(f"server {choice.server!r} is no longer in the settings")
    return config.engine(choice.model, **kwargs)


def url_ok(url: str) -> bool:
    """Whether `url` is a base URL the client accepts."""
    try:
        parse_base_url(url)
        return True
    except RemoteError:
        return False
