"""A draft model for speculative decoding: a smaller Mistral 3 GGUF whose vocabulary agrees with
the target's (speculative.check_draft_vocabulary), proposing greedy tokens for many sequences at
once from a KV pool of its own.

Each sequence (a key chosen by the caller) keeps its draft KV between calls: a call passes the
sequence's confirmed tokens, the KV of their longest common prefix with what the draft read
before stays, the rest is cut off and the new tokens are read (in prefill chunks, every
sequence's together). Then k decode steps, each one pass for every sequence
(runtime.decoder.decode_rows), draw the drafts by argmax. The target decides every token (its
verification is lossless whatever the draft proposes), so a draft's only duty is to be cheap
and often right.

A sequence that ended is retired (`retire`), not dropped: its KV serves the next new key whose
ids share the most of it (a chat's next turn, the same prompt sent again), as the target's
prefix cache serves the target, so drafting for a reply does not start by reading its whole
prompt again; retired KV is the first to go when a call needs blocks.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..api import EngineError
from ..mistral3.text import Mistral3Text
from .decoder import decode_rows, default_context_length, new_pool
from .kv_cache import KVCache, KVPool, new_sequence
from .speculative import check_draft_vocabulary

DraftRequest = tuple[object, Sequence[int], int]  # (key, ids, k): see DraftModel.draft
# Ended sequences kept for a later one to take over (each new key compares its ids with every one)
RETIRED_KEPT = 32


@dataclass
class _Sequence:
    """What the draft read for one key: `cache` holds the KV of `fed` (cache.length == len(fed));
    `after[i]` is the draft's greedy token after fed[:i + 1], where a decode step computed it
    (None for rows read as a prompt chunk, whose logits are never made)."""

    cache: KVCache
    fed: list[int] = field(default_factory=list)
    after: list[int | None] = field(default_factory=list)

    def cut(self, n: int) -> None:
        self.cache.truncate(n)
        del self.fed[n:]
        del self.after[n:]


@dataclass
class _Job:
    """One sequence's work in a draft call: `todo` the tokens still to read, `drafts` so far, `k` wanted."""

    seq: _Sequence
    todo: list[int]
    k: int
    drafts: list[int] = field(default_factory=list)


def _target_file(target) -> str:
    """The target's GGUF path from a path, a Tokenizer (its `source`) or a model (its `path`)."""
    if isinstance(target, (str, os.PathLike)):
        return os.fspath(target)
    for attr in ("source", "path"):
        value = getattr(target, attr, None)
        if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
            return os.fspath(value)
    raise EngineError(f"a draft model's vocabulary is checked against the target's GGUF file: "
                      f"{type(target).__name__} names none")


def _common_prefix(a: Sequence[int], b: Sequence[int], stride: int = 64) -> int:
    """How many leading tokens a and b share: whole strides compared as list slices (in C), then
    token by token inside the first stride that differs."""
    n = min(len(a), len(b))
    i = 0
    while i + stride <= n and a[i:i + stride] == b[i:i + stride]:
        i += stride
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModel:
    """Greedy drafts for many sequences from one small model and its own KV pool."""

    def __init__(self, model: Mistral3Text, pool: KVPool, context_length: int):
        self.model = model
        self.pool = pool
        self.context_length = int(context_length)  # one sequence's most positions
        self._seqs: OrderedDict[object, _Sequence] = OrderedDict()  # least recently drafted first
        self._retired: OrderedDict[object, _Sequence] = OrderedDict()  # ended sequences' KV, oldest first
        self._lock = threading.Lock()  # the scheduler's thread drafts; forget may come from elsewhere
        self._closed = False
        self._promised = 0

    @classmethod
    def load(cls, path: str | os.PathLike, target_tokenizer_or_file, device: str | torch.device = "cpu",
             positions: int | None = None, context_length: int | None = None,
             **load_kwargs) -> "DraftModel":
        """Check `path`'s vocabulary against the target's file (a path, or the target's Tokenizer
        or model, which name theirs), then load its weights on `device` (Mistral3Text.load;
        `load_kwargs` go there, e.g. plan=) and make a KV pool of `positions` positions for all
        sequences together (default: the model's default context), each sequence at most
        `context_length` of them (default: all). DraftModelError naming both files when the
        vocabularies differ."""
        check_draft_vocabulary(_target_file(target_tokenizer_or_file), path)
        model = Mistral3Text.load(path, device=device, **load_kwargs)
        n = default_context_length(model) if positions is None else int(positions)
        if n <= 0:
            raise EngineError(f"{os.fspath(path)}: a draft model's KV pool needs positions, got {n}")
        context = min(n, int(context_length or n), model.cfg.context_length)
        pool = new_pool(model, n, context_length=context)
        return cls(model, pool, context)

    # ------------------------------------------------------------------------------ drafting
    def draft(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Greedy drafts for each (key, ids, k): up to k tokens to follow `ids` (the sequence's
        confirmed tokens: prompt and accepted output). [] for a request with k <= 0, no ids, ids
        that leave no room in the draft's context, or no room in its pool; fewer than k where
        the context ends sooner."""
        keys = [key for key, _, _ in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("a draft call names a sequence twice")
        with self._lock:
            if self._closed:
                raise EngineError("the draft model was closed")
            self._promised = 0  # blocks the jobs made so far will take
            jobs: list[_Job | None] = [self._job(key, list(ids), int(k), set(keys)) for key, ids, k in requests]
            live = [job for job in jobs if job is not None]
            self._read_prompts(live)
            self._decode(live)
            return [job.drafts if job is not None else [] for job in jobs]

    def _job(self, key, ids: list[int], k: int, busy: set) -> _Job | None:
        """Rewind `key`'s KV to what it shares with ids and say what is left to do; None for nothing."""
        if k <= 0 or not ids:  # a plain step: whatever KV the key holds stays for its next draft
            return None
        k = min(k, self.context_length - len(ids) + 1)  # the last draft is never read: ids + k - 1 positions
        if k <= 0:  # the sequence outgrew the draft's context: its KV serves no later call
            self._forget(key)
            return None
        seq = self._seqs.get(key)
        if seq is None:
            seq = self._seqs[key] = self._take_over(ids)
        self._seqs.move_to_end(key)
        keep = _common_prefix(seq.fed, ids)
        first = seq.after[keep - 1] if keep == len(ids) else None
        if keep == len(ids) and first is None:
            keep -= 1  # the token after ids is wanted: read ids' last token again
        seq.cut(keep)
        job = _Job(seq, ids[keep:], k)
        if first is not None:
            job.drafts.append(first)
        # blocks for what this call reads; idle sequences' KV goes first (least recently drafted)
        need = -(-(len(ids) + k - 1) // self.pool.block) - len(seq.cache.blocks)
        while self._promised + need > self.pool.available():
            if self._retired:
                self._retired.popitem(last=False)[1].cache.release()
                continue
            idle = next((other for other in self._seqs if other not in busy), None)
            if idle is None:
                self._forget(key)
                return None
            self._forget(idle)
        self._promised += need
        return job

    def _take_over(self, ids: list[int]) -> _Sequence:
        """A new key's sequence: the retired one sharing the longest prefix with `ids` (its KV
        cut back to that prefix by the caller), or an empty one."""
        best, shared = None, 0
        for old, seq in self._retired.items():
            n = _common_prefix(seq.fed, ids)
            if n > shared:
                best, shared = old, n
        if best is not None:
            return self._retired.pop(best)
        return _Sequence(new_sequence(self.pool, self.context_length))

    def _read_prompts(self, jobs: list[_Job]) -> None:
        """Every job's tokens to read but the last (that one is its first decode step), in passes of
        at most model.prefill_chunk rows over all sequences together, no logits made."""
        model = self.model
        queue = [job for job in jobs if len(job.todo) > 1]
        while queue:
            room = model.prefill_chunk
            groups, ids = [], []
            for job in queue:
                if room == 0:
                    break
                seq = job.seq
                n = min(len(job.todo) - 1, room)
                groups.append((seq.cache, seq.cache.length, n))
                chunk, job.todo = job.todo[:n], job.todo[n:]
                ids += chunk
                seq.fed += chunk
                seq.after += [None] * n
                room -= n
            model.forward_batch(model.embed(ids), groups, [])
            queue = [job for job in queue if len(job.todo) > 1]

    def _decode(self, jobs: list[_Job]) -> None:
        """Decode steps for every job still short of its k: each feeds its pending token (or its
        latest draft) and takes the argmax after it, all sequences in one pass per step."""
        while active := [job for job in jobs if len(job.drafts) < job.k]:
            tokens = [job.todo.pop() if job.todo else job.drafts[-1] for job in active]
            logits = decode_rows(self.model, tokens, [job.seq.cache for job in active])
            for job, token, nxt in zip(active, tokens, logits.argmax(dim=-1).tolist()):
                job.seq.fed.append(token)
                job.seq.after.append(int(nxt))
                job.drafts.append(int(nxt))

    # ------------------------------------------------------------------------------ sequences
    def forget(self, key) -> None:
        """Let go of a sequence's draft KV (its blocks go back to the pool); unknown keys are fine."""
        with self._lock:
            self._forget(key)

    def retire(self, key) -> None:
        """The sequence ended: its draft KV is kept for a later key that shares its prefix (the
        newest RETIRED_KEPT of them), and goes first when a call needs blocks; unknown keys are fine."""
        with self._lock:
            seq = self._seqs.pop(key, None)
            if seq is None or self._closed:
                return
            self._retired[object()] = seq  # a key of its own: the caller may use `key` again
            while len(self._retired) > RETIRED_KEPT:
                self._retired.popitem(last=False)[1].cache.release()

    def _forget(self, key) -> None:
        seq = self._seqs.pop(key, None)
        if seq is not None:
            seq.cache.release()

    def keys(self) -> list:
        """The live sequences holding draft KV, least recently drafted first (retired ones not named)."""
        with self._lock:
            return list(self._seqs)

    def retired(self) -> int:
        """How many ended sequences' KV is kept for a later one."""
        with self._lock:
            return len(self._retired)

    def close(self) -> None:
        """Release every sequence and the model; draft() refuses afterwards."""
        with self._lock:
            for key in list(self._seqs):
                self._forget(key)
            while self._retired:
                self._retired.popitem()[1].cache.release()
            self._closed = True
            self.model = None
            self.pool = None


__all__ = ["DraftModel", "DraftRequest"]
