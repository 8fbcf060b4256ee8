"""The Pixtral tower on a Q8_0 mmproj on the CPU, both ways (engine/mistral3/vision.py): the
native kernels' int8 path (`_NativeSteps`, cpu_bf16=False or a CPU without bf16 dot products)
and the bf16 path on matrices dequantized once at load (the default where the CPU has bf16 dot
products), against HF transformers' PixtralVisionModel + Mistral3MultiModalProjector in float32
running the file's own numbers (gguf.quants.dequantize of every quantized matrix, Q/K rows
un-permuted).

The projector is a small random one (hidden 128, 4 heads of 32, ffn 256, 3 layers) written as an
f16 llama.cpp-layout mmproj, then quantized to Q8_0 the way llama.cpp's clip quantizer picks its
tensors (tests/support/quantize_mmproj.py: 2-D `*weight` matrices; the conv and norms stay).

Tolerance, from the kernels' int8 activations (llama.cpp's method: each block of 32 inputs rounded
to int8 with scale amax/127). The rounding error of one input is uniform in ±scale/2, RMS
scale/sqrt(12) = amax/(127·sqrt(12)); amax is at most sqrt(32) times the block's RMS, so one
matmul's relative RMS error is at most sqrt(32)/(127·sqrt(12)) ≈ 0.013. The int8 matmuls in the
deepest chain: 3 × (qkv, o, gate/up, down) + merger, linear_1, linear_2 = 15; independent errors
add in quadrature: sqrt(15) · 0.013 ≈ 0.05 relative error per output token, the bound. It must
also be above 2^-14: a path that silently ran float32 (error ~1e-7) would not be this test's
subject. The bf16 path's bound is test_vision_bf16.py's (bf16 rounding of each matmul's input,
weight and output, 24 matmuls deep): 2 · sqrt(24) · 2^-9 ≈ 0.019.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from tramontane.engine.mistral3 import vision as vision_module
from tramontane.engine.mistral3.vision import VisionTower
from tramontane.kernels import cpu_native
from support.cpu_kernels import cpu_exact

from support import pixtral_hf
from support.pixtral_hf import hf_encode, photo, relative_errors
from support.quantize_mmproj import quantized_mmproj_copy

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not cpu_native.AVAILABLE, reason="the native CPU kernels are not built")

SHAPE = dict(hidden=128, layers=3, heads=4, ffn=256, text_hidden=96)
IMAGE_SIZE = 112
INT8_MATMULS_DEEP = 4 * SHAPE["layers"] + 3  # see the docstring
INT8_RMS = np.sqrt(32) / (127 * np.sqrt(12))  # one matmul's relative RMS error, at most
BOUND = np.sqrt(INT8_MATMULS_DEEP) * INT8_RMS
BF16_BOUND = 2 * np.sqrt(3 + 6 * SHAPE["layers"] + 3) * 2.0 ** -9


def load_file_weights(hf, path, n_head: int) -> None:
    """Put the file's numbers (dequantized by gguf-py, Q/K rows un-permuted) into the HF modules."""
    tower, projector = hf
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    params = {"v.patch_embd.weight": tower.patch_conv.weight, "v.pre_ln.weight": tower.ln_pre.weight,
              "mm.input_norm.weight": projector.norm.weight,
              "mm.patch_merger.weight": projector.patch_merger.merging_layer.weight,
              "mm.1.weight": projector.linear_1.weight, "mm.2.weight": projector.linear_2.weight}
    for i, layer in enumerate(tower.transformer.layers):
        a, f = layer.attention, layer.feed_forward
        for name, p in (("ln1", layer.attention_norm), ("attn_q", a.q_proj), ("attn_k", a.k_proj),
                        ("attn_v", a.v_proj), ("attn_out", a.o_proj), ("ln2", layer.ffn_norm),
                        ("ffn_gate", f.gate_proj), ("ffn_up", f.up_proj), ("ffn_down", f.down_proj)):
            params[f"v.blk.{i}.{name}.weight"] = p.weight
    assert set(params) == set(tensors)
    with torch.no_grad():
        for name, param in params.items():
            t = tensors[name]
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(param.shape)
            if name.endswith(("attn_q.weight", "attn_k.weight")):  # file = permute(HF): invert
                values = values.reshape(n_head, -1, 2, values.shape[-1]).swapaxes(1, 2).reshape(param.shape)
            param.copy_(torch.from_numpy(np.array(values, dtype=np.float32)))


@pytest.fixture(scope="module", params=["silu", "gelu"])
def towers(request, tmp_path_factory):
    """(our tower on the Q8_0 file, HF float32 on the same file's numbers)."""
    hf = pixtral_hf.build_hf(SHAPE, IMAGE_SIZE, request.param, seed=2, attention="eager")
    folder = tmp_path_factory.mktemp("q8")
    f16 = folder / f"mmproj-{request.param}-f16.gguf"  # as llama.cpp converts, then quantizes
    pixtral_hf.write_mmproj(f16, *hf, SHAPE, IMAGE_SIZE, request.param, np.float16)
    q8 = quantized_mmproj_copy(f16, folder / f"mmproj-{request.param}-Q8_0.gguf")
    load_file_weights(hf, q8, SHAPE["heads"])
    return VisionTower.load(q8, cpu_bf16=False), hf, q8


def test_q8_0_file_keeps_clips_tensor_choice(towers):
    tower, _, _ = towers
    q8 = int(gguf.GGMLQuantizationType.Q8_0)
    assert all(getattr(b, m).ggml_type == q8 for b in tower.blocks for m in ("q", "k", "v", "o", "gate", "up", "down"))
    assert tower.merger.ggml_type == tower.mm1.ggml_type == tower.mm2.ggml_type == q8
    assert tower.patch.ggml_type != q8  # the 4-D patch conv is left as it was


def test_q8_0_tower_matches_hf_on_the_files_numbers(towers):
    tower, hf, _ = towers
    assert tower.native and tower.bf16 is None
    images = [photo(112, 84, 1), photo(60, 100, 2)]
    pixels = [tower.preprocess(d)[0] for d in images]
    ours = tower.encode_images(pixels)  # both images in one call (per-image attention)
    # no weight was dequantized for the call (exact mode's reference below caches float32 copies)
    assert all(getattr(b, m)._dense is None for b in tower.blocks for m in ("q", "k", "v", "o", "gate", "up", "down"))
    with cpu_exact():
        exact = tower.encode_images(pixels)
    for px, out, out32 in zip(pixels, ours, exact):
        ref = hf_encode(hf, px)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        err = relative_errors(out, ref)
        assert err.max().item() <= BOUND, (err.max().item(), BOUND)
        assert err.max().item() > 2.0 ** -14  # int8 activations really ran
        assert relative_errors(out32, ref).max().item() < 1e-5  # exact mode: float32 on dequantized weights


def test_heads_and_rows_split_over_threads_drop_nothing(monkeypatch, towers):
    """Attention split by heads (and GELU by rows) over 1 or 3 threads: every head and row is
    computed once, so the outputs are bit for bit the same (4 heads over 3 threads: 1, 1, 2)."""
    tower, hf, _ = towers
    pixels = tower.preprocess(photo(112, 84, 4))[0]
    monkeypatch.setattr(vision_module.cpu_native, "threads", lambda: 1)
    one = tower.encode(pixels)
    calls = []
    inner = tower._attend

    def watch(q, *args):
        calls.append(q.shape[-1] // tower.cfg.head_dim)
        return inner(q, *args)

    monkeypatch.setattr(tower, "_attend", watch)
    monkeypatch.setattr(vision_module.cpu_native, "threads", lambda: 3)
    three = tower.encode(pixels)
    assert sorted(calls[:3]) == [1, 1, 2] and len(calls) == 3 * SHAPE["layers"]
    assert torch.equal(three, one)
    assert relative_errors(three, hf_encode(hf, pixels)).max().item() <= BOUND


def test_a_dropped_head_is_caught(monkeypatch, towers):
    """The split test's check has teeth: with one head's attention left out (its columns kept at
    zero), the outputs differ from the one-thread run. The int8 bound alone would not catch it on
    this tiny tower (relative error 0.02 against the bound's 0.05: the residual stream carries
    most of each token), which is why the split test compares bit for bit."""
    tower, hf, _ = towers
    pixels = tower.preprocess(photo(112, 84, 4))[0]
    monkeypatch.setattr(vision_module.cpu_native, "threads", lambda: 1)
    one = tower.encode(pixels)
    monkeypatch.setattr(vision_module.cpu_native, "threads", lambda: 3)
    monkeypatch.setattr(vision_module, "split_ranges", lambda n, parts: [(0, 1), (1, 2), (2, 3)] if n == 4
                        else [(n * i // parts, n * (i + 1) // parts) for i in range(parts)])
    real_empty = torch.empty  # a dropped head's columns keep the buffer's bytes: zeros here

    def zeroed_empty(*args, **kwargs):
        return real_empty(*args, **kwargs).zero_()

    monkeypatch.setattr(torch, "empty", zeroed_empty)
    broken = tower.encode(pixels)
    monkeypatch.setattr(torch, "empty", real_empty)
    assert not torch.equal(broken, one)
    assert relative_errors(broken, one).max().item() > 1e-3  # far beyond float rounding


def test_q8_0_tower_in_bf16_matches_hf_on_the_files_numbers(towers):
    """The bf16 path on the Q8_0 file: its matrices dequantized once at load, then bf16 rounding
    only (the reference holds the same dequantized numbers)."""
    _, hf, path = towers
    tower = VisionTower.load(path, cpu_bf16=True)
    assert tower.bf16 is not None and not tower.native
    assert tower.bf16.blocks[0].gate_up.shape == (2 * SHAPE["ffn"], SHAPE["hidden"])
    for seed, (w, h) in enumerate([(112, 84), (60, 100)]):
        px = tower.preprocess(photo(w, h, seed))[0]
        err = relative_errors(tower.encode(px), hf_encode(hf, px))
        assert 2.0 ** -14 < err.max().item() <= BF16_BOUND, (err.max().item(), BF16_BOUND)


def test_which_path_a_file_takes(monkeypatch, towers):
    from support import FIXTURES

    path = towers[2]
    monkeypatch.setattr(vision_module, "cpu_has_bf16_dot", lambda: True)
    q8 = VisionTower.load(path)
    assert q8.bf16 is not None and not q8.native  # the faster path where bf16 dot products exist
    monkeypatch.setattr(vision_module, "cpu_has_bf16_dot", lambda: False)
    q8 = VisionTower.load(path)
    assert q8.bf16 is None and q8.native
    assert not VisionTower.load(FIXTURES / "mmproj-mistral3_tiny-f16.gguf").native
    assert not VisionTower.load(FIXTURES / "mmproj-mistral3_tiny-f32.gguf").native
