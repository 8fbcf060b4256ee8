"""The prefix cache's disk tier on its own: blocks round-trip bit for bit, every file is checked on
read (a damaged, truncated, foreign or misnamed one is dropped with a log line, never used), the
folder stays within its byte bound (least recently used first) and private (0700 / 0600)."""
from __future__ import annotations

import logging
import os
import stat
import threading

import pytest
import torch

from tramontane.engine.api import EngineError
from tramontane.engine.runtime.kv_cache import KVPool
from tramontane.engine.runtime.prefix_cache import PrefixCache, block_hashes
from tramontane.engine.runtime.prefix_disk import PrefixDisk, block_layout, file_identity

B = 4


def _cache(dtype=torch.float32, n_blocks=8, layers=2, seed=0, heads=2):
    """A random-filled KV pool (heads KV heads, head_dim 8, blocks of B positions)."""
    pool = KVPool(heads, 8, 8, n_blocks, [(layers, dtype, torch.device("cpu"))], block=B)
    g = torch.Generator().manual_seed(seed)
    for t in pool.ks + pool.vs:
        t.copy_(torch.randn(t.shape, generator=g))
    return pool


def _block(pool, i):
    return pool.read_block(i)


def _disk(folder, pool, model="model-a", budget=1 << 20):
    return PrefixDisk(folder, model, block_layout(pool), budget)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_block_round_trips_bit_for_bit_in_a_private_file(tmp_path, dtype):
    cache = _cache(dtype)
    disk = _disk(tmp_path / "kv", cache)
    digest = b"\x01" * 16
    ks, vs = _block(cache, 1)
    assert disk.put(digest, ks, vs)
    assert not disk.put(digest, ks, vs)  # queued or written already
    disk.flush()
    assert digest in disk
    again = _disk(tmp_path / "kv", cache)  # a restart: found by scanning the folder
    got = again.get(digest)
    assert got is not None
    assert torch.equal(got[0][0], ks[0]) and torch.equal(got[1][0], vs[0]) and got[0][0].dtype == dtype
    assert again.get(b"\x02" * 16) is None
    if os.name == "posix":
        assert stat.S_IMODE(os.stat(tmp_path / "kv").st_mode) == 0o700
        files = os.listdir(tmp_path / "kv")
        assert len(files) == 1 and stat.S_IMODE(os.stat(tmp_path / "kv" / files[0]).st_mode) == 0o600
    disk.close()


def _damage_payload(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])


def _bad_magic(path):
    data = bytearray(path.read_bytes())
    data[0:4] = b"GGUF"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, says", [(_damage_payload, "checksum mismatch"), (_truncate, "truncated"),
                                          (_bad_magic, "bad magic")])
def test_a_damaged_file_is_dropped_with_a_log_line(tmp_path, caplog, damage, says):
    cache = _cache()
    disk = _disk(tmp_path, cache)
    digest = b"\x03" * 16
    disk.put(digest, *_block(cache, 0))
    disk.flush()
    path = tmp_path / disk.name_of(digest)
    damage(path)
    with caplog.at_level(logging.WARNING, logger="tramontane.engine.runtime.prefix_disk"):
        assert disk.get(digest) is None
    assert says in caplog.text and str(path) in caplog.text
    assert not path.exists() and digest not in disk


def test_another_models_or_another_blocks_file_is_never_trusted(tmp_path, caplog):
    cache = _cache()
    other_model = _disk(tmp_path, cache, model="model-b")
    mine = _disk(tmp_path, cache, model="model-a")
    digest = b"\x04" * 16
    assert mine.name_of(digest) != other_model.name_of(digest)  # two models never share a name
    other_model.put(digest, *_block(cache, 0))
    other_model.flush()
    # the other model's file put where this model's block would be (a copied folder, say)
    os.replace(tmp_path / other_model.name_of(digest), tmp_path / mine.name_of(digest))
    mine = _disk(tmp_path, cache, model="model-a")
    with caplog.at_level(logging.WARNING):
        assert mine.get(digest) is None
    assert "another model" in caplog.text
    # a good file of this model under another block's name
    mine.put(digest, *_block(cache, 0))
    mine.flush()
    other_digest = b"\x05" * 16
    os.replace(tmp_path / mine.name_of(digest), tmp_path / mine.name_of(other_digest))
    mine = _disk(tmp_path, cache, model="model-a")
    with caplog.at_level(logging.WARNING):
        assert mine.get(other_digest) is None
    assert "expected " + other_digest.hex() in caplog.text
    # a layout that is not this pool's (other head count): refused on write and on read
    wide = _cache(heads=4)
    assert not mine.put(b"\x06" * 16, *_block(wide, 0))
    wide_disk = _disk(tmp_path / "w", wide)
    wide_disk.put(b"\x06" * 16, *_block(wide, 0))
    wide_disk.flush()
    os.replace(tmp_path / "w" / wide_disk.name_of(b"\x06" * 16), tmp_path / mine.name_of(b"\x06" * 16))
    mine = _disk(tmp_path, cache, model="model-a")
    with caplog.at_level(logging.WARNING):
        assert mine.get(b"\x06" * 16) is None
    assert "do not match" in caplog.text


def test_the_folder_keeps_its_byte_bound_least_recently_used_first(tmp_path):
    cache = _cache()
    probe = _disk(tmp_path / "probe", cache)
    probe.put(b"\x00" * 16, *_block(cache, 0))
    probe.flush()
    size = probe.used
    digests = [bytes([i]) * 16 for i in range(1, 5)]
    disk = _disk(tmp_path / "kv", cache, budget=3 * size)
    for i, d in enumerate(digests[:3]):
        disk.put(d, *_block(cache, 0))
        disk.flush()
        os.utime(tmp_path / "kv" / disk.name_of(d), (1 + i, 1 + i))  # ordered times for the rescan
    assert disk.get(digests[0]) is not None  # used: now the most recent
    disk.put(digests[3], *_block(cache, 1))
    disk.flush()
    assert disk.used <= 3 * size
    assert [d in disk for d in digests] == [True, False, True, True]
    assert len(os.listdir(tmp_path / "kv")) == 3
    # a restart sees the same files, oldest (by time) first, and a smaller bound evicts at once
    (tmp_path / "kv" / f".{'ab' * 20}.kv.77.tmp").write_bytes(b"x")  # a write a crash cut short
    (tmp_path / "kv" / "notes.txt").write_bytes(b"x" * size)  # not ours: never counted nor deleted
    smaller = _disk(tmp_path / "kv", cache, budget=2 * size)
    assert smaller.used <= 2 * size and sorted(os.listdir(tmp_path / "kv"))[-1] == "notes.txt"
    assert len(os.listdir(tmp_path / "kv")) == 3


def test_an_unusable_folder_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(EngineError, match="cannot keep the KV cache there"):
        _disk(blocker, _cache())


def test_the_prefix_cache_reads_missing_blocks_from_disk_and_drops_a_bad_one(tmp_path, caplog):
    src = _cache()
    hashes = block_hashes(list(range(100, 112)), B)  # 3 full blocks: pool blocks 0, 1, 2
    disk = _disk(tmp_path, src)
    first = PrefixCache(1 << 20, B, disk)
    for i, digest in enumerate(hashes):
        first.put(digest, *_block(src, i))
    first.close()  # written
    assert all(h in disk for h in hashes)

    restarted = PrefixCache(1 << 20, B, _disk(tmp_path, src))  # empty memory, same folder
    assert len(restarted) == 0
    dst = _cache(seed=5)
    for i, digest in enumerate(hashes):  # read back into another pool's blocks, as the scheduler does
        dst.write_block(7 - i, *restarted.get(digest))
    for i in range(3):
        assert all(torch.equal(a, b) for a, b in zip(sum(dst.read_block(7 - i), []), sum(src.read_block(i), [])))

    _damage_payload(tmp_path / disk.name_of(hashes[1]))
    again = PrefixCache(1 << 20, B, _disk(tmp_path, src))
    with caplog.at_level(logging.WARNING):
        assert again.get(hashes[1]) is None  # dropped: the scheduler's match stops at this block
    assert "checksum mismatch" in caplog.text and hashes[1] not in again.disk
    assert again.get(hashes[0]) is not None and again.get(hashes[2]) is not None


def test_file_identity_changes_with_the_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"head" + bytes(4000) + b"tail")
    a = file_identity(path, 16, 16)
    path.write_bytes(b"head" + bytes(4000) + b"TAIL")
    b = file_identity(path, 16, 16)
    path.write_bytes(b"HEAD" + bytes(4000) + b"TAIL")
    c = file_identity(path, 16, 16)
    assert len({a, b, c}) == 3


def test_reply_ids_round_trip_and_a_bad_file_is_dropped(tmp_path, caplog):
    cache = _cache()
    disk = _disk(tmp_path, cache)
    assert disk.put_reply("Bonjour.", [5, 6, 7])
    disk.flush()
    again = _disk(tmp_path, cache)  # found by the scan, counted in the folder's bound
    assert again.used > 0 and again.get_reply("Bonjour.") == [5, 6, 7]
    assert again.get_reply("Bonsoir.") is None
    path = tmp_path / disk.reply_name_of("Bonjour.")
    assert disk.reply_name_of("Bonjour.") != _disk(tmp_path / "b", cache, model="model-b").reply_name_of("Bonjour.")
    path.write_bytes(path.read_bytes().replace(b"[5, 6, 7]", b"[5, -6, 7]"))
    with caplog.at_level(logging.WARNING):
        assert _disk(tmp_path, cache).get_reply("Bonjour.") is None
    assert "not a list of token ids" in caplog.text and not path.exists()


def test_blocks_the_writer_could_not_take_are_written_at_close(tmp_path, monkeypatch):
    from tramontane.engine.runtime import prefix_disk

    src = _cache()
    hashes = block_hashes(list(range(100, 112)), B)
    disk = _disk(tmp_path, src)
    gate = threading.Event()
    real_write = disk._write
    monkeypatch.setattr(disk, "_write", lambda *a: (gate.wait(), real_write(*a))[1])  # a slow disk
    monkeypatch.setattr(prefix_disk, "PENDING_BYTES", disk.payload_bytes)  # room for one block
    cache = PrefixCache(1 << 20, B, disk)
    for i, digest in enumerate(hashes):
        cache.put(digest, *_block(src, i))
    assert len(cache) == 3
    assert sum(h in disk for h in hashes) == 1  # one queued, two refused while the writer is behind
    gate.set()
    cache.close()
    assert all(h in disk for h in hashes) and len(os.listdir(tmp_path)) == 3
