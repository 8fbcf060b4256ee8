"""The keys of a KV cache's positions, and how much of a cached prefix a new prompt may reuse.

Which prompt positions a KV cache holds is remembered as *keys*: the token id for text, and
(token id, image sha256) inside image spans, so two different pictures of the same size never
share cache even though their [IMG] ids are equal. A new prompt keeps the longest
common prefix (never ending inside an image span, and one token short of the whole prompt so
there are logits to sample from), the cache is truncated there and only the rest is prefilled.

A chat that is not in a slot keeps its KV as the prefix cache's blocks (runtime/prefix_cache.py):
the scheduler's one reuse rule takes the longer of a slot's own prefix and a run of those blocks.
"""
from __future__ import annotations

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
