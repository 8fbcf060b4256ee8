"""The engine's one owner, as the server sees it: jobs run one at a time, in arrival order.

Engines are not thread-safe, so the server never calls one: it hands `job(engine)` to an
`EngineExecutor`, which runs it on the thread that owns the engine and answers a Future. The
CLI's owner is `ThreadExecutor` (one thread of its own); the window's is its engine worker
(`app/worker.py`), so the window and the server share the engine and its KV caches.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..api import EngineError
from .openai_api import ServedModel, longest_token_bytes

T = TypeVar("T")
Job = Callable[[Any], T]  # runs on the owner thread with the engine


class ModelUnavailable(EngineError):
    """No local model is loaded (or it is loading): the server answers 503."""


class EngineExecutor(Protocol):
    def served_model(self) -> ServedModel | None:
        """The loaded local model, or None while none is (callable from any thread)."""
        ...

    def submit(self, job: Job) -> Future:
        """Queue `job(engine)` behind every job submitted before it. A job still queued can be
        cancelled with `Future.cancel()`; one that runs gets the engine it must not keep."""
        ...


def served_model_of(engine) -> ServedModel | None:
    """What /v1/models shows for a local engine (None for anything else, e.g. a remote one).
    Call it on the engine's owner thread."""
    path = getattr(engine, "model_path", None)
    if path is None or not hasattr(engine, "complete"):
        return None
    return ServedModel(Path(path).stem, bool(engine.has_vision), int(engine.context_size),
                       max_token_bytes=longest_token_bytes(engine.tokenizer))


class ThreadExecutor:
    """The CLI's owner: one thread that holds the engine and runs jobs in order."""

    def __init__(self, engine):
        self._engine = engine
        self._model = served_model_of(engine)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tramontane-engine")

    def served_model(self) -> ServedModel | None:
        return self._model

    def submit(self, job: Job) -> Future:
        return self._pool.submit(job, self._engine)

    def shutdown(self) -> None:
        """Drop queued jobs, wait for the running one (cancel it first)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
