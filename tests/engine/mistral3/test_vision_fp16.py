"""GPUs without bf16 (before Ampere): the Pixtral tower runs in float32, never fp16, whose
largest value (65504) real images' MLP activations pass. Checked on the CPU against HF
transformers in float32 on a tower whose MLP weights are scaled up (activations ~3e5)."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

from support import FIXTURES
from tramontane.engine.mistral3.vision import VisionTower, tower_dtype
from tramontane.kernels.linear import QWeight

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("float32_cpu_path")

SCALE = 300.0  # on ffn_gate and ffn_up of every block: MLP products reach ~3.7e5 (fp16 max 65504)


def _png(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _scaled_tower(dtype):
    tower = VisionTower.load(os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf"), dtype=dtype)
    for b in tower.blocks:
        b.gate = QWeight(b.gate.ggml_type, b.gate.shape, b.gate.data * SCALE)
        b.up = QWeight(b.up.ggml_type, b.up.shape, b.up.data * SCALE)
    return tower


def _scaled_hf():
    model = transformers.Mistral3ForConditionalGeneration.from_pretrained(
        os.path.join(FIXTURES, "mistral3_tiny"), dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.vision_tower.transformer.layers:
            layer.feed_forward.gate_proj.weight.mul_(SCALE)
            layer.feed_forward.up_proj.weight.mul_(SCALE)
    return model


def test_the_tower_dtype_is_never_fp16(monkeypatch):
    assert tower_dtype("cpu") == torch.float32
    for capability, want in (((7, 5), torch.float32), ((6, 1), torch.float32), ((8, 0), torch.bfloat16),
                             ((12, 0), torch.bfloat16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert tower_dtype("cuda:0") == want


def test_large_activations_stay_finite_and_match_hf_in_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    tower = _scaled_tower(tower_dtype("cuda:0"))
    assert tower.dtype == torch.float32
    peak = [0.0]
    inner = tower._linear

    def watch(x, w):
        y = inner(x, w)
        peak[0] = max(peak[0], y.abs().max().item())
        return y

    tower._linear = watch
    pixels, rows, cols = tower.preprocess(_png(100, 60, seed=1))
    ours = tower.encode(pixels)
    assert peak[0] > 65504 * 2  # the test's activations are out of fp16's range
    hf = _scaled_hf()
    with torch.no_grad():
        ref = hf.get_image_features(pixel_values=pixels[None], image_sizes=torch.tensor([pixels.shape[1:]]))
    ref = torch.cat(list(ref.pooler_output if hasattr(ref, "pooler_output") else ref), 0).reshape(-1, ours.shape[1])
    assert torch.isfinite(ours).all() and ours.shape == ref.shape == (rows * cols, tower.text_hidden)
    cos = torch.nn.functional.cosine_similarity(ours.double(), ref.double(), dim=-1)
    assert cos.min().item() >= 0.99999
    # what fp16 matmuls (default_dtype on that GPU) would have given: overflow
    half = _scaled_tower(torch.float16).encode(pixels)
    assert not torch.isfinite(half).all()
