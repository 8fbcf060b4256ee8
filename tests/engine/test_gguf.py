"""The GGUF reader against gguf-py's reader and against damaged files."""
import os
import random
import struct

import gguf
import numpy as np
import pytest

from tramontane.engine.gguf import GGUFError, open_gguf

from support import FIXTURES
TEXT = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
QUANT = os.path.join(FIXTURES, "mistral3_tiny-q8_0.gguf")
MMPROJ = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf")


def _reference_kv(reader: gguf.GGUFReader) -> dict:
    out = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        out[field.name] = field.contents()
    return out


@pytest.mark.parametrize("path", [TEXT, QUANT, MMPROJ])
def test_matches_gguf_py_reader(path):
    ref = gguf.GGUFReader(path)
    with open_gguf(path) as gf:
        ref_kv = _reference_kv(ref)
        assert set(gf.kv) == set(ref_kv)
        for key, value in ref_kv.items():
            ours = gf.kv[key]
            if isinstance(ours, np.ndarray):
                np.testing.assert_array_equal(ours, np.asarray(value))
            elif isinstance(ours, float):
                assert ours == pytest.approx(value, rel=1e-7)
            else:
                assert ours == value, key
        assert len(gf.tensors) == len(ref.tensors)
        for t in ref.tensors:
            info = gf.tensors[t.name]
            assert info.shape == tuple(int(d) for d in reversed(t.shape))
            assert info.ggml_type == int(t.tensor_type)
            assert info.offset == t.data_offset
            assert info.nbytes == t.n_bytes
            assert bytes(gf.raw(t.name)) == bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
            if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                np.testing.assert_array_equal(gf.array(t.name), np.asarray(t.data).reshape(info.shape))


def _write(tmp_path, data: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _header(version=3, n_tensors=0, n_kv=0):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv_string(key: str, value: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "too short"),
        (b"GGML" + b"\0" * 40, "not a GGUF file"),
        (_header(version=1) + b"\0" * 16, "unsupported GGUF version 1"),
        (_header(version=3 << 24) + b"\0" * 16, "big-endian"),
        (_header(n_kv=1 << 40) + b"\0" * 16, "metadata entry count is 1099511627776"),
        (_header(n_tensors=1 << 50) + b"\0" * 16, "tensor count"),
        (_header(n_kv=1) + _kv_string("general.architecture", b"\xff\xfe llama"), "not valid UTF-8"),
        (_header(n_kv=1) + _kv_string("general.architecture", b"llama")[:-3] + b"\0" * 0, "truncated"),
        (_header(n_kv=1) + struct.pack("<Q", 3) + b"abc" + struct.pack("<I", 77) + b"\0" * 16, "unknown metadata value type 77"),
        (_header(n_kv=1) + struct.pack("<Q", 3) + b"abc" + struct.pack("<IIQ", 9, 4, 1 << 62), "element count"),
        (_header(n_kv=0) + b"\0" * 16, "general.architecture is missing"),
    ],
)
def test_bad_headers_are_refused_with_a_clear_message(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(GGUFError) as err:
        open_gguf(path)
    assert str(err.value).startswith(str(path))
    assert message in str(err.value)


def _tiny_file(tmp_path, *, ggml_type=0, ne=(4, 3), offset=0, data_len=48, n_dims=None):
    kv = _kv_string("general.architecture", b"mistral3")
    name = b"w"
    dims = list(ne)
    info = struct.pack("<Q", len(name)) + name + struct.pack("<I", n_dims or len(dims))
    info += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ggml_type, offset)
    head = _header(n_tensors=1, n_kv=1) + kv + info
    head += b"\0" * (-len(head) % 32)
    return _write(tmp_path, head + b"\x01" * data_len)


def test_well_formed_tiny_file_opens(tmp_path):
    with open_gguf(_tiny_file(tmp_path)) as gf:
        assert gf.tensors["w"].shape == (3, 4)
        assert gf.array("w").shape == (3, 4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(data_len=47), "runs past the end of the file"),
        (dict(ggml_type=99), "unknown GGML type 99"),
        (dict(ggml_type=8, ne=(48, 1), data_len=34), "not a multiple of Q8_0's block size 32"),
        (dict(offset=8), "not aligned"),
        (dict(ne=(4, 0)), "zero dimension"),
        (dict(n_dims=9, ne=(4, 3)), "dimensions"),
        (dict(ne=(1 << 62, 1 << 62)), "runs past the end of the file"),
    ],
)
def test_bad_tensor_tables_are_refused(tmp_path, kwargs, message):
    path = _tiny_file(tmp_path, **kwargs)
    with pytest.raises(GGUFError) as err:
        open_gguf(path)
    assert message in str(err.value)


def test_truncated_real_file_names_the_tensor(tmp_path):
    data = open(TEXT, "rb").read()
    path = _write(tmp_path, data[: len(data) - 1000])
    with pytest.raises(GGUFError, match="runs past the end of the file"):
        open_gguf(path)


def _mutations(data: bytes, header_len: int, rng: random.Random):
    """Seeded random damage concentrated on the header: bit flips, byte runs, u64 counts
    overwritten with absurd values, truncations."""
    kind = rng.randrange(5)
    buf = bytearray(data)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(header_len)
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        i = rng.randrange(header_len)
        buf[i:i + 8] = struct.pack("<Q", rng.choice([0, 1, 2**32 - 1, 2**40, 2**63, 2**64 - 1, rng.getrandbits(64)]))
    elif kind == 2:
        i = rng.randrange(header_len)
        buf[i:i + 4] = struct.pack("<I", rng.choice([0, 7, 8, 9, 13, 255, 2**31, rng.getrandbits(32)]))
    elif kind == 3:
        return bytes(buf[: rng.randrange(len(buf))])
    else:
        i = rng.randrange(header_len)
        n = rng.randint(1, 64)
        buf[i:i + n] = bytes(rng.getrandbits(8) for _ in range(n))
    return bytes(buf)


@pytest.mark.parametrize("path, cases", [(MMPROJ, 2500), (TEXT, 400)])
def test_fuzzed_headers_only_raise_gguf_error(tmp_path, path, cases):
    data = open(path, "rb").read()
    with open_gguf(path) as gf:
        header_len = gf.data_offset
    rng = random.Random(20261129)
    target = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(cases):
        mutated = _mutations(data, header_len, rng)
        target.write_bytes(mutated)
        try:
            gf = open_gguf(target)
        except GGUFError as exc:
            assert str(exc).startswith(str(target))
            outcomes["refused"] += 1
            continue
        # Whatever opened must be internally consistent: every tensor readable in bounds.
        for name, info in gf.tensors.items():
            assert info.offset + info.nbytes <= len(mutated)
            assert gf.raw(name).nbytes == info.nbytes
        gf.close()
        outcomes["ok"] += 1
    assert outcomes["refused"] > cases // 4  # the damage really reached the parser
