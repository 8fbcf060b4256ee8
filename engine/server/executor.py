"""The engine's owner, as the server sees it: jobs handed over, Futures back.

Engines are not thread-safe, so the server never calls one: it hands `job(engine)` to an
`EngineExecutor`, which runs it where the engine may be used and answers a Future. The CLI's
owner is `BatchExecutor`: every job runs at once on a worker thread of its own with a
`BatchedEngine`, whose generations are sequences of one `BatchScheduler` (continuous batching:
one pass over the weights per step for all of them). `ThreadExecutor` runs jobs one at a time
in arrival order on one thread (any engine). The window's owner is its engine worker
(`app/worker.py`): while it serves a local model it holds a `BatchExecutor` on that engine, its
own replies on the priority lane (app/serving.py).
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
    """What /v1/models shows for a local engine (None for a remote one). Call it on the
    engine's owner thread."""
    if engine.device_kind == "remote":
        return None
    return ServedModel(Path(engine.model_path).stem, bool(engine.has_vision), int(engine.context_size),
                       max_token_bytes=longest_token_bytes(engine.tokenizer),
                       vocab_size=int(engine.tokenizer.vocab_size))


class BatchExecutor:
    """The owner for a LocalEngine (the CLI's; the window's while it serves): jobs run
    concurrently, generations batched together.

    Each job gets a worker thread (a job blocks on its generation) and the `BatchedEngine`;
    `slots` sequences decode at once, later ones wait for a slot in the scheduler. `priority`
    is the same engine on the priority lane (the window's own replies), with
    `priority_slots` slots kept for it."""

    def __init__(self, engine, slots: int = 8, workers: int = 64, priority_slots: int = 1, **scheduler_options):
        """`scheduler_options`: see LocalEngine.serve (every sequence takes blocks of the engine's one pool)."""
        from ..runtime.batch import BatchedEngine  # torch: not at the CLI parser's import

        self._engine = engine
        # the engine's own scheduler, given more slots and a loop thread (one scheduler for every reply)
        self.scheduler = engine.serve(slots, priority_slots, **scheduler_options)
        self.engine = BatchedEngine(engine, self.scheduler)
        self.priority = self.engine.prioritized()
        self._model = served_model_of(self.engine)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tramontane-job")

    def served_model(self) -> ServedModel | None:
        return self._model

    def submit(self, job: Job) -> Future:
        # announced from now on: a burst of requests is read in one step (BatchScheduler.gather_s)
        engine = self.engine.for_job()
        future = self._pool.submit(job, engine)
        future.add_done_callback(lambda _: engine.arrival.done())  # it never generated, or was cancelled queued
        return future

    def shutdown(self) -> None:
        """Fail what runs or waits (the scheduler stops: a 503 for the clients, who may send it
        again to the next model), then wait for the jobs to end."""
        self._engine.stop_serving(ModelUnavailable("the model was unloaded or changed while this request ran: "
                                                   "send it again"))
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
