"""The window reaches engines only through the `Engine` protocol (engine/api.py; issue 33 item 4):
every member it declares is one of every engine class (LocalEngine, its batched view, RemoteEngine),
and app/ probes no engine with getattr/hasattr."""
from __future__ import annotations

import re
from pathlib import Path

from tramontane.engine.api import Engine

APP = Path(__file__).resolve().parents[2] / "app"


def protocol_members() -> set[str]:
    names = {n for n in vars(Engine) if not n.startswith("_")} | set(getattr(Engine, "__annotations__", {}))
    return names - {"__init__"}


def missing(engine) -> set[str]:
    """The protocol's members `engine` has neither on its class nor as its own attribute (looked up
    without running a property)."""
    return {n for n in protocol_members() if n not in dir(type(engine)) and n not in vars(engine)}


def test_every_engine_class_has_every_member_of_the_protocol():
    from tramontane.engine.remote.client import RemoteEngine
    from tramontane.engine.runtime.batch import BatchedEngine
    from tramontane.engine.runtime.local import LocalEngine

    from support.served import MODEL

    assert {"model_path", "think_ids", "device_kind", "chat"} <= protocol_members()
    remote = RemoteEngine("http://127.0.0.1:9", "some-model")
    assert missing(remote) == set() and remote.model_path is None
    local = LocalEngine(MODEL, None, device="cpu", context_length=256)
    try:
        assert missing(local) == set() and local.model_path == Path(MODEL)
        batched = BatchedEngine(local, scheduler=None)
        assert missing(batched) == set() and batched.model_path == local.model_path
    finally:
        local.close()


def test_app_probes_no_engine_with_getattr_or_hasattr():
    probe = re.compile(r"\b(?:getattr|hasattr)\(\s*[\w.]*engine\b", re.IGNORECASE)
    found = [f"{path.relative_to(APP)}:{n}: {line.strip()}"
             for path in APP.rglob("*.py")
             for n, line in enumerate(path.read_text("utf-8").splitlines(), 1) if probe.search(line)]
    assert found == []
