"""Reference data for the native CPU kernel tests: random but valid GGUF blocks of every type,
their gguf.quants dequantization, and a float64 model of the kernels' activation quantization."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from tramontane.kernels import ggml_types as gt

# (byte offset of each f16 scale field in a block, its magnitude range)
F16_FIELDS = {
    gt.Q4_0: [(0, 1.0)], gt.Q4_1: [(0, 1.0), (2, 4.0)], gt.Q5_0: [(0, 1.0)], gt.Q5_1: [(0, 1.0), (2, 8.0)],
    gt.Q8_0: [(0, 1.0)], gt.IQ4_NL: [(0, 1.0)],
    gt.Q2_K: [(80, 1.0), (82, 1.0)], gt.Q3_K: [(108, 1.0)], gt.Q4_K: [(0, 1.0), (2, 1.0)],
    gt.Q5_K: [(0, 1.0), (2, 1.0)], gt.Q6_K: [(208, 1.0)], gt.IQ4_XS: [(0, 1.0)],
}
FLOAT_NP = {gt.F32: np.float32, gt.F16: np.float16}


def make_weight(ggml_type: int, rows: int, cols: int, rng: np.random.Generator):
    """(raw uint8 (rows, row_bytes), dequantized float32 (rows, cols) by gguf.quants)."""
    info = gt.type_info(ggml_type)
    if ggml_type in FLOAT_NP:
        w = rng.standard_normal((rows, cols)).astype(FLOAT_NP[ggml_type])
        return w.view(np.uint8).reshape(rows, -1), w.astype(np.float32)
    if ggml_type == gt.BF16:
        w32 = rng.standard_normal((rows, cols)).astype(np.float32)
        bits = (w32.view(np.uint32) >> 16).astype(np.uint16)
        raw = bits.view(np.uint8).reshape(rows, -1)
        return raw, quants.dequantize(raw, QT.BF16).reshape(rows, cols)
    nb = cols // info.block_size
    raw = rng.integers(0, 256, size=(rows * nb, info.type_size), dtype=np.uint8)
    for off, mag in F16_FIELDS[ggml_type]:
        v = (rng.uniform(0.25, 1.0, rows * nb) * mag * rng.choice([-1, 1], rows * nb)).astype(np.float16)
        if off in (2, 82) and ggml_type in (gt.Q2_K, gt.Q4_K, gt.Q5_K):
            v = np.abs(v)  # dmin
        raw[:, off:off + 2] = v.view(np.uint8).reshape(-1, 2)
    raw = raw.reshape(rows, nb * info.type_size)
    deq = quants.dequantize(raw, QT(ggml_type)).reshape(rows, cols).astype(np.float32)
    return raw, deq


def quantize_rows(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' activation quantization, in numpy: per block of `block`, d = amax / 127 and
    q = round-half-even(x * (1 / d)) in float32. Returns (q as float64 (n, k), d per element)."""
    n, k = x.shape
    xb = x.astype(np.float32).reshape(n, k // block, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))
    de = np.broadcast_to(d, xb.shape)
    return q.reshape(n, k).astype(np.float64), de.reshape(n, k).astype(np.float64)


def act_block(ggml_type: int) -> int | None:
    """Block size of the activation quantization a type uses (None: float activations)."""
    if ggml_type in (gt.F32, gt.F16, gt.BF16):
        return None
    return 256 if gt.type_info(ggml_type).block_size == 256 else 32


def attention_reference(q, keys, values, start):
    """Causal attention in float64 by sdpa: q (T, H, d) at positions start.. over cached keys and
    values (Hkv, capacity, d) as stored (float16 widened exactly), bottom-right causal, GQA by
    expansion; (T, H * dv)."""
    import torch
    import torch.nn.functional as F

    T, H, d = q.shape
    rep = H // keys.shape[0]
    end = start + T
    k = keys[:, :end].double().repeat_interleave(rep, 0)[None]
    v = values[:, :end].double().repeat_interleave(rep, 0)[None]
    mask = torch.ones(T, end, dtype=torch.bool).tril(start)
    o = F.scaled_dot_product_attention(q.double().transpose(0, 1)[None], k, v, attn_mask=mask)
    return o[0].transpose(0, 1).reshape(T, -1)


def rope_reference(x, cos, sin):
    """Rotary embedding of interleaved pairs (GGUF's row order) in torch: x (T, H, d), cos and
    sin (T, d) with each angle repeated for its pair."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos[:, None, :] + swapped * sin[:, None, :]
