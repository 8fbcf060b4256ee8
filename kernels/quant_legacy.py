"""Legacy 32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Block layouts (ggml-common.h), little endian:
  Q4_0 (18 B): f16 d, 16 B nibbles          x = d * (q - 8)
  Q4_1 (20 B): f16 d, f16 m, 16 B nibbles   x = d * q + m
  Q5_0 (22 B): f16 d, u32 qh, 16 B nibbles  x = d * (q | h<<4 - 16)
  Q5_1 (24 B): f16 d, f16 m, u32 qh, 16 B   x = d * (q | h<<4) + m
  Q8_0 (34 B): f16 d, 32 x int8             x = d * q
Element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of byte j-16;
its fifth bit is bit j of qh.
The float operations are done in the same order as gguf-py (each rounded to float32) so the
results are bit-identical to `gguf.quants.dequantize`.
"""
from __future__ import annotations

import torch

from .ggml_types import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, f16_field
from .triton_compat import tl, triton

# ---------------------------------------------------------------- torch references


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, 16) bytes -> (n, 32) values 0..15 in element order."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) bytes of a little-endian u32 -> (n, 32) bits, bit j for element j."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], 32)


def dequantize_q4_0_ref(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    q = _nibbles(blocks[:, 2:18]).to(torch.int8) - 8
    return d * q.to(torch.float32)


def dequantize_q4_1_ref(blocks: torch.Tensor) -> torch.Tensor:
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    q = _nibbles(blocks[:, 4:20]).to(torch.float32)
    return d * q + m


def dequantize_q5_0_ref(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    q = (_nibbles(blocks[:, 6:22]) | (_fifth_bits(blocks[:, 2:6]) << 4)).to(torch.int8) - 16
    return d * q.to(torch.float32)


def dequantize_q5_1_ref(blocks: torch.Tensor) -> torch.Tensor:
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    q = (_nibbles(blocks[:, 8:24]) | (_fifth_bits(blocks[:, 4:8]) << 4)).to(torch.float32)
    return d * q + m


def dequantize_q8_0_ref(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    q = blocks[:, 2:34].contiguous().view(torch.int8).to(torch.float32)
    return q * d


REFERENCES = {
    Q4_0: dequantize_q4_0_ref,
    Q4_1: dequantize_q4_1_ref,
    Q5_0: dequantize_q5_0_ref,
    Q5_1: dequantize_q5_1_ref,
    Q8_0: dequantize_q8_0_ref,
}
