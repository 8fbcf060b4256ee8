"""Memory-mapped GGUF reader that never trusts the file.

Why not `gguf.GGUFReader`: it trusts counts and lengths from the header (a file claiming
2^40 metadata entries makes it allocate or loop), and a damaged file surfaces as whatever
numpy or struct raises. Here every count and length is checked against the bytes that are
actually left, so any bad file ends in one `GGUFError` naming the file. Block geometry comes
from `kernels.ggml_types.GGML_TYPES` (tested equal to the `gguf` package's), not from `gguf`,
whose import pulls in its whole converter stack (mistral-common, pydantic, cv2, yaml: ~47 MB).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..kernels.ggml_types import BF16, F16, F32, GGML_TYPES
from .api import EngineError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NESTING = 4

# GGUF metadata value types -> (struct format, size); 8 = string, 9 = array.
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9



class GGUFError(EngineError):
    """Any problem with a GGUF file; the message starts with the file's path."""


_MISSING = object()
_ELEMENTS = {  # array element kinds a caller can ask for -> (accepts this numpy dtype?, in words)
    "int": (lambda dt: dt.kind in "iu", "integers"),
    "float": (lambda dt: dt.kind in "iuf", "numbers"),
    "bool": (lambda dt: dt.kind == "b", "booleans"),
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def describe_value(value) -> str:
    """What a metadata value is, for error messages: "string 'abc'", "array of 3 uint8"..."""
    if isinstance(value, bool):
        return f"bool {value}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {value[:40] + '…' if len(value) > 40 else value!r}"
    if isinstance(value, np.ndarray):
        return f"array of {len(value)} {value.dtype.name}"
    if isinstance(value, StringArray):
        return f"array of {len(value)} strings"
    if isinstance(value, list):
        if not value:
            return "empty array"
        kind = "strings" if isinstance(value[0], str) else "arrays"
        return f"array of {len(value)} {kind}"
    return type(value).__name__


class StringArray(Sequence[str]):
    """A metadata array of strings kept as offsets into the mapped file, decoded on access.

    A tekken vocabulary is 131072 tokens + 269443 merges: as Python str objects ~37 MB of
    RSS for as long as the file (and the tokenizer) lives, here 12 bytes per string. Every
    string was checked (bounds, UTF-8) when the file was parsed."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        self._data, self._starts, self._lengths = data, starts, lengths

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start = int(self._starts[index])  # numpy raises IndexError out of range
        return self._data[start:start + int(self._lengths[index])].tobytes().decode("utf-8")

    def __iter__(self):
        data = self._data
        for start, n in zip(self._starts.tolist(), self._lengths.tolist()):
            yield data[start:start + n].tobytes().decode("utf-8")

    def __eq__(self, other) -> bool:
        if isinstance(other, (StringArray, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable-sequence semantics, like the list it stands for

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


class Metadata:
    """Typed reads of GGUF metadata. Each read states the type and range it expects; anything
    else (missing without a default, wrong type, out of range, NaN) raises `error` naming the
    file, the key, what was expected and what was found. Engine code reads metadata only here."""

    def __init__(self, kv: dict[str, Any], source, error: type[Exception] = GGUFError):
        self.kv, self.source, self.error = kv, str(source), error

    def has(self, key: str) -> bool:
        return key in self.kv

    def fail(self, key: str, expected: str, found: str) -> Exception:
        return self.error(f"{self.source}: metadata '{key}' should be {expected}, found {found}")

    def _lookup(self, key: str, expected: str, default):
        value = self.kv.get(key, _MISSING)
        if value is _MISSING and default is _MISSING:
            raise self.error(f"{self.source}: metadata '{key}' is missing (expected {expected})")
        return value

    def _read(self, key: str, expected: str, accept, default):
        """The value if `accept(value)`, `default` if the key is absent, else the error."""
        value = self._lookup(key, expected, default)
        if value is _MISSING:
            return default
        if not accept(value):
            raise self.fail(key, expected, describe_value(value))
        return value

    def uint(self, key: str, lo: int = 0, hi: int = 2**64 - 1, *, default=_MISSING) -> int:
        """An integer in lo..hi (any GGUF integer type)."""
        expected = f"an integer in {lo}..{hi}" if hi < 2**64 - 1 else f"an integer ≥ {lo}"
        return self._read(key, expected, lambda v: _is_int(v) and lo <= v <= hi, default)

    def float(self, key: str, lo: float = -math.inf, hi: float = math.inf, *,
              above: float | None = None, default=_MISSING) -> float:
        """A finite number in lo..hi (and > `above` when given); GGUF floats or integers."""
        expected = "a finite number" + (f" above {above}" if above is not None else "") + (
            f" in {lo}..{hi}" if (lo, hi) != (-math.inf, math.inf) else "")

        def accept(v) -> bool:
            return ((_is_int(v) or isinstance(v, float)) and math.isfinite(v) and lo <= v <= hi
                    and (above is None or v > above))

        value = self._read(key, expected, accept, default)
        return value if value is default else float(value)

    def bool(self, key: str, *, default=_MISSING) -> bool:
        return self._read(key, "a bool", lambda v: isinstance(v, bool), default)

    def string(self, key: str, *, default=_MISSING) -> str:
        return self._read(key, "a string", lambda v: isinstance(v, str), default)

    def array_of(self, key: str, elem: str, length: int | None = None, *, default=_MISSING):
        """An array of `elem` ("int", "float", "bool": a numpy array; "string": a sequence of str,
        a StringArray when read from a file), of exactly `length` items when given. Float
        arrays must be finite."""
        words = "strings" if elem == "string" else _ELEMENTS[elem][1]
        expected = f"an array of {'' if length is None else f'{length} '}{words}"
        value = self._lookup(key, expected, default)
        if value is _MISSING:
            return default
        if elem == "string":
            ok = isinstance(value, StringArray) or isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, np.ndarray) and _ELEMENTS[elem][0](value.dtype)
        finite = not (ok and value.dtype.kind == "f" and not np.isfinite(value).all()) if elem != "string" else True
        if not ok or not finite or (length is not None and len(value) != length):
            raise self.fail(key, expected, describe_value(value) + ("" if finite else " with NaN or infinity"))
        return value


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major (torch) order: the reverse of ggml's ne[]
    ggml_type: int
    offset: int  # absolute offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                            f"file has {self.size}")

    def scalar(self, vtype: int, what: str):
        fmt, size = _SCALARS[vtype]
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None

    def strings(self, n: int, what: str) -> StringArray:
        """n strings, each checked like `string` but kept as (offset, length) in the buffer."""
        starts = np.empty(n, dtype=np.int64)
        lengths = np.empty(n, dtype=np.uint32)
        buf, size, unpack = self.buf, self.size, struct.Struct("<Q").unpack_from
        pos = self.pos
        for i in range(n):  # messages are only formatted on failure: this loop runs 400k times
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"length of {what}[{i}]")
            (length,) = unpack(buf, pos)
            pos += 8
            if pos + length > size or length >= 1 << 32:
                self.pos = pos
                self.need(length, f"{what}[{i}]")
                raise self.fail(f"{what}[{i}] is {length} bytes long")
            try:
                str(buf[pos:pos + length], "utf-8")
            except UnicodeDecodeError as exc:
                raise self.fail(f"{what}[{i}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            starts[i], lengths[i] = pos, length
            pos += length
        self.pos = pos
        return StringArray(np.frombuffer(buf, dtype=np.uint8), starts, lengths)

    def count(self, min_item_bytes: int, what: str) -> int:
        """A count read from the file, refused if that many items could not fit in what is left."""
        n = self.u64(what)
        left = self.size - self.pos
        if n * min_item_bytes > left:
            raise self.fail(f"{what} is {n}, more than the {left} bytes left could hold")
        return n

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= MAX_NESTING:
                raise self.fail(f"{what}: arrays nested more than {MAX_NESTING} deep")
            etype = self.u32(f"element type of {what}")
            if etype in _SCALARS:
                n = self.count(_SCALARS[etype][1], f"element count of {what}")
                size = n * _SCALARS[etype][1]
                arr = np.frombuffer(self.buf, dtype=_NUMPY[etype], count=n, offset=self.pos).copy()
                self.pos += size
                return arr.astype(bool) if etype == 7 else arr
            if etype == _STRING:
                n = self.count(8, f"element count of {what}")
                return self.strings(n, what)
            if etype == _ARRAY:
                n = self.count(12, f"element count of {what}")
                return [self.value(_ARRAY, f"{what}[{i}]", depth + 1) for i in range(n)]
            raise self.fail(f"{what}: unknown array element type {etype}")
        raise self.fail(f"{what}: unknown metadata value type {vtype}")


class GGUFFile(Metadata):
    """A typed, memory-mapped view of one GGUF file. Nothing is copied until a tensor is used."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        super().__init__({}, self.path)
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < 24:
                    raise GGUFError(f"{self.path}: not a GGUF file ({size} bytes, too short for a header)")
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        try:
            self._parse()
        except GGUFError:
            self.close()
            raise

    def _parse(self) -> None:
        cur = _Cursor(self._mm, self.path)
        magic = bytes(self._mm[:4])
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            hint = " (a big-endian file?)" if struct.unpack("<I", struct.pack(">I", self.version))[0] in SUPPORTED_VERSIONS else ""
            raise cur.fail(f"unsupported GGUF version {self.version}{hint}; "
                           f"supported: {', '.join(map(str, SUPPORTED_VERSIONS))}")
        n_tensors = cur.count(24, "tensor count")  # name length + dims + type + offset
        n_kv = cur.count(12, "metadata entry count")  # key length + value type

        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.u32(f"value type of '{key}'")
            if key in self.kv:
                raise cur.fail(f"metadata key '{key}' appears twice")
            self.kv[key] = cur.value(vtype, f"metadata '{key}'")

        alignment = self.uint("general.alignment", 8, 1 << 20, default=DEFAULT_ALIGNMENT)
        if alignment % 8:
            raise cur.fail(f"general.alignment {alignment} is not a multiple of 8")

        infos = []
        for i in range(n_tensors):
            name = cur.string(f"name of tensor #{i}")
            n_dims = cur.u32(f"dimension count of tensor '{name}'")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.fail(f"tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
            ne = [cur.u64(f"dimension of tensor '{name}'") for _ in range(n_dims)]
            ggml_type = cur.u32(f"type of tensor '{name}'")
            offset = cur.u64(f"offset of tensor '{name}'")
            infos.append((name, ne, ggml_type, offset))

        data_start = -(-cur.pos // alignment) * alignment
        self.data_offset = data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, ggml_type, offset in infos:
            self.tensors[name] = self._tensor_info(cur, name, ne, ggml_type, offset, data_start, alignment)

        arch = self.string("general.architecture", default="")
        if not arch:
            raise cur.fail("general.architecture is missing (every GGUF model file has it)")
        self.architecture = arch

    def _tensor_info(self, cur: _Cursor, name, ne, ggml_type, offset, data_start, alignment) -> TensorInfo:
        if name in self.tensors:
            raise cur.fail(f"tensor '{name}' appears twice")
        if ggml_type not in GGML_TYPES:
            raise cur.fail(f"tensor '{name}' has unknown GGML type {ggml_type}")
        t = GGML_TYPES[ggml_type]
        type_name, block, type_size = t.name, t.block_size, t.type_size
        if any(d == 0 for d in ne):
            raise cur.fail(f"tensor '{name}' has a zero dimension {ne}")
        if ne[0] % block:
            raise cur.fail(f"tensor '{name}': row length {ne[0]} is not a multiple of "
                           f"{type_name}'s block size {block}")
        count = 1
        for d in ne:
            count *= d
        nbytes = count // block * type_size
        if offset % alignment:
            raise cur.fail(f"tensor '{name}': data offset {offset} is not aligned to {alignment}")
        start = data_start + offset
        if start + nbytes > cur.size:
            raise cur.fail(f"tensor '{name}' ({type_name}, shape {tuple(reversed(ne))}, {nbytes} bytes) "
                           f"runs past the end of the file (needs bytes {start}..{start + nbytes}, "
                           f"file has {cur.size}): truncated download?")
        return TensorInfo(name, tuple(reversed(ne)), ggml_type, start, nbytes)

    # -- metadata (engine code reads through the typed accessors of `Metadata`) ----------------
    def get(self, key: str, default: Any = None) -> Any:
        """The raw value, untyped: for tests and debugging only."""
        return self.kv.get(key, default)

    def arch(self, suffix: str, default: Any = None) -> Any:
        """A raw key under this file's own architecture prefix (tests and debugging only)."""
        return self.kv.get(self.arch_key(suffix), default)

    def arch_key(self, suffix: str) -> str:
        """A key under this file's own architecture prefix, e.g. 'mistral3.block_count'."""
        return f"{self.architecture}.{suffix}"

    def block_indices(self, prefix: str) -> set[int]:
        """Indices i of the tensors named `{prefix}{i}.…`: the blocks the file really holds.
        Counts claimed by metadata are checked against this (O(tensors), not O(claimed))."""
        out = set()
        for name in self.tensors:
            if name.startswith(prefix):
                index = name[len(prefix):].split(".", 1)[0]
                if index.isdigit() and index.isascii():
                    out.add(int(index))
        return out

    # -- tensors ----------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a zero-copy uint8 view of the mapped file."""
        info = self._info(name)
        return np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def array(self, name: str) -> np.ndarray:
        """An F32/F16/BF16 tensor as a numpy array of its shape (BF16 widened to float32)."""
        info = self._info(name)
        raw = self.raw(name)
        if info.ggml_type == F32:
            return raw.view("<f4").reshape(info.shape)
        if info.ggml_type == F16:
            return raw.view("<f2").reshape(info.shape)
        if info.ggml_type == BF16:
            return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(info.shape)
        raise GGUFError(f"{self.path}: tensor '{name}' is {info.type_name}, not a float type")

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor '{name}' is missing") from None

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still point into the map; it closes when they are gone

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, arch={self.architecture!r}, tensors={len(self.tensors)})"


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    return GGUFFile(path)
