"""The Pixtral tower's CPU bf16 path (engine/mistral3/vision.py, `cpu_bf16`) against HF
transformers' PixtralVisionModel + Mistral3MultiModalProjector in float32, and the exact mode's
float32 path kept bit for bit.

The tower is a small random one (hidden 128, 4 heads of 32, ffn 256, 3 layers; built here with
HF the way bench/vision.py builds its towers), its matrices rounded through f16 first and
written as an f16 llama.cpp-layout mmproj: HF in float32 then runs exactly the file's numbers,
and what remains is the bf16 path's own rounding.

Tolerance, from bf16 rounding (8 significant bits: a rounded value is off by at most 2^-9
relative, RMS 2^-9/sqrt(3) for uniform rounding errors). A matmul rounds its input and its weight
(f16 → bf16) and its output: relative RMS error about sqrt(3) · 2^-9/sqrt(3) = 2^-9 ≈ 2e-3 per
matmul. The deepest chain of matmuls here is patch, 3 × (qkv, q·k, p·v, o, gate/up, down), merger,
linear_1, linear_2 = 24; independent errors add in quadrature: sqrt(24) · 2e-3 ≈ 0.01 relative
error per output token. Bound: 2x that, 0.02 (cosine ≥ 1 - 0.02²/2 = 0.9998). It must also be
above 2^-14: a path that silently ran float32 (error ~1e-7) would not be this test's subject.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3 import vision as vision_module
from tramontane.engine.mistral3.vision import VisionTower, cpu_has_bf16_dot
from tramontane.kernels import cpu_native
from support.cpu_kernels import cpu_exact

from support import FIXTURES, pixtral_hf
from support.pixtral_hf import hf_encode, photo, relative_errors
from support.rss import pages_present

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

SHAPE = dict(hidden=128, layers=3, heads=4, ffn=256, text_hidden=96)
IMAGE_SIZE = 112
MATMULS_DEEP = 3 + 6 * SHAPE["layers"] + 3  # the deepest chain of matmuls (see the docstring)
BF16_RMS = 2.0 ** -9  # per matmul: input, weight and output each rounded to 8 bits
BOUND = 2 * np.sqrt(MATMULS_DEEP) * BF16_RMS


def build_hf(activation: str):
    """A random HF tower + projector, matrices rounded through f16 (the file holds them exactly)."""
    return pixtral_hf.build_hf(SHAPE, IMAGE_SIZE, activation, seed=1, attention="eager", f16_exact=True)


def write_mmproj(path, tower, projector, activation: str) -> None:
    pixtral_hf.write_mmproj(path, tower, projector, SHAPE, IMAGE_SIZE, activation)


@pytest.fixture(scope="module", params=["silu", "gelu"])
def towers(request, tmp_path_factory):
    hf = build_hf(request.param)
    path = tmp_path_factory.mktemp("bf16") / f"mmproj-{request.param}-f16.gguf"
    write_mmproj(path, *hf, request.param)
    return VisionTower.load(path, cpu_bf16=True), hf


def test_bf16_tower_matches_hf_float32_within_bf16_rounding(towers):
    tower, hf = towers
    assert tower.bf16 is not None and tower.bf16.blocks[0].qkv.dtype == torch.bfloat16
    images = [photo(112, 84, 1), photo(60, 100, 2)]
    pixels = [tower.preprocess(d)[0] for d in images]
    ours = tower.encode_images(pixels)  # both images in one call (per-image attention)
    with cpu_exact():
        exact = tower.encode_images(pixels)
    for px, out, out32 in zip(pixels, ours, exact):
        ref = hf_encode(hf, px)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        err = relative_errors(out, ref)
        assert err.max().item() <= BOUND, (err.max().item(), BOUND)
        assert err.max().item() > 2.0 ** -14  # bf16 really ran (float32 is ~1e-7 here)
        assert relative_errors(out32, ref).max().item() < 1e-5  # the exact path: float32's error
        cos = torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=-1)
        assert cos.min().item() >= 1 - BOUND ** 2 / 2


def test_exact_mode_is_the_float32_path_bit_for_bit():
    """Under exact mode a tower holding bf16 weights encodes exactly as one without them."""
    path = FIXTURES / "mmproj-mistral3_tiny-f16.gguf"
    with_bf16 = VisionTower.load(path, cpu_bf16=True)
    plain = VisionTower.load(path, cpu_bf16=False)
    assert with_bf16.bf16 is not None and plain.bf16 is None
    pixels = [plain.preprocess(photo(w, h, seed=i))[0] for i, (w, h) in enumerate([(100, 60), (50, 120)])]
    with cpu_exact():
        a = with_bf16.encode_images(pixels)
        b = plain.encode_images(pixels)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    fast = with_bf16.encode_images(pixels)  # outside exact mode the bf16 path runs: not the same bits
    assert not all(torch.equal(x, y) for x, y in zip(fast, b))


def test_which_files_and_cpus_get_bf16_weights(monkeypatch):
    f16, f32 = FIXTURES / "mmproj-mistral3_tiny-f16.gguf", FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
    monkeypatch.setattr(vision_module, "cpu_has_bf16_dot", lambda: True)
    assert VisionTower.load(f16).bf16 is not None
    assert VisionTower.load(f32).bf16 is None  # a float32 file keeps float32
    assert VisionTower.load(f16, dtype=torch.float32).bf16 is None  # an asked-for dtype is kept
    monkeypatch.setattr(vision_module, "cpu_has_bf16_dot", lambda: False)
    assert VisionTower.load(f16).bf16 is None
    assert isinstance(cpu_has_bf16_dot(), bool)


def test_bf16_work_is_split_over_the_pools_threads(monkeypatch, towers):
    """As many threads as the native pool has, each on its rows (or heads): the same numbers up
    to oneDNN's blocking of a smaller matrix (well inside the bf16 bound)."""
    tower, hf = towers
    pixels = tower.preprocess(photo(112, 84, 4))[0]
    monkeypatch.setattr(vision_module.cpu_native, "AVAILABLE", True)
    monkeypatch.setattr(vision_module.cpu_native, "threads", lambda: 1)
    one = tower.encode(pixels)
    seen = set()
    inner = tower._rms

    def watch(x, weight):
        seen.add(threading.get_ident())
        return inner(x, weight)

    monkeypatch.setattr(tower, "_rms", watch)
    monkeypatch.setattr(vision_module.cpu_native, "threads", lambda: 3)
    three = tower.encode(pixels)
    assert len(seen) == 3 and threading.get_ident() in seen
    assert relative_errors(three, one).max().item() <= 2.0 ** -7
    assert relative_errors(three, hf_encode(hf, pixels)).max().item() <= BOUND


def test_split_ranges_cover_every_row_once():
    from tramontane.engine.mistral3.vision import split_ranges

    for n, parts in ((10, 3), (2, 5), (1656, 2), (7, 1)):
        ranges = split_ranges(n, parts)
        assert len(ranges) == min(n, parts) and ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a < b and b == c for (a, b), (c, _) in zip(ranges, ranges[1:] + [(n, n)]))


@pytest.mark.skipif(not (cpu_native.AVAILABLE and os.path.exists("/proc/self/pagemap")),
                    reason="page release needs the native module and Linux's pagemap")
def test_the_reordered_q_k_give_their_file_pages_back(tmp_path):
    """llama.cpp's layout: the loader copies attn_q / attn_k with their rows reordered, reading
    the file's pages, which nothing reads again; they are given back, like the pages of the
    matrices the bf16 path converts (every whole page of them is unmapped after the load)."""
    path = tmp_path / "mmproj-f16.gguf"
    write_mmproj(path, *build_hf("silu"), "silu")
    gf = open_gguf(path)  # the tower keeps it mapped; the views below are of that same mapping
    tower = VisionTower.load(gf, cpu_bf16=True)
    assert tower.bf16 is not None
    names = [f"v.blk.{i}.attn_{r}.weight" for i in range(SHAPE["layers"]) for r in "qk"]
    for name in names:
        pages = pages_present(gf.raw(name))
        assert len(pages) >= 7 and not any(pages), (name, pages)  # 32 KiB of f16 each
    # the observation can see pages: read again from the file, the same bytes as gguf-py reads
    reader = gguf.GGUFReader(path)
    want = next(t for t in reader.tensors if t.name == names[0]).data
    again = gf.raw(names[0])
    assert np.array_equal(again.view(np.float16), want.reshape(-1))
    assert all(pages_present(again))
