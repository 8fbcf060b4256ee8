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


# ---------------------------------------------------------------- Triton tiles
# A "tile" function dequantizes one 256-element unit of BN weight rows in registers and returns
# (values [BN, P, G, S] float32, column-within-unit [1, P, G, S]). S is the innermost run of
# contiguous bytes, so the raw blocks are read coalesced; P are the bit planes taken from those
# bytes (nibbles, 2-bit groups), so each byte is loaded once. The same tiles feed the dequant
# kernel (store at the columns) and the fused matmul (load x at the columns). Legacy types pack
# 8 blocks of 32 into a unit; `valid` masks blocks past the row end.


@triton.jit
def load_f16(p, mask):
    return tl.load(p.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def load_u8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int32)


@triton.jit
def _legacy_blocks(rowp, u, n_blocks, rmask, TYPE_SIZE: tl.constexpr):
    """Pointers to the 8 blocks of unit u ([BN,1,8,1]) and their load mask."""
    g = tl.arange(0, 8)[None, None, :, None]
    blk = u * 8 + g
    return rowp + blk * TYPE_SIZE, rmask & (blk < n_blocks)


@triton.jit
def _nibble_tile(base, mask, QS_OFF: tl.constexpr):
    """Values 0..15 [BN,2,8,16] and columns [1,2,8,16] of 8 blocks' 16 nibble bytes."""
    p = tl.arange(0, 2)[None, :, None, None]
    g = tl.arange(0, 8)[None, None, :, None]
    s = tl.arange(0, 16)[None, None, None, :]
    q = (load_u8(base + QS_OFF + s, mask) >> (p * 4)) & 0x0F
    return q, g * 32 + p * 16 + s


@triton.jit
def _fifth_bit(base, mask, QH_OFF: tl.constexpr):
    p = tl.arange(0, 2)[None, :, None, None]
    s = tl.arange(0, 16)[None, None, None, :]
    qh = (load_u8(base + QH_OFF, mask) | (load_u8(base + QH_OFF + 1, mask) << 8)
          | (load_u8(base + QH_OFF + 2, mask) << 16) | (load_u8(base + QH_OFF + 3, mask) << 24))
    return (qh >> (p * 16 + s)) & 1


@triton.jit
def tile_q4_0(rowp, u, n_blocks, rmask):
    base, mask = _legacy_blocks(rowp, u, n_blocks, rmask, 18)
    q, col = _nibble_tile(base, mask, 2)
    return load_f16(base, mask) * (q - 8).to(tl.float32), col


@triton.jit
def tile_q4_1(rowp, u, n_blocks, rmask):
    base, mask = _legacy_blocks(rowp, u, n_blocks, rmask, 20)
    q, col = _nibble_tile(base, mask, 4)
    return load_f16(base, mask) * q.to(tl.float32) + load_f16(base + 2, mask), col


@triton.jit
def tile_q5_0(rowp, u, n_blocks, rmask):
    base, mask = _legacy_blocks(rowp, u, n_blocks, rmask, 22)
    q, col = _nibble_tile(base, mask, 6)
    q = q | (_fifth_bit(base, mask, 2) << 4)
    return load_f16(base, mask) * (q - 16).to(tl.float32), col


@triton.jit
def tile_q5_1(rowp, u, n_blocks, rmask):
    base, mask = _legacy_blocks(rowp, u, n_blocks, rmask, 24)
    q, col = _nibble_tile(base, mask, 8)
    q = q | (_fifth_bit(base, mask, 4) << 4)
    return load_f16(base, mask) * q.to(tl.float32) + load_f16(base + 2, mask), col


@triton.jit
def tile_q8_0(rowp, u, n_blocks, rmask):
    base, mask = _legacy_blocks(rowp, u, n_blocks, rmask, 34)
    g = tl.arange(0, 8)[None, None, :, None]
    s = tl.arange(0, 32)[None, None, None, :]
    q = tl.load(base + 2 + s, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    return q * load_f16(base, mask), g * 32 + s
