"""The prefix cache's disk tier: KV blocks of recent chats kept in files, so that reopening a
chat after a restart copies its blocks instead of reading the prompt again.

One file per block (`<name>.kv`, the name a hash of the model's identity and the block's
chained hash, so models sharing a tokenizer never collide): a fixed magic, a JSON header (the
model's identity, the block hash, each tensor's dtype and shape, the payload's size and its
BLAKE2b checksum), then the raw K and V bytes. A file is trusted only when every one of those
matches what this engine expects; anything else (truncated, flipped bytes, another model, another
layout) is logged, deleted and read as a miss. Files are written by one background thread
(never on the decode path) to a temporary name and renamed into place, 0600 in a 0700 folder.
The folder is bounded in bytes: the least recently used files go first.

Replies the engine generated keep their sampled ids there too (`<name>.ids`: the model's identity,
a hash of the reply's text, the ids), so a chat reopened after a restart gets its replies' exact
ids back and matches the blocks past them; the caller checks that the ids decode to the text.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import torch

from ..api import EngineError
from ..private_files import create_private_file, make_private_dir

log = logging.getLogger(__name__)

MAGIC = b"TRAMKV01"
REPLY_MAGIC = b"TRAMID01"
SUFFIX = ".kv"
REPLY_SUFFIX = ".ids"
MAX_REPLY_FILE_BYTES = 4 << 20
DEFAULT_DISK_BYTES = 4 << 30
MAX_HEADER_BYTES = 1 << 16
PAYLOAD_ALIGN = 64
PENDING_BYTES = 256 << 20  # blocks queued for the writer at most; more are not written (kept in memory only)
OWN_FILE = re.compile(r"[0-9a-f]{40}\.(kv|ids)")  # only these are ever counted, read or evicted
PARTIAL_FILE = re.compile(r"\.[0-9a-f]{40}\.(kv|ids)\.[0-9]+\.tmp")  # a write cut short by a crash
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (dtype name, shape) of each tensor of a block: every K part, then every V part
Layout = list[tuple[str, tuple[int, ...]]]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def block_layout(pool) -> Layout:
    """What one block of a KV pool looks like on disk: its K parts then its V parts, each
    (layers, kv_heads, block, d)."""
    return [(dtype_name(t.dtype), (t.shape[0], t.shape[2], t.shape[3], t.shape[4])) for t in list(pool.ks) + list(pool.vs)]


def file_identity(path: str | Path, head_bytes: int, tail_bytes: int = 1 << 20) -> bytes:
    """A digest of a model file that changes when the file does: its size, its first
    `head_bytes` (the GGUF header: metadata and tensor table) and its last `tail_bytes` (weights)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        h.update(size.to_bytes(8, "little"))
        h.update(fh.read(head_bytes))
        fh.seek(max(size - tail_bytes, 0))
        h.update(fh.read(tail_bytes))
    return h.digest()


def model_identity(model_path: str | Path, data_offset: int, projector_path: str | Path | None) -> str:
    """Whose KV a block is: the model file (header and tensor table whole, a MiB of its weights, its
    size) and the projector, whose features are in the KV of every image position."""
    h = hashlib.blake2b(file_identity(model_path, data_offset + (1 << 20)), digest_size=16)
    if projector_path is not None:
        h.update(file_identity(projector_path, 4 << 20))
    return h.hexdigest()


def usable_folder(folder: str | Path) -> Path:
    """The folder, made if missing (0700; one the user picked keeps its mode, the files are 0600),
    or one EngineError saying why it cannot hold the KV cache."""
    try:
        path = make_private_dir(folder, tighten_existing=False)
        if not path.is_dir():
            raise NotADirectoryError("not a folder")
    except OSError as exc:
        raise EngineError(f"{folder}: cannot keep the KV cache there: {exc.strerror or exc}") from None
    return path


class PrefixDisk:
    """KV blocks in files (see the module's docstring). `get` on the caller's thread, `put` queues
    the write for the writer thread; `flush` waits for what is queued, `close` stops the thread."""

    def __init__(self, folder: str | Path, model_id: str, layout: Layout, budget_bytes: int = DEFAULT_DISK_BYTES):
        self.folder = usable_folder(folder)
        self.model_id = model_id
        self.layout = [(name, tuple(int(d) for d in shape)) for name, shape in layout]
        self.budget = max(0, int(budget_bytes))
        self.payload_bytes = sum(_numel(shape) * DTYPES[name].itemsize for name, shape in self.layout)
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()  # file name -> bytes, least recently used first
        self._pending: set[str] = set()
        self._pending_bytes = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._scan()

    # -- the folder ----------------------------------------------------------------------------
    def _scan(self) -> None:
        found = []
        for entry in os.scandir(self.folder):
            if PARTIAL_FILE.fullmatch(entry.name):
                _unlink(entry.path)
            elif OWN_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                found.append((st.st_mtime, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._files[name] = size
        self._evict()

    @property
    def used(self) -> int:
        with self._lock:
            return sum(self._files.values())

    def name_of(self, digest: bytes) -> str:
        return hashlib.blake2b(self.model_id.encode("ascii") + digest, digest_size=20).hexdigest() + SUFFIX

    def reply_name_of(self, text: str) -> str:
        key = self.model_id.encode("ascii") + b"\0reply\0" + text.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(key, digest_size=20).hexdigest() + REPLY_SUFFIX

    def __contains__(self, digest: bytes) -> bool:
        name = self.name_of(digest)
        with self._lock:
            return name in self._files or name in self._pending

    def _evict(self) -> None:
        with self._lock:
            total = sum(self._files.values())
            gone = []
            while total > self.budget and self._files:
                name, size = self._files.popitem(last=False)
                total -= size
                gone.append(name)
        for name in gone:
            _unlink(self.folder / name)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._files.pop(name, None)

    # -- reading -------------------------------------------------------------------------------
    def get(self, digest: bytes) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """The block's K parts and V parts, or None: not on disk, or a file that failed a check
        (logged and deleted)."""
        tensors = self._read(self.name_of(digest), len(MAGIC) + 4 + MAX_HEADER_BYTES + self.payload_bytes,
                             lambda data: self._parse(data, digest))
        if tensors is None:
            return None
        n = len(tensors) // 2
        return tensors[:n], tensors[n:]

    def get_reply(self, text: str) -> list[int] | None:
        """The ids a reply with this text was sampled as, or None (the caller checks they decode
        to the text)."""
        return self._read(self.reply_name_of(text), MAX_REPLY_FILE_BYTES, lambda data: self._parse_reply(data, text))

    def _read(self, name: str, bound: int, parse):
        """parse(the file's bytes) for one of our files, or None: not there, or it failed a check
        (logged and deleted)."""
        with self._lock:
            if name not in self._files:
                return None
        path = self.folder / name
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                data = bytearray(min(size, bound + 1))  # never more than such a file holds
                data = data[:fh.readinto(data)]
        except OSError:
            self._forget(name)  # gone meanwhile (another process's eviction)
            return None
        try:
            value = parse(data)
        except ValueError as exc:
            log.warning("%s: KV cache file dropped: %s", path, exc)
            self._forget(name)
            _unlink(path)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        with self._lock:
            if name in self._files:
                self._files.move_to_end(name)
        return value

    def _parse_reply(self, data: bytearray, text: str) -> list[int]:
        if data[:len(REPLY_MAGIC)] != REPLY_MAGIC:
            raise ValueError("not a reply ids file (bad magic)")
        try:
            record = json.loads(bytes(data[len(REPLY_MAGIC):]))
            model, text_hash, ids = record["model"], record["text"], record["ids"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable ({exc})") from None
        if model != self.model_id:
            raise ValueError(f"written for another model ({model}, this one is {self.model_id})")
        if text_hash != _text_hash(text):
            raise ValueError("holds another reply's ids")
        if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < 1 << 31 for t in ids):
            raise ValueError("the ids are not a list of token ids")
        return ids

    def _parse(self, data: bytearray, digest: bytes) -> list[torch.Tensor]:
        if len(data) < len(MAGIC) + 4 or data[:len(MAGIC)] != MAGIC:
            raise ValueError("not a KV block file (bad magic)")
        (header_len,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        if header_len > MAX_HEADER_BYTES or start + header_len > len(data):
            raise ValueError(f"header of {header_len} bytes does not fit the file ({len(data)} bytes)")
        try:
            header = json.loads(bytes(data[start:start + header_len]))
            model, block = header["model"], header["block"]
            tensors = [(str(name), tuple(int(d) for d in shape)) for name, shape in header["tensors"]]
            payload_len, checksum = int(header["payload"]), str(header["blake2b"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable header ({exc})") from None
        if model != self.model_id:
            raise ValueError(f"written for another model ({model}, this one is {self.model_id})")
        if block != digest.hex():
            raise ValueError(f"holds block {block}, expected {digest.hex()}")
        if tensors != self.layout:
            raise ValueError(f"tensors {tensors} do not match this model's KV blocks {self.layout}")
        lo = start + header_len
        if lo % PAYLOAD_ALIGN:
            raise ValueError(f"payload at offset {lo}, not aligned to {PAYLOAD_ALIGN}")
        if payload_len != self.payload_bytes or len(data) != lo + payload_len:
            raise ValueError(f"payload is {len(data) - lo} bytes, expected {self.payload_bytes} "
                             f"(truncated, or not a block of this size)")
        with memoryview(data) as view:
            if hashlib.blake2b(view[lo:], digest_size=32).hexdigest() != checksum:
                raise ValueError("checksum mismatch (the file was changed or damaged)")
        out, offset = [], lo
        for name, shape in tensors:
            dtype = DTYPES[name]
            count = _numel(shape)  # the tensors are views of `data`, which they keep alive
            out.append(torch.frombuffer(data, dtype=dtype, count=count, offset=offset).view(shape))
            offset += count * dtype.itemsize
        return out

    # -- writing -------------------------------------------------------------------------------
    def put(self, digest: bytes, ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor]) -> bool:
        """Queue a block for writing (host tensors nobody writes to again). False when not queued:
        already there, the layout is not this model's, or the writer is too far behind."""
        tensors = list(ks) + list(vs)
        if [(dtype_name(t.dtype), tuple(t.shape)) for t in tensors] != self.layout:
            return False
        return self._queue_write(self.name_of(digest), self.payload_bytes, lambda: self._block_chunks(digest, tensors))

    def put_reply(self, text: str, ids: Sequence[int]) -> bool:
        """Queue a reply's sampled ids for writing (see get_reply)."""
        record = json.dumps({"model": self.model_id, "text": _text_hash(text), "ids": [int(t) for t in ids]})
        data = REPLY_MAGIC + record.encode("ascii")
        if len(data) > MAX_REPLY_FILE_BYTES:
            return False
        return self._queue_write(self.reply_name_of(text), len(data), lambda: [data])

    def _queue_write(self, name: str, nbytes: int, chunks) -> bool:
        """Hand `chunks()` (the file's bytes, built on the writer thread) to the writer."""
        with self._lock:
            if name in self._files or name in self._pending or nbytes > self.budget:
                return False
            if self._pending_bytes + nbytes > PENDING_BYTES:
                return False
            self._pending.add(name)
            self._pending_bytes += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="kv-disk-writer", daemon=True)
                self._thread.start()
        self._queue.put((name, nbytes, chunks))
        return True

    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                name, nbytes, chunks = item
                try:
                    size = self._write(name, chunks())
                except Exception as exc:  # noqa: BLE001 - a full disk or a bug: the block stays in memory only
                    log.warning("%s: could not write a KV cache file: %s", self.folder / name, exc)
                    size = None
                with self._lock:
                    self._pending.discard(name)
                    self._pending_bytes -= nbytes
                    if size is not None:
                        self._files[name] = size
                        self._files.move_to_end(name)
                self._evict()
            finally:
                self._queue.task_done()

    def _block_chunks(self, digest: bytes, tensors: list[torch.Tensor]) -> list:
        raw = [t.contiguous().view(torch.uint8).numpy() for t in tensors]
        checksum = hashlib.blake2b(digest_size=32)
        for r in raw:
            checksum.update(r)
        header = json.dumps({"model": self.model_id, "block": digest.hex(),
                             "tensors": [[n, list(s)] for n, s in self.layout],
                             "payload": self.payload_bytes, "blake2b": checksum.hexdigest()}).encode()
        pad = -(len(MAGIC) + 4 + len(header)) % PAYLOAD_ALIGN
        header += b" " * pad
        return [MAGIC + struct.pack("<I", len(header)) + header] + [memoryview(r) for r in raw]

    def _write(self, name: str, chunks: list) -> int:
        final = self.folder / name
        tmp = self.folder / f".{name}.{os.getpid()}.tmp"
        fd = create_private_file(tmp)
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
            os.replace(tmp, final)
        except BaseException:
            _unlink(tmp)
            raise
        return sum(memoryview(c).nbytes for c in chunks)

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self._queue.join()

    def delete(self, digests: Sequence[bytes] = (), reply_texts: Sequence[str] = ()) -> None:
        """Delete these blocks' and replies' files (a deleted chat's: its content must not stay
        on disk), after what is queued is written, so no write brings one back."""
        self.flush()
        names = [self.name_of(d) for d in digests] + [self.reply_name_of(t) for t in reply_texts if t]
        for name in names:
            self._forget(name)
            _unlink(self.folder / name)

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()


def _text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["PrefixDisk", "usable_folder", "block_layout", "model_identity", "file_identity", "DEFAULT_DISK_BYTES"]
