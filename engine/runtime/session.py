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


@dataclass
class Span:
    start: int
    end: int  # exclusive


def position_keys(ids: Sequence[int], image_spans: Sequence[Any]) -> list[Key]:
    """Per-position cache keys: ids, with every position of an image span tagged by its hash."""
    keys: list[Key] = list(ids)
    for span in image_spans:
        digest = span.image.sha256
        for i in range(span.start, span.end):
            keys[i] = (ids[i], digest)
    return keys


def reusable_prefix(cached: Sequence[Key], prompt: Sequence[Key], image_spans: Sequence[Any]) -> int:
    """How many leading prompt positions can keep their cached KV."""
    n = 0
    limit = min(len(cached), len(prompt))
    while n < limit and cached[n] == prompt[n]:
        n += 1
    if n >= len(prompt):
        n = len(prompt) - 1  # re-run the last prompt token: its logits start the reply
    for span in image_spans:
        if span.start < n < span.end:
            n = span.start  # an image is encoded into the cache whole or not at all
    return max(n, 0)


@dataclass
class Session:
    """What one chat's KV cache holds: position keys, and the cache object when resident."""

    keys: list[Key] = field(default_factory=list)

    def plan(self, prompt_keys: Sequence[Key], image_spans: Sequence[Any]) -> int:
        return reusable_prefix(self.keys, prompt_keys, image_spans)


class HostKVStore:
    """LRU of host-memory KV snapshots, bounded in bytes. Values are (keys, snapshot, nbytes)."""

    def __init__(self, budget_bytes: int):
        self.budget = max(0, int(budget_bytes))
        self._items: OrderedDict[str, tuple[list[Key], Any, int]] = OrderedDict()

    @property
    def used(self) -> int:
        return sum(n for _, _, n in self._items.values())

    def put(self, name: str, keys: list[Key], snapshot: Any, nbytes: int) -> None:
        self._items.pop(name, None)
        if nbytes > self.budget:
            return
        self._items[name] = (list(keys), snapshot, nbytes)
        while self.used > self.budget:
            self._items.popitem(last=False)

    def take(self, name: str) -> tuple[list[Key], Any] | None:
        item = self._items.pop(name, None)
        return None if item is None else (item[0], item[1])

    def drop(self, name: str) -> None:
        self._items.pop(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)
