"""The vision tower's float weights are converted once, at load, to its matmul dtype where that
differs from the file's (a GPU's bf16; here the CPU with an explicit half dtype, which runs the
same code): no call casts a weight again, outputs equal the old per-call cast bit for bit, and
the planner counts the bytes the tower really keeps. The CPU's float32 path (16-bit weights read
in place) and its bf16 path (tests/engine/mistral3/test_vision_bf16.py) are left as they were.

Tolerance: none. The per-call path cast the weight to the tower dtype and ran F.linear; the
converted weight is that same cast done once, and the float32 torch path (cpu_exact) then runs
the same F.linear, so the outputs must be identical."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from support import FIXTURES
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.vision import VisionTower, in_dtype, tower_dtype
from tramontane.engine.runtime.device_map import (DeviceInfo, Machine, plan_devices, sizes_of_files,
                                                  vision_tower_bytes)
from tramontane.kernels.linear import linear

pytestmark = pytest.mark.usefixtures("float32_cpu_path")

CASES = [("f16", torch.bfloat16), ("f32", torch.bfloat16), ("f32", torch.float16)]


def _path(kind: str) -> str:
    return f"{FIXTURES}/mmproj-mistral3_tiny-{kind}.gguf"


def _pixels(tower):
    rng = np.random.default_rng(3)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)).save(buf, "PNG")
    return tower.preprocess(buf.getvalue())[0]


def _matrices(tower):
    return [tower.patch, tower.merger, tower.mm1, tower.mm2] + [
        getattr(b, n) for b in tower.blocks for n in ("q", "k", "v", "o", "gate", "up", "down")]


def _per_call_cast_tower(kind: str, dtype: torch.dtype):
    """The tower as it ran before: file-dtype weights, each cast to `dtype` inside every call."""
    tower = VisionTower.load(_path(kind), dtype=torch.float32, cpu_bf16=False)  # keeps the file's dtype
    tower.dtype = dtype

    def per_call(x, w):
        x = x.to(dtype)
        if not w.is_quantized and w.data.dtype != dtype:
            return F.linear(x, w.data.to(dtype))
        return linear(x, w)

    tower._linear = per_call
    return tower


def _weight_casts(tower, monkeypatch) -> list:
    """Every Tensor.to called on one of the tower's weights while it encodes an image."""
    weights = {w.data.data_ptr() for w in _matrices(tower)}
    seen = []
    to = torch.Tensor.to

    def watched(self, *args, **kwargs):
        if self.data_ptr() in weights:
            seen.append(tuple(self.shape))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", watched)
    try:
        tower.encode(_pixels(tower))
    finally:
        monkeypatch.setattr(torch.Tensor, "to", to)
    return seen


@pytest.mark.parametrize("kind, dtype", CASES)
def test_weights_are_converted_once_and_never_cast_per_call(kind, dtype, monkeypatch):
    tower = VisionTower.load(_path(kind), dtype=dtype, cpu_bf16=False)
    assert all(w.data.dtype == dtype for w in _matrices(tower))
    assert _weight_casts(tower, monkeypatch) == []
    old = _per_call_cast_tower(kind, dtype)
    assert len(_weight_casts(old, monkeypatch)) >= len(_matrices(old))  # the watch does see casts


@pytest.mark.parametrize("kind, dtype", CASES)
def test_outputs_equal_the_per_call_cast(kind, dtype):
    tower = VisionTower.load(_path(kind), dtype=dtype, cpu_bf16=False)
    old = _per_call_cast_tower(kind, dtype)
    pixels = _pixels(tower)
    assert torch.equal(tower.encode(pixels), old.encode(pixels))


def test_the_cpu_float32_path_keeps_the_files_weights():
    tower = VisionTower.load(_path("f16"), dtype=torch.float32, cpu_bf16=False)
    assert all(w.data.dtype == torch.float16 for w in _matrices(tower))
    assert tower.mm2.mapped  # still the file's own pages (q/k rows are reordered copies)


@pytest.mark.parametrize("kind, dtype, device_kind", [("f16", torch.bfloat16, "cuda"), ("f32", torch.bfloat16, "cuda"),
                                                      ("f16", torch.float32, "cpu"), ("f32", torch.float32, "cpu")])
def test_the_planner_counts_what_the_tower_keeps(kind, dtype, device_kind):
    """A GPU's tower (bf16, the planner's GPU compute dtype) and the CPU's float32 one: the
    bytes of every tensor the loaded tower holds equal the plan's "vision tower" part."""
    tower = VisionTower.load(_path(kind), dtype=dtype, cpu_bf16=False)
    kept = sum(w.nbytes for w in _matrices(tower)) + _vector_bytes(tower)
    with open_gguf(f"{FIXTURES}/mistral3_tiny-f32.gguf") as gf, open_gguf(_path(kind)) as mm:
        sizes = sizes_of_files(gf, mm)
    assert vision_tower_bytes(sizes, device_kind) == kept
    if kind == "f32" and device_kind == "cuda":
        assert kept < sizes.vision_bytes  # the float32 file's matrices are kept at half their size


def _vector_bytes(tower) -> int:
    vectors = [tower.pre_norm, tower.mm_norm] + [t for b in tower.blocks for t in (b.attn_norm, b.ffn_norm)]
    vectors += [tower.patch_bias] if tower.patch_bias is not None else []
    return sum(v.numel() * v.element_size() for v in vectors)


@pytest.mark.parametrize("kind", ["f16", "f32"])
@pytest.mark.parametrize("capability, want", [((7, 0), torch.float32), ((7, 5), torch.float32),
                                              ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_a_gpus_capability_gives_the_tower_dtype_the_planner_counts(monkeypatch, kind, capability, want):
    """V100 (7.0) and T4 (7.5) have no bf16: the tower runs float32 there, and the planner, given
    the capability in DeviceInfo, counts its float matrices at 4 bytes a value; Ampere (8.0) and
    Hopper (9.0) run bf16, 2 bytes. No GPU here: the capability is faked for tower_dtype, and the
    GPU's conversion is the loader's own in_dtype applied to the file's weights (what _load does
    to every matrix off the CPU's float32 path)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    dtype = tower_dtype("cuda:0")
    assert dtype == want
    tower = VisionTower.load(_path(kind), dtype=torch.float32, cpu_bf16=False)  # the file's weights as read
    kept = sum(in_dtype(w, dtype).nbytes for w in _matrices(tower)) + _vector_bytes(tower)
    with open_gguf(f"{FIXTURES}/mistral3_tiny-f32.gguf") as gf, open_gguf(_path(kind)) as mm:
        sizes = sizes_of_files(gf, mm)
    gpu = DeviceInfo("cuda:0", 24 << 30, "simulated", capability=capability)
    plan = plan_devices(sizes, Machine((gpu,), DeviceInfo("cpu", 64 << 30, "simulated")))
    assert plan.vision_device == "cuda:0" and plan.placements[0].parts["vision tower"] == kept
    if kind == "f16" and want == torch.float32:
        assert kept > sizes.vision_bytes  # twice the file's f16 matrices: what the plan used to miss


@pytest.mark.parametrize("capability, text_dtype, tower", [((7, 5), torch.float16, torch.float32),
                                                           ((8, 0), torch.bfloat16, torch.bfloat16)])
def test_the_text_model_and_the_tower_ask_the_same_question_of_a_gpu(monkeypatch, capability, text_dtype, tower):
    """One rule for "has this GPU bf16 units" (host.cuda_has_bf16): the text model falls back to
    f16 where the tower falls back to float32 (its activations overflow f16), on the same GPUs."""
    from tramontane.engine.mistral3.text import default_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert default_dtype(torch.device("cuda:0")) == text_dtype and tower_dtype("cuda:0") == tower
