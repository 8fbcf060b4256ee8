"""What the engine allocates at load and per switch, on the CPU: the context the plan budgeted
(and no other), decode graphs captured at load with a failed bucket reported once and run
eagerly, decode's embedding without host tensors, parked KV in pooled host buffers, and GPU
memory read from NVML without a CUDA context (a fake NVML and fake torch.cuda queries)."""
from __future__ import annotations

import logging
import os
import re
import sys
import types

import pytest
import torch

from support import FIXTURES
from support.batch_runs import PrefillSpy
from support.eager_graphs import eager_graph_capture
from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.runtime import decoder, memory
from tramontane.engine.runtime.cuda_graphs import ROW_BUCKETS
from tramontane.engine.runtime.decoder import decode, new_cache
from tramontane.engine.runtime.kv_cache import BLOCK_TOKENS
from tramontane.engine.runtime.device_map import DeviceInfo, Machine, PlanError

TINY = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")  # context_length 512
GiB = 1 << 30
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


def _ids(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the planned context

def test_the_cache_is_the_context_the_plan_budgeted_and_free_memory_is_never_asked(monkeypatch):
    from tramontane.engine.runtime import device_map
    from tramontane.engine.runtime.local import LocalEngine

    def asked(*a, **k):
        raise AssertionError("the loader asked for free GPU memory")

    monkeypatch.setattr(torch.cuda, "mem_get_info", asked)
    monkeypatch.setattr(device_map, "detect_machine", lambda: Machine((), DeviceInfo("cpu", 64 * GiB)))
    eng = LocalEngine(TINY, device="cpu", context_length=200)
    try:
        assert eng.plan.context_length == 200 == eng.new_sequence().capacity == eng.context_size
        assert eng.plan.placements[0].kv == 200 * eng.model.kv_bytes_per_token()  # the KV the plan counted
        assert eng.pool.positions >= 200  # the pool holds the context (and, on the CPU, kept chats' blocks)
    finally:
        eng.close()
    eng = LocalEngine(TINY, device="cpu")
    try:  # the default: the plan's 4096, capped by the file's 512
        assert eng.plan.context_length == eng.context_size == 512 == decoder.default_context_length(eng.model)
        assert eng.new_sequence().capacity == 512
    finally:
        eng.close()


def test_a_larger_context_is_planned_or_refused_before_loading(monkeypatch):
    from tramontane.engine.runtime import device_map
    from tramontane.engine.runtime.local import LocalEngine

    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.runtime.device_map import Budget, plan_devices, sizes_of_files

    with open_gguf(TINY) as gf:
        sizes = sizes_of_files(gf)
    need_300 = plan_devices(sizes, Machine((), DeviceInfo("cpu", 64 * GiB)), Budget(300)).placements[0].total
    room = 2 * GiB + need_300  # the headroom and what a 300-token context needs
    monkeypatch.setattr(device_map, "detect_machine", lambda: Machine((), DeviceInfo("cpu", room)))
    monkeypatch.setattr(Mistral3Text, "load", classmethod(lambda cls, *a, **k: pytest.fail("loaded")))
    with pytest.raises(PlanError, match="with a 512-token context: .*lower the context length"):
        LocalEngine(TINY, device="cpu")  # the default (the file's 512) does not fit
    with pytest.raises(PlanError, match="with a 500-token context"):
        LocalEngine(TINY, device="cpu", context_length=500)
    monkeypatch.undo()
    monkeypatch.setattr(device_map, "detect_machine", lambda: Machine((), DeviceInfo("cpu", room)))
    eng = LocalEngine(TINY, device="cpu", context_length=256)  # planned, and it fits
    try:
        assert eng.context_size == eng.new_sequence().capacity == 256
    finally:
        eng.close()


# ----------------------------------------------------------------------------- decode graphs

def test_decode_buckets_are_a_capped_set():
    assert memory.decode_buckets(64) == [64]
    assert memory.decode_buckets(4096) == [256, 512, 1024, 2048, 4096]
    assert memory.decode_buckets(3000) == [256, 512, 1024, 2048, 3000]
    big = memory.decode_buckets(131072)
    assert len(big) == memory.MAX_GRAPH_BUCKETS and big[-1] == 131072 and big[0] == 4096
    assert [memory.bucket_for(n, 4096) for n in (1, 256, 257, 4000)] == [256, 256, 512, 4096]
    assert memory.bucket_for(10, 131072) == 4096  # the smallest captured bucket
    assert memory.bucket_for(1, 64) == 64 and memory.bucket_for(5000, 4096) == 4096  # never past the capacity


def _graph_model(monkeypatch, fail_bucket: int | None):
    """The tiny model with "GPU" graphs stood in for on the CPU; the capture of `fail_bucket`
    raises as a CUDA capture can (an op that syncs inside a capture)."""
    captured = eager_graph_capture(monkeypatch)
    from tramontane.engine.runtime.cuda_graphs import DecodeGraphs

    eager = DecodeGraphs.capture
    state = {"capturing": False, "captures": 0}

    def capture(fn, device, pool):
        state["capturing"] = True
        state["captures"] += 1
        try:
            return eager(fn, device, pool)
        finally:
            state["capturing"] = False

    monkeypatch.setattr(DecodeGraphs, "capture", staticmethod(capture))
    m = Mistral3Text.load(TINY, device="cpu")
    orig = m.decode_static

    def decode_static(x, pos, tables, cache, bucket, segment=None):
        if state["capturing"] and bucket == fail_bucket:
            raise RuntimeError("operation not permitted when stream is capturing")
        return orig(x, pos, tables, cache, bucket, segment)

    monkeypatch.setattr(m, "decode_static", decode_static)
    monkeypatch.setattr(decoder, "graphs_enabled", lambda model: model is m)
    return m, captured, state


def test_graphs_are_captured_when_the_cache_is_made_and_never_in_a_reply(monkeypatch):
    m, captured, state = _graph_model(monkeypatch, fail_bucket=None)
    cache = new_cache(m, 512)
    row_buckets = cache.decode_graphs.row_buckets
    assert row_buckets == list(ROW_BUCKETS)
    assert set(cache.decode_graphs.graphs) == {(0, r, b) for r in row_buckets for b in (256, 512)}
    assert state["captures"] == 2 * len(row_buckets)
    ids = _ids(300, m.cfg.vocab_size, seed=3)
    want = m.logits(ids, all_logits=True)
    rows = [m.logits(ids[:250], 0, cache)] + [decode(m, int(t), cache) for t in ids[250:299]]
    assert state["captures"] == 2 * len(row_buckets)  # decoding across the 256 -> 512 bucket captured nothing
    assert (torch.stack(rows) - want[249:299]).abs().max().item() < 1e-4
    assert not m.graph_failures


def test_a_failed_capture_is_reported_once_and_only_its_bucket_runs_eagerly(monkeypatch, caplog):
    m, captured, state = _graph_model(monkeypatch, fail_bucket=512)
    with caplog.at_level(logging.WARNING, logger="tramontane.engine.runtime.decoder"):
        cache = new_cache(m, 512)
        new_cache(m, 512)  # the same failure again: not reported twice
    graphs = cache.decode_graphs
    msgs = m.graph_failures
    assert len(msgs) == len(graphs.row_buckets)  # the 512 bucket of every row bucket, once each
    for rows, msg in zip(graphs.row_buckets, msgs):
        assert f"decode bucket 512 (keys) x {rows} rows" in msg and "layers 0-1" in msg
        assert "operation not permitted" in msg
    assert [r.getMessage() for r in caplog.records] == msgs
    assert set(graphs.graphs) == {(0, r, 256) for r in graphs.row_buckets}
    assert set(graphs.failures) == {(0, r, 512) for r in graphs.row_buckets}
    ids = _ids(300, m.cfg.vocab_size, seed=4)
    want = m.logits(ids, all_logits=True)
    replays = []
    replay_256, out_256 = graphs.graphs[(0, 1, 256)]  # one sequence: the one-row bucket
    graphs.graphs[(0, 1, 256)] = (lambda: replays.append(1) or replay_256(), out_256)
    rows = [m.logits(ids[:240], 0, cache)] + [decode(m, int(t), cache) for t in ids[240:299]]
    assert len(replays) == 256 - 240  # positions 240..255 replayed the 256 graph, the rest ran eagerly
    assert (torch.stack(rows) - want[239:299]).abs().max().item() < 1e-4
    assert cache.decode_graphs is graphs and m.graph_failures == msgs  # no global off-switch


def test_local_engine_exposes_a_failed_capture_for_the_model_bar(monkeypatch):
    from tramontane.engine.runtime.local import LocalEngine

    eager_graph_capture(monkeypatch)
    from tramontane.engine.runtime.cuda_graphs import DecodeGraphs

    def capture(fn, device, pool):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(DecodeGraphs, "capture", staticmethod(capture))
    monkeypatch.setattr(decoder, "graphs_enabled", lambda model: True)
    eng = LocalEngine(TINY, device="cpu", context_length=300)
    try:
        assert eng.placement["warnings"] == eng.warnings
        # one warning per (rows, keys) bucket of the 300-token context: keys 256 and 300
        failed = [re.search(r"decode bucket (\d+) \(keys\) x (\d+) rows", w) for w in eng.warnings]
        assert all(failed) and sorted((int(f[1]), int(f[2])) for f in failed) == \
               sorted((b, r) for b in (256, 300) for r in ROW_BUCKETS)
        assert all("out of memory" in w for w in eng.warnings)
        out = eng.chat([ChatMessage.text("user", "hello")], GREEDY)  # every bucket eager: still replies
        assert len(out.token_ids) == 5
    finally:
        eng.close()


def test_decode_builds_no_host_tensor_per_token(monkeypatch):
    """The token id goes into a device tensor and its embedding row is gathered there: a step
    through the graphs makes no torch.tensor from Python values (a host-to-device copy on a GPU)."""
    m, captured, state = _graph_model(monkeypatch, fail_bucket=None)
    cache = new_cache(m, 512)
    ids = _ids(20, m.cfg.vocab_size, seed=5)
    m.logits(ids[:10], 0, cache)

    def no_host_tensors(*a, **k):
        raise AssertionError("decode built a tensor from host values")

    monkeypatch.setattr(torch, "tensor", no_host_tensors)
    rows = [decode(m, int(t), cache) for t in ids[10:]]
    monkeypatch.undo()
    want = Mistral3Text.load(TINY, device="cpu").logits(ids, all_logits=True)
    assert (torch.stack(rows[:-1]) - want[10:19]).abs().max().item() < 1e-4


# ----------------------------------------------------------------------------- chats taking turns

def test_switching_chats_restores_kv_from_the_prefix_cache_exactly():
    """Three chats taking turns in the engine's one slot: each comes back to its KV from the
    prefix cache's blocks (all but a last partial block), and decodes as a cold run does."""
    from tramontane.engine.runtime.local import LocalEngine

    eng = LocalEngine(TINY, device="cpu", context_length=256)
    try:
        talk = {k: [ChatMessage.text("user", f"chat {k} says hello number {k}, " * 6)] for k in "abc"}
        first = {k: eng.chat(talk[k], GREEDY, session_key=k) for k in "abc"}
        block = eng.prefix_cache.block
        for _ in range(2):  # round and round
            for k in "abc":
                again = eng.chat(talk[k] + [ChatMessage.text("assistant", first[k].text),
                                            ChatMessage.text("user", "and?")], GREEDY, session_key=k)
                held = first[k].stats.prompt_tokens + len(first[k].token_ids) - 1  # in the cache after turn one
                assert again.stats.reused_tokens >= held // block * block > 0
        for k in "abc":  # what was restored reads on as a cold pass does
            follow = talk[k] + [ChatMessage.text("assistant", first[k].text), ChatMessage.text("user", "and?")]
            with PrefillSpy(eng) as spy:
                eng.chat(follow, GREEDY, session_key=k)
            cold = eng.model.forward(eng.model.embed(eng.encode(follow).ids), 0, None)
            torch.testing.assert_close(spy.prefill[2], cold, rtol=0, atol=1e-5)
    finally:
        eng.close()


# ----------------------------------------------------------------------------- GPU memory

class _Props:
    def __init__(self, name, uuid, total, major, minor):
        self.name, self.uuid, self.total_memory, self.is_integrated = name, uuid, total, False
        self.major, self.minor = major, minor


def _fake_gpus(monkeypatch, nvml_devices):
    """Two torch devices (an Ampere A and a T4-like B without bf16); a fake NVML listing
    `nvml_devices` (uuid, free) in its own order."""
    props = [_Props("A", "GPU-aaaa", 24 * GiB, 8, 6), _Props("B", "GPU-bbbb", 16 * GiB, 7, 5)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    # by index (memory.gpu_free_memory) or by device (text.default_dtype, asked by detect_machine)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: props[i.index if isinstance(i, torch.device) else i])
    contexts = []

    def mem_get_info(i=None):
        contexts.append(i)
        return (5 * GiB, 16 * GiB)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    if nvml_devices is None:
        monkeypatch.setitem(sys.modules, "pynvml", None)
        return contexts
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = RuntimeError
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(nvml_devices)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: nvml_devices[i]
    nvml.nvmlDeviceGetUUID = lambda h: h[0].encode()
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=h[1], total=0, used=0)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return contexts


def test_gpu_memory_comes_from_nvml_matched_by_uuid_without_a_context(monkeypatch):
    contexts = _fake_gpus(monkeypatch, [("GPU-bbbb", 7 * GiB), ("GPU-aaaa", 20 * GiB)])  # NVML's own order
    out = memory.gpu_free_memory()
    assert [(free, name, how, cc) for free, _total, name, _i, how, cc in out] == [
        (20 * GiB, "A", "nvml", (8, 6)), (7 * GiB, "B", "nvml", (7, 5))]
    assert contexts == []  # torch.cuda.mem_get_info (a context on that GPU) never called
    from tramontane.engine.runtime.device_map import detect_machine

    m = detect_machine()
    assert [(d.name, d.free_bytes, d.capability) for d in m.gpus] == [("cuda:0", 20 * GiB, (8, 6)),
                                                                        ("cuda:1", 7 * GiB, (7, 5))]
    # bf16 on A, f16 on B (no bf16 units): 2 bytes a value on both, each asked of its own GPU
    assert [d.compute_value_bytes for d in m.gpus] == [2, 2] and m.cpu.compute_value_bytes == 4


def test_without_nvml_only_gpus_in_use_are_asked(monkeypatch):
    contexts = _fake_gpus(monkeypatch, None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i=None: (1 << 20) if i == 1 else 0)
    out = memory.gpu_free_memory()
    assert [(free, how) for free, _t, _n, _i, how, _cc in out] == [(24 * GiB, "total (free unknown)"), (5 * GiB, "torch")]
    assert contexts == [1]  # only the GPU this process already uses


def test_the_prefix_cache_gets_what_the_plan_leaves_on_the_cpu(monkeypatch):
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.runtime import device_map
    from tramontane.engine.runtime.device_map import Budget, plan_devices, sizes_of_files
    from tramontane.engine.runtime.local import LocalEngine

    with open_gguf(TINY) as gf:
        sizes = sizes_of_files(gf)
    need = plan_devices(sizes, Machine((), DeviceInfo("cpu", 64 * GiB)), Budget(512)).placements[0].total
    spare = 100 << 20
    monkeypatch.setattr(device_map, "detect_machine", lambda: Machine((), DeviceInfo("cpu", 2 * GiB + need + spare)))
    eng = LocalEngine(TINY, device="cpu", kv_host_budget_mb=2048)
    try:
        # not the 2 GiB asked: the model and its KV come first; the chats not running keep
        # their KV in what the plan leaves, on a CPU-only engine as more blocks of the pool
        # (no host tier beside it)
        per_token = eng.model.kv_bytes_per_token()
        assert eng.prefix_cache.budget == 0
        assert eng.pool.n_blocks == -(-(512 + spare // per_token) // BLOCK_TOKENS)
    finally:
        eng.close()
