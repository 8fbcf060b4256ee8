"""KV prefix reuse across turns and chats.

A `Session` remembers which prompt positions its KV cache holds, as *keys*: the token id for
text, and (token id, image sha256) inside image spans, so two different pictures of the same
size never share cache even though their [IMG] ids are equal. A new prompt keeps the longest
common prefix (never ending inside an image span, and one token short of the whole prompt so
there are logits to sample from), the cache is truncated there and only the rest is prefilled.

Chats that are not active keep their KV in host memory in a bounded LRU (`HostKVStore`) so
switching back restores instead of recomputing; an evicted chat is recomputed transparently.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

Key = Hashable


def position_keys(ids: Sequence[int], image_spans: Sequence[Any]) -> list[Key]:
    """Per-position cache keys: ids, with every position of an image span tagged by its hash."""
    keys: list[Key] = list(ids)
    for span in image_spans:
        digest = span.image.sha256
        for i in range(span.start, span.end):
            keys[i] = (ids[i], digest)
    return keys


def common_prefix(a: Sequence[Key], b: Sequence[Key]) -> int:
    """How many leading positions two key lists share."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def reusable_prefix(cached: Sequence[Key], prompt: Sequence[Key], image_spans: Sequence[Any]) -> int:
    """How many leading prompt positions can keep their cached KV."""
    n = common_prefix(cached, prompt)
    if n >= len(prompt):
        n = len(prompt) - 1  # re-run the last prompt token: its logits start the reply
    for span in image_spans:
        if span.start < n < span.end:
            n = span.start  # an image is encoded into the cache whole or not at all
    return max(n, 0)


@dataclass
class Session:
    """Which prompt positions one chat's KV holds, as position keys (the cache tensors are the
    engine's one cache while the chat is active, a `HostKVStore` snapshot while it is parked)."""

    keys: list[Key] = field(default_factory=list)

    def plan(self, prompt_keys: Sequence[Key], image_spans: Sequence[Any]) -> int:
        return reusable_prefix(self.keys, prompt_keys, image_spans)


class HostBufferPool:
    """Host buffers for parked KV, reused from one chat switch to the next: pinned memory (a GPU
    cache's) is slow to allocate and register, so a switch takes a free buffer that holds its
    bytes instead of allocating. Sizes are rounded up (powers of two to 32 MiB, then multiples of
    32 MiB) so a chat that grew a little still fits its old buffer. At most `keep_bytes` of free
    buffers are kept (the largest go first)."""

    STEP = 32 << 20

    def __init__(self, keep_bytes: int):
        self.keep = max(0, int(keep_bytes))
        self._free: list[tuple[Any, bool]] = []  # (uint8 tensor, pinned)
        self.allocations = 0  # buffers made (a test's and a profile's count)

    @classmethod
    def rounded(cls, nbytes: int) -> int:
        if nbytes >= cls.STEP:
            return -(-nbytes // cls.STEP) * cls.STEP
        size = 1 << 16
        while size < nbytes:
            size *= 2
        return size

    def take(self, nbytes: int, pinned: bool):
        """A uint8 host tensor of at least nbytes (pinned when asked): the smallest free one
        that fits, else a new one."""
        import torch

        fits = [i for i, (buf, pin) in enumerate(self._free) if pin == pinned and buf.numel() >= nbytes]
        if fits:
            best = min(fits, key=lambda i: self._free[i][0].numel())
            return self._free.pop(best)[0]
        self.allocations += 1
        return torch.empty(self.rounded(nbytes), dtype=torch.uint8, pin_memory=pinned)

    def give(self, buf, pinned: bool) -> None:
        self._free.append((buf, pinned))
        self._free.sort(key=lambda item: item[0].numel())
        self.trim(self.keep)

    def trim(self, keep: int) -> None:
        """Free buffers down to `keep` bytes, the largest going first."""
        while self._free and sum(b.numel() for b, _ in self._free) > keep:
            self._free.pop()

    @property
    def free_bytes(self) -> int:
        return sum(b.numel() for b, _ in self._free)


class HostKVStore:
    """LRU of host-memory KV snapshots, bounded in bytes. Values are (keys, snapshot, nbytes).
    Snapshots taken into `pool` buffers (KVCache.to_host(pool)) give them back when evicted,
    dropped, or restored (`recycle`)."""

    def __init__(self, budget_bytes: int):
        self.budget = max(0, int(budget_bytes))
        self._items: OrderedDict[str, tuple[list[Key], Any, int]] = OrderedDict()
        self.pool = HostBufferPool(self.budget)

    def recycle(self, snapshot: Any) -> None:
        """The snapshot's buffer back to the pool (its contents are no longer needed). Parked
        snapshots and free buffers together stay within the budget: pinned memory is RAM the
        OS cannot page out."""
        buf = getattr(snapshot, "buffer", None)
        if buf is not None:
            self.pool.give(buf, snapshot.pinned)
            snapshot.buffer = None
        self.pool.trim(max(self.budget - self.used, 0))

    @property
    def used(self) -> int:
        return sum(n for _, _, n in self._items.values())

    def put(self, name: str, keys: list[Key], snapshot: Any, nbytes: int) -> None:
        self.drop(name)
        if nbytes > self.budget:
            self.recycle(snapshot)
            return
        self._items[name] = (list(keys), snapshot, nbytes)
        while self.used > self.budget:
            self.recycle(self._items.popitem(last=False)[1][1])

    def take(self, name: str) -> tuple[list[Key], Any] | None:
        item = self._items.pop(name, None)
        return None if item is None else (item[0], item[1])

    def drop(self, name: str) -> None:
        item = self._items.pop(name, None)
        if item is not None:
            self.recycle(item[1])

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)
