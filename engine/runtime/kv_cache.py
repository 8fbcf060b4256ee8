"""Paged KV: fixed-size blocks of keys/values in one pool per model (`KVPool`), and the KV of one
sequence as a table of those blocks (`KVCache`), as vLLM's block manager keeps them.

Every sequence reads and writes its K/V through its block table (the attention kernels take the
pool and the table: no copy into a contiguous cache). A full block whose content is known (named
by the chained hash of the positions it ends: runtime/prefix_cache.block_hashes) is published in
the pool; a new sequence with the same prefix takes those very blocks (reference-counted), so a
system prompt shared by 32 conversations is stored once. A block is written only while it is
private and unpublished: a sequence that would write into a shared or published block gets a
copy first (copy-on-write). A block nobody references stays in the pool with its content (a
chat that left keeps its KV) until a block is needed and none is free: then the least recently
used such block is handed to the `spill` tier (runtime/prefix_cache.PrefixCache: host memory
and the disk) and reused.
"""
from __future__ import annotations

import math
import mmap
import threading
from collections import OrderedDict
from typing import Callable, Sequence

import torch

from ..api import EngineError
from ..mistral3.text import gather_positions

BLOCK_TOKENS = 32  # positions per block: the prefix cache's hash unit too


class KVPoolFull(EngineError):
    """No block is free and none can be evicted (every block is held by a running sequence)."""


def _untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros; on the CPU from an anonymous mapping, whose pages the OS zero-fills on first write,
    so a pool becomes resident as its blocks are written (8192 positions of the 1.1B bench
    model: 0.5 GB that torch.zeros would commit up front by writing every byte)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    if hasattr(mmap, "MAP_PRIVATE"):  # private: reading an unwritten page commits nothing either
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # Windows: pagefile-backed, committed page by page as it is touched
        buf = mmap.mmap(-1, nbytes)
    return torch.frombuffer(buf, dtype=dtype).view(shape)  # the tensor keeps the map


class KVPool:
    """`n_blocks` blocks of `block` positions for every layer: per segment of the model
    (`parts`: (layers, dtype, device) in layer order) a pair of tensors (layers, n_blocks,
    kv_heads, block, d); `layer_k[i]` / `layer_v[i]` are layer i's pools (n_blocks, kv_heads,
    block, d), what the paged kernels take. Zero-initialised so unwritten rows are finite."""

    def __init__(self, n_kv_heads: int, head_dim: int, v_head_dim: int, n_blocks: int,
                 parts: Sequence[tuple[int, torch.dtype, torch.device]], block: int = BLOCK_TOKENS):
        if n_blocks <= 0 or block <= 0:
            raise EngineError(f"a KV pool needs blocks: got {n_blocks} of {block} positions")
        self.block = block
        self.n_blocks = n_blocks
        # one block more, never handed out: where a CUDA graph bucket's padding rows write their K/V
        self.scratch = n_blocks
        self.ks = [_untouched_zeros((n, n_blocks + 1, n_kv_heads, block, head_dim), dt, dev) for n, dt, dev in parts]
        self.vs = [_untouched_zeros((n, n_blocks + 1, n_kv_heads, block, v_head_dim), dt, dev) for n, dt, dev in parts]
        self.layer_k = [layer for k in self.ks for layer in k]
        self.layer_v = [layer for v in self.vs for layer in v]
        self.lock = threading.RLock()  # the scheduler's thread and the engine's callers (forget)
        self.refs = [0] * n_blocks
        self._free = list(range(n_blocks - 1, -1, -1))  # popped from the end: low ids first
        self._known: OrderedDict[bytes, int] = OrderedDict()  # names of published blocks, least recently used first
        self._names: dict[int, list[bytes]] = {}  # a block's names: its own (the first), then its prefixes
        # (digest, ks, vs) of an unreferenced published block about to be reused: the next tier
        self.spill: Callable[[bytes, list[torch.Tensor], list[torch.Tensor]], None] | None = None
        self.native_steps: dict = {}  # the native whole-step decode over these tensors, per segment
        self.decode_graphs = None  # CUDA graphs bound to these tensors (runtime.decoder.new_pool)

    # -- facts ----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.ks[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.ks[0].dtype

    @property
    def positions(self) -> int:
        return self.n_blocks * self.block

    @property
    def block_bytes(self) -> int:
        return sum(t[:, 0].numel() * t.element_size() for t in self.ks + self.vs)

    @property
    def nbytes(self) -> int:
        return self.block_bytes * self.n_blocks

    def available(self) -> int:
        """Blocks a sequence could get now: free ones and unreferenced published ones."""
        with self.lock:
            return len(self._free) + sum(1 for b in self._known.values() if self.refs[b] == 0)

    def named(self) -> int:
        """Blocks whose content is known by name (held or kept for a later prompt)."""
        with self.lock:
            return len(self._names)

    def in_use(self) -> int:
        """Blocks some sequence references."""
        with self.lock:
            return sum(1 for r in self.refs if r)

    # -- blocks ---------------------------------------------------------------------------------
    def take(self) -> int:
        """A private block (reference count 1): a free one, else the least recently used
        unreferenced published block (spilled to the next tier first). KVPoolFull otherwise."""
        with self.lock:
            if self._free:
                b = self._free.pop()
            else:
                victim = next(((d, b) for d, b in self._known.items() if self.refs[b] == 0), None)
                if victim is None:
                    raise KVPoolFull(f"the KV pool's {self.n_blocks} blocks of {self.block} positions are all "
                                     f"held by running sequences")
                _, b = victim
                names = self._names.pop(b)
                if self.spill is not None:  # under its own name (the longest): what the tier below keeps
                    ks, vs = self.read_block(b)
                    self.spill(names[0], ks, vs)
                for name in names:
                    del self._known[name]
            self.refs[b] = 1
            return b

    def share(self, b: int) -> None:
        with self.lock:
            self.refs[b] += 1
            for name in self._names.get(b, ()):
                self._known.move_to_end(name)

    def drop(self, b: int) -> None:
        """One reference fewer; a block nobody holds is free again unless its content is known."""
        with self.lock:
            self.refs[b] -= 1
            if self.refs[b] < 0:
                raise RuntimeError(f"KV block {b} released more often than taken")
            if self.refs[b] == 0 and b not in self._names:
                self._free.append(b)

    def writable(self, b: int) -> bool:
        """Whether a sequence holding b may write into it (nobody else holds it, nothing names it)."""
        return self.refs[b] == 1 and b not in self._names

    def publish(self, digest: bytes, b: int) -> None:
        """Name a block by the hash of its content (and of every position before it); a block of
        the same name already there wins. A block may have several names: its own first, then
        those of its leading positions (prefix_cache.tail_hash), so a prompt that agrees with
        it only part way still reuses those positions. Named, it is never written again."""
        with self.lock:
            if digest in self._known:
                return
            self._known[digest] = b
            self._names.setdefault(b, []).append(digest)

    def find(self, digest: bytes) -> int | None:
        """The published block of that name (now the most recently used), or None."""
        with self.lock:
            b = self._known.get(digest)
            if b is not None:
                self._known.move_to_end(digest)
            return b

    def holds(self, digest: bytes) -> bool:
        """Whether a block of that name is in the pool (a question: no use recorded)."""
        return digest in self._known

    def names_of(self, b: int) -> tuple[bytes, ...]:
        return tuple(self._names.get(b, ()))

    def digest_of(self, b: int) -> bytes | None:
        """The block's own name (None: unnamed)."""
        names = self._names.get(b)
        return names[0] if names else None

    def forget(self, digests: Sequence[bytes]) -> None:
        """Unname these blocks (a deleted chat's); the ones nobody holds are free again."""
        with self.lock:
            for digest in digests:
                b = self._known.pop(digest, None)
                if b is not None:
                    names = self._names[b]
                    names.remove(digest)
                    if not names:
                        del self._names[b]
                        if self.refs[b] == 0:
                            self._free.append(b)

    def forget_all(self) -> None:
        self.forget(list(self._known))

    def read_block(self, b: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Host copies of block b: one (layers, kv_heads, block, d) pair per part."""
        return ([k[:, b].to("cpu", copy=True) for k in self.ks], [v[:, b].to("cpu", copy=True) for v in self.vs])

    def write_block(self, b: int, ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor]) -> None:
        for dst, src in zip(self.ks + self.vs, list(ks) + list(vs)):
            dst[:, b].copy_(src)

    def copy_block(self, src: int, dst: int) -> None:
        for t in self.ks + self.vs:
            t[:, dst].copy_(t[:, src])


class KVCache:
    """One sequence's KV: a block table into `pool` and how many positions are valid.

    Positions [0, length) are valid; position p is row p % block of block `blocks[p // block]`.
    `reserve(n)` makes the next n positions writable (new blocks, or a copy of a shared one);
    `truncate` forgets positions (and lets go of the blocks past them); `release` lets go of all.
    `capacity` bounds the sequence (the context length), the pool bounds all of them."""

    def __init__(self, pool: KVPool, capacity: int):
        if capacity <= 0:
            raise EngineError(f"context length must be positive, got {capacity}")
        self.pool = pool
        self.capacity = int(capacity)
        self.block = pool.block
        self.blocks: list[int] = []
        self.length = 0
        self.layer_k = pool.layer_k  # the layers read the pools through `table`
        self.layer_v = pool.layer_v
        self._tables: dict[torch.device, torch.Tensor] = {}

    # KVRows: the native decode steps and graphs are the pool's (they bind its tensors)
    @property
    def native_steps(self) -> dict:
        return self.pool.native_steps

    @property
    def scratch_block(self) -> int:
        """The pool's block no sequence holds (padding rows of a graph bucket write there)."""
        return self.pool.scratch

    @property
    def decode_graphs(self):
        return self.pool.decode_graphs

    @decode_graphs.setter
    def decode_graphs(self, graphs) -> None:  # None: this pool's sequences decode eagerly (benchmarks)
        self.pool.decode_graphs = graphs

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks this sequence holds (shared ones counted here too)."""
        return len(self.blocks) * self.pool.block_bytes

    def table(self, device: torch.device) -> torch.Tensor:
        """The block table as int32 on `device` (made once per change of the table)."""
        device = torch.device(device)
        t = self._tables.get(device)
        if t is None:
            t = torch.tensor(self.blocks or [0], dtype=torch.int32).to(device)
            self._tables[device] = t
        return t

    def _changed(self) -> None:
        self._tables.clear()

    def reserve(self, n: int) -> None:
        """Blocks for positions [length, length + n), each private: a shared or published block
        that would be written is replaced by a copy. KVPoolFull when the pool has too few
        (what was taken here stays with the sequence, released with it)."""
        if self.length + n > self.capacity:
            raise EngineError(f"context full: {self.length} + {n} tokens exceed the context length {self.capacity}")
        b = self.block
        pool = self.pool
        with pool.lock:
            if self.length % b and not pool.writable(self.blocks[self.length // b]):
                i = self.length // b
                fresh = pool.take()
                pool.copy_block(self.blocks[i], fresh)
                pool.drop(self.blocks[i])
                self.blocks[i] = fresh
                self._changed()
            need = -(-(self.length + n) // b)
            while len(self.blocks) < need:
                self.blocks.append(pool.take())
                self._changed()

    def adopt(self, blocks: Sequence[int], n: int) -> None:
        """Start from these blocks (each already counted for this sequence by the caller) holding
        n valid positions (the last block may be used in part: written, it is copied first)."""
        if self.blocks:
            raise EngineError("adopting blocks into a KV cache that holds some")
        if n > len(blocks) * self.block:
            raise EngineError(f"{n} positions in {len(blocks)} blocks of {self.block}")
        self.blocks = list(blocks)
        self.length = n
        self._changed()

    def truncate(self, n: int) -> None:
        """Forget every position from n on (n <= length); blocks past them go back to the pool."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a KV cache of length {self.length} to {n}")
        keep = -(-n // self.block)
        if keep < len(self.blocks):
            for blk in self.blocks[keep:]:
                self.pool.drop(blk)
            del self.blocks[keep:]
            self._changed()
        self.length = n

    def reset(self) -> None:
        self.truncate(0)

    release = reset

    def publish(self, hashes: Sequence[bytes]) -> None:
        """Name the full blocks this sequence wrote: hashes[i] names positions [0, (i + 1) * block).
        A block whose name another block already has is swapped for that one (one copy kept)."""
        pool, b = self.pool, self.block
        with pool.lock:
            for i, digest in enumerate(hashes[:self.length // b]):
                mine = self.blocks[i]
                if digest in pool.names_of(mine):
                    continue
                other = pool.find(digest)
                if other is None:
                    if pool.digest_of(mine) is None:
                        pool.publish(digest, mine)
                elif other != mine:
                    pool.share(other)
                    pool.drop(mine)
                    self.blocks[i] = other
                    self._changed()

    def publish_prefixes(self, names: Sequence[tuple[int, bytes]]) -> None:
        """Name blocks by their leading positions ((block index, name), prefix_cache.prefix_names),
        the last partly filled block's included: named, a block is not written again (a later
        write copies it first)."""
        for i, digest in names:
            if i < len(self.blocks):
                self.pool.publish(digest, self.blocks[i])

    def read_positions(self, layer: int, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K and V of positions [0, n) as contiguous (kv_heads, n, d) copies (tests,
        and torch's attention where no paged kernel runs)."""
        n = self.length if n is None else n
        return (gather_positions(self.layer_k[layer], self.table(self.layer_k[layer].device), n, self.block),
                gather_positions(self.layer_v[layer], self.table(self.layer_v[layer].device), n, self.block))


def new_sequence(pool: KVPool, capacity: int | None = None) -> KVCache:
    """An empty sequence over `pool`, of at most `capacity` positions (default: the whole pool)."""
    return KVCache(pool, pool.positions if capacity is None else capacity)
