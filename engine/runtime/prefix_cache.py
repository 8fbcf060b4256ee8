"""The tier of KV blocks below the pool, and the replies the engine generated.

Positions are cut into fixed-size blocks; a block is addressed by a chained hash of its keys
(token ids; inside an image span the image's content hash too, see prefix_keys.position_keys) and
of every block before it, so equal hashes mean equal prefixes. The KV pool (runtime/kv_cache.py)
is the first tier: its published blocks are shared by every sequence with that prefix. A block
the pool must reuse while its content is known is spilled here (`put`): host copies in an LRU
bounded in bytes, and with a `PrefixDisk` (runtime/prefix_disk.py) behind it, a file; every block
the scheduler publishes is also queued for its file (`persist`), so a chat is found again after a
restart. `get` reads a block back (memory, then its file, checked) for the pool.

`ReplyMemory` keeps the exact token ids of replies the engine generated, and
`encode_reusing_replies` puts them back when a client resends the reply as text, so the next
turn's prompt is token for token what the cache holds (no re-tokenization drift).
"""
from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from typing import Callable, Sequence

import torch

from ..api import ChatMessage
from ..mistral3.chat_format import EncodedPrompt, ImageSpan, encode_chat
from .kv_cache import BLOCK_TOKENS
from .prefix_keys import Key


def _block_bytes(keys: Sequence[Key]) -> bytes:
    ids = array("q", (k if isinstance(k, int) else k[0] for k in keys)).tobytes()
    images = b"".join(i.to_bytes(4, "little") + k[1].encode("ascii")
                      for i, k in enumerate(keys) if not isinstance(k, int))
    return ids + b"|" + images


def block_hashes(keys: Sequence[Key], block: int = BLOCK_TOKENS, known: Sequence[bytes] = ()) -> list[bytes]:
    """hashes[i] names keys[:(i + 1) * block] (full blocks only). `known`: the hashes of a
    prefix of keys already named (the chain goes on from them, not from the start)."""
    out = list(known)
    parent = out[-1] if out else b""
    for lo in range(len(out) * block, len(keys) - block + 1, block):
        parent = hashlib.blake2b(parent + _block_bytes(keys[lo:lo + block]), digest_size=16).digest()
        out.append(parent)
    return out


def tail_hash(hashes: Sequence[bytes], keys: Sequence[Key], block: int = BLOCK_TOKENS) -> bytes | None:
    """The name of the partly filled block after the full ones that `hashes` name: keys past
    len(hashes) * block (fewer than a block), None when there are none. A chat that ended keeps
    its last block by this name, so its next turn reuses every position, not just whole blocks;
    distinct from any full block's name (a marker byte, and a tail has fewer keys)."""
    lo = len(hashes) * block
    if not 0 < len(keys) - lo < block:
        return None
    parent = hashes[-1] if hashes else b""
    return hashlib.blake2b(parent + b"tail" + _block_bytes(keys[lo:]), digest_size=16).digest()


def prefix_names(hashes: Sequence[bytes], keys: Sequence[Key], block: int = BLOCK_TOKENS,
                 first: int = 0) -> list[tuple[int, bytes]]:
    """(block index, tail_hash name) of every proper leading part of each block of `keys` from
    block `first` on, longest first: what a sequence that ended names its blocks by, so that a
    prompt agreeing with it up to any position reuses every position up to there (a regenerate,
    an edit in the middle, the next turn)."""
    out = []
    for i in range(first, -(-len(keys) // block)):
        parent = hashes[i - 1] if i else b""
        lo = i * block
        for end in range(min(len(keys), lo + block - 1), lo, -1):
            out.append((i, hashlib.blake2b(parent + b"tail" + _block_bytes(keys[lo:end]), digest_size=16).digest()))
    return out


class PrefixCache:
    """Blocks of KV (host copies, one (layers, kv_heads, block, d) pair per pool part) by hash,
    in memory up to `budget_bytes`, and in files when a `disk` tier is given."""

    def __init__(self, budget_bytes: int, block: int = BLOCK_TOKENS, disk=None):
        self.budget = max(0, int(budget_bytes))
        self.block = block
        self.used = 0
        self.disk = disk  # a PrefixDisk, or None
        self.lock = threading.RLock()
        self._blocks: OrderedDict[bytes, tuple[list[torch.Tensor], list[torch.Tensor], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._blocks

    def get(self, digest: bytes) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """The block's K and V parts (now the most recently used), from memory or its file."""
        with self.lock:
            item = self._blocks.get(digest)
            if item is not None:
                self._blocks.move_to_end(digest)
                return item[0], item[1]
        if self.disk is not None:
            return self.disk.get(digest)
        return None

    def put(self, digest: bytes, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Keep a block (host copies the caller will not change) in memory, evicting the least
        recently used beyond the budget, and in its file."""
        nbytes = sum(t.numel() * t.element_size() for t in ks + vs)
        with self.lock:
            if digest not in self._blocks and nbytes <= self.budget:
                self._blocks[digest] = (ks, vs, nbytes)
                self.used += nbytes
                while self.used > self.budget:
                    _, (_, _, n) = self._blocks.popitem(last=False)
                    self.used -= n
        self.persist(digest, ks, vs)

    def persist(self, digest: bytes, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Queue the block for its file (the writer thread reads these copies, never changed)."""
        if self.disk is not None and digest not in self.disk:
            self.disk.put(digest, ks, vs)

    def forget(self, hashes: Sequence[bytes]) -> None:
        """Drop these blocks from memory and from the disk tier (a deleted chat's)."""
        with self.lock:
            for digest in hashes:
                item = self._blocks.pop(digest, None)
                if item is not None:
                    self.used -= item[2]
        if self.disk is not None:
            self.disk.delete(hashes)

    def clear(self) -> None:
        """Forget every block held in memory (the disk tier keeps its files)."""
        with self.lock:
            self._blocks.clear()
            self.used = 0

    def close(self) -> None:
        """Write every block held in memory that the disk tier lacks (those the writer was too far
        behind to take when they were stored, too), then stop its writer."""
        if self.disk is None:
            return
        with self.lock:
            missing = [(digest, ks, vs) for digest, (ks, vs, _) in self._blocks.items() if digest not in self.disk]
        for digest, ks, vs in missing:
            if not self.disk.put(digest, ks, vs):
                self.disk.flush()  # the writer's queue is full: wait for it here, not in a reply
                self.disk.put(digest, ks, vs)
        self.disk.close()


class ReplyMemory:
    """Replies the engine generated: their text -> the exact token ids it sampled (bounded LRU).
    With a `disk` (PrefixDisk) they are kept there too and found again after a restart; `check`
    (text, ids) -> bool vets what comes back from disk (the engine's: the ids decode to the text)."""

    def __init__(self, capacity: int = 256, disk=None, check=None):
        self.capacity = capacity
        self.disk = disk
        self.check = check
        self._ids: OrderedDict[str, list[int]] = OrderedDict()

    def remember(self, text: str, ids: Sequence[int]) -> None:
        if not text or not ids:
            return
        self._keep(text, list(ids))
        if self.disk is not None:
            self.disk.put_reply(text, self._ids[text])

    def remember_reply(self, text: str, ids: Sequence[int], finish_reason: str,
                       decode: Callable[[list[int]], str]) -> None:
        """A reply that just ended: keep its sampled ids only if it ran to its end ("stop" or
        "length") and they decode to exactly its text (a stop string cuts the text short of its
        ids): ids put back for a text must be that text, or the next prompt says something else."""
        if self.capacity > 0 and finish_reason in ("stop", "length") and ids and decode(list(ids)) == text:
            self.remember(text, ids)

    def forget(self, texts: Sequence[str]) -> None:
        """Drop these replies, in memory and on disk (a deleted chat's)."""
        for text in texts:
            self._ids.pop(text, None)
        if self.disk is not None:
            self.disk.delete(reply_texts=texts)

    def _keep(self, text: str, ids: list[int]) -> None:
        self._ids[text] = ids
        self._ids.move_to_end(text)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def get(self, text: str) -> list[int] | None:
        ids = self._ids.get(text)
        if ids is not None:
            self._ids.move_to_end(text)
        elif self.disk is not None and text:
            ids = self.disk.get_reply(text)
            if ids is not None and (self.check is None or self.check(text, ids)):
                self._keep(text, ids)
            else:
                ids = None
        return ids


def encode_reusing_replies(tokenizer, messages: list[ChatMessage], image_grid, replies: ReplyMemory) -> EncodedPrompt:
    """encode_chat, except that an assistant message the engine generated (a lone assistant
    message whose text is a remembered reply) gets the ids that were sampled, not a
    re-tokenization of its text. The v7 format encodes messages in order with no look-ahead
    beyond merging neighbours of one role (without tools), so the pieces between such replies
    encode apart."""
    if any(m.role == "tool" or getattr(m, "tool_calls", None) for m in messages):
        return encode_chat(tokenizer, messages, image_grid)  # tool turns look ahead: encoded whole
    cuts = [i for i, m in enumerate(messages)
            if m.role == "assistant" and not m.images and replies.get(m.text_content) is not None
            and (i == 0 or messages[i - 1].role != "assistant")
            and (i + 1 == len(messages) or messages[i + 1].role != "assistant")]
    if not cuts:
        return encode_chat(tokenizer, messages, image_grid)
    ids: list[int] = []
    spans: list[ImageSpan] = []
    lo = 0
    for cut in cuts + [len(messages)]:
        part = messages[lo:cut]
        if part:
            enc = encode_chat(tokenizer, part, image_grid)
            skip = 1 if ids else 0  # the BOS of every piece after the first
            base = len(ids) - skip
            ids += enc.ids[skip:]
            spans += [ImageSpan(s.start + base, s.end + base, s.image, s.rows, s.cols) for s in enc.image_spans]
        elif not ids:
            ids.append(tokenizer.bos_id)
        if cut < len(messages):
            ids += replies.get(messages[cut].text_content) + [tokenizer.eos_id]
        lo = cut + 1
    return EncodedPrompt(ids, spans)
