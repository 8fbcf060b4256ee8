"""The engine's owner, as the server sees it: jobs handed over, Futures back.

Engines are not thread-safe, so the server never calls one: it hands `job(engine)` to an
`EngineExecutor`, which runs it where the engine may be used and answers a Future. The CLI's
owner is `BatchExecutor`: every job runs at once on a worker thread of its own with a
`BatchedEngine`, whose generations are sequences of one `BatchScheduler` (continuous batching:
one pass over the weights per step for all of them). `ThreadExecutor` runs jobs one at a time
in arrival order on one thread (any engine); the window's owner is its engine worker
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


class BatchExecutor:
    """The CLI's owner for a LocalEngine: jobs run concurrently, generations batched together.

    Each job gets a worker thread (a job blocks on its generation) and the `BatchedEngine`;
    `slots` sequences decode at once, later ones wait for a slot in the scheduler."""

    def __init__(self, engine, slots: int = 8, workers: int = 64, **scheduler_options):
        from ..runtime.batch import BatchedEngine, BatchScheduler  # torch: not at the CLI parser's import

        self._engine = engine
        context = engine.context_size
        if any(seg.device.type == "cuda" for seg in engine.model.segments):
            # GPU memory holds the plan's one context: the slots share it (as llama-server's -np)
            context = max(256, context // (slots + 1))
        scheduler_options.setdefault("context_length", context)
        self.scheduler = BatchScheduler(engine.model, engine.tokenizer, engine.vision, slots=slots,
                                        **scheduler_options).start()
        self.engine = BatchedEngine(engine, self.scheduler)
        self._model = served_model_of(self.engine)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tramontane-job")

    def served_model(self) -> ServedModel | None:
        return self._model

    def submit(self, job: Job) -> Future:
        return self._pool.submit(job, self.engine)

    def shutdown(self) -> None:
        """Fail what runs or waits (the scheduler stops), then wait for the jobs to end."""
        self.scheduler.close()
        self._pool.shutdown(wait=True, cancel_futures=True)


class ThreadExecutor:
    """One thread that holds the engine and runs jobs in order (any engine, one at a time)."""

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
