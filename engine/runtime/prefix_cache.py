"""A KV prefix cache shared by every conversation, and the replies the engine generated.

Positions are cut into fixed-size blocks; a block is addressed by a chained hash of its keys
(token ids; inside an image span the image's content hash too, see session.position_keys) and
of every block before it, so equal hashes mean equal prefixes. A new sequence copies the longest
run of known blocks into its KV cache and prefills only the rest: a second conversation with a
known system prompt starts with those tokens cached. Blocks are host-memory copies in an LRU
bounded in bytes (a block whose parent was evicted is never matched: lookups stop at the first
miss). With a `PrefixDisk` (runtime/prefix_disk.py) behind it, every block stored is also
written to a file, and a block missing from memory is read back from its file (checked) when a
lookup reaches it: that is how a chat is reused after a restart. One engine's LocalEngine and its
BatchScheduler share one PrefixCache (one memory bound); `lock` makes each call, and a caller's
match-then-load, safe between their threads.

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
from .prefix_keys import Key

BLOCK_TOKENS = 32


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


class PrefixCache:
    """Blocks of KV (host copies, one (layers, kv_heads, block, d) pair per cache part) by hash,
    in memory, and in files when a `disk` tier is given."""

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

    def match(self, hashes: Sequence[bytes], start: int = 0) -> int:
        """How many leading blocks are held (each one found becomes the most recently used);
        blocks missing from memory are read from the disk tier. `start`: the caller already
        holds blocks [0, start) (they are counted, not looked up)."""
        with self.lock:
            n, chain = start, 0
            for digest in hashes[start:]:
                item = self._blocks.get(digest)
                if item is None and self.disk is not None:
                    item = self._from_disk(digest, chain)
                if item is None:
                    break
                self._blocks.move_to_end(digest)
                chain += item[2]
                n += 1
            return n

    def _from_disk(self, digest: bytes, chain: int):
        """The block from its file into memory, unless that would evict blocks of the run being
        matched (`chain` bytes of it so far, all more recent than anything else)."""
        got = self.disk.get(digest)
        if got is None:
            return None
        ks, vs = got
        nbytes = sum(t.numel() * t.element_size() for t in ks + vs)
        if chain + nbytes > self.budget:
            return None
        self._insert(digest, ks, vs, nbytes)
        return self._blocks[digest]

    def _insert(self, digest: bytes, ks: list[torch.Tensor], vs: list[torch.Tensor], nbytes: int) -> None:
        self._blocks[digest] = (ks, vs, nbytes)
        self.used += nbytes
        while self.used > self.budget:
            _, (_, _, n) = self._blocks.popitem(last=False)
            self.used -= n

    def load(self, hashes: Sequence[bytes], cache, first: int = 0) -> None:
        """Copy blocks [first, len(hashes)) into `cache` at their positions; the cache must hold
        at least first * block positions. Afterwards it holds len(hashes) * block."""
        b = self.block
        if cache.length < first * b:
            raise ValueError(f"loading from block {first} into a cache of {cache.length} positions")
        with self.lock:
            for i in range(first, len(hashes)):
                ks, vs, _ = self._blocks[hashes[i]]
                for dst_k, dst_v, k, v in zip(cache.ks, cache.vs, ks, vs):
                    dst_k[:, :, i * b:(i + 1) * b].copy_(k)
                    dst_v[:, :, i * b:(i + 1) * b].copy_(v)
        cache.length = max(first * b, len(hashes) * b)

    def store(self, hashes: Sequence[bytes], cache) -> int:
        """Copy the cache's full blocks not yet held (only those its positions cover), and queue
        each for the disk tier; returns how many were added to memory."""
        if self.budget == 0:
            return 0
        b, added = self.block, 0
        with self.lock:
            for i, digest in enumerate(hashes):
                if (i + 1) * b > cache.length:
                    break
                item = self._blocks.get(digest)
                if item is None:
                    ks = [k[:, :, i * b:(i + 1) * b].to("cpu", copy=True) for k in cache.ks]
                    vs = [v[:, :, i * b:(i + 1) * b].to("cpu", copy=True) for v in cache.vs]
                    nbytes = sum(t.numel() * t.element_size() for t in ks + vs)
                    if nbytes > self.budget:
                        return added
                    self._insert(digest, ks, vs, nbytes)
                    item = (ks, vs, nbytes)
                    added += 1
                else:
                    self._blocks.move_to_end(digest)
                if self.disk is not None and digest not in self.disk:
                    self.disk.put(digest, item[0], item[1])  # the writer thread reads these copies, never changed
        return added

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
