"""VisionTower on CUDA: weights keep the file dtype, output agrees with the CPU float32 path.

Skipped without a GPU. Tolerances (per-token cosine vs the CPU float32 encode of the same file):
f16 file ≥ 0.999 (matmuls in tower_dtype: bf16 on Ampere and newer, measured 0.99993 on the CPU's
emulation in test_vision.py, float32 before); bf16 file with bf16 matmuls ≥ 0.99; Q8_0 through
the Triton kernels with bf16 activations ≥ 0.99.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tramontane.engine.mistral3.vision import VisionTower, tower_dtype

from support import FIXTURES
from support.gguf_edit import rewrite_gguf

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
gguf = pytest.importorskip("gguf")

SIZES = [(100, 60), (50, 120), (640, 480)]


def images(tower):
    rng = np.random.default_rng(0)
    out = []
    for w, h in SIZES:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
        out.append(tower.preprocess(buf.getvalue())[0])
    return out


def requantized(tmp_path, qtype: str) -> str:
    src = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf")
    kind = gguf.GGMLQuantizationType[qtype]
    replace = {}
    for t in gguf.GGUFReader(src).tensors:
        if len(t.shape) == 2:
            rows = np.array(t.data).reshape(int(t.shape[1]), int(t.shape[0]))
            replace[t.name] = (gguf.quants.quantize(rows, kind), kind)
    return str(rewrite_gguf(src, tmp_path / f"mmproj-{qtype}.gguf", replace_tensors=replace))


@pytest.mark.parametrize("kind, min_cos", [("f16", 0.999), ("BF16", 0.99), ("Q8_0", 0.99)])
def test_cuda_matches_cpu(tmp_path, kind, min_cos):
    path = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f16.gguf") if kind == "f16" else requantized(tmp_path, kind)
    cpu = VisionTower.load(path, cpu_bf16=False)  # the float32 reference, also on CPUs with bf16
    gpu = VisionTower.load(path, device="cuda")
    assert gpu.dtype == tower_dtype("cuda")  # never fp16 (test_vision_fp16.py)
    for blk in gpu.blocks:  # file dtype kept on the GPU: no float32 copy of the tower
        for w in (blk.q, blk.k, blk.v, blk.o, blk.gate, blk.up, blk.down):
            assert w.data.device.type == "cuda" and w.data.dtype in (torch.float16, torch.bfloat16, torch.uint8)
    pixels = images(cpu)
    for ref, out in zip(cpu.encode_images(pixels), gpu.encode_images(pixels)):
        cos = F.cosine_similarity(out.double().cpu(), ref.double(), dim=-1)
        assert cos.min().item() >= min_cos, cos.min().item()
