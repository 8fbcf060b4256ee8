"""Non-linear 4-bit types IQ4_NL and IQ4_XS: nibbles index a fixed 16-entry table.

  IQ4_NL (18 B, 32 elements): f16 d @0, 16 B nibbles @2 (like Q4_0)    x = d * K[q]
  IQ4_XS (136 B, 256 elements): f16 d @0, u16 scales_h @2, scales_l[4] @4, qs[128] @8;
    sub-block b (32 elements) has scale (lo4 | hi2 << 4) - 32 with lo4 = nibble b%2 of
    scales_l[b//2], hi2 = bits 2b of scales_h; element b*32 + h*16 + l = nibble h of byte b*16+l.
Bit-identical to gguf.quants (same float32 operation order).
"""
from __future__ import annotations

import torch

from .ggml_types import IQ4_NL, IQ4_XS, f16_field
from .triton_compat import tl, triton

KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

_tables: dict[torch.device, torch.Tensor] = {}


def kvalues_table(device: torch.device) -> torch.Tensor:
    """The 16 IQ4 values as float32 on `device` (cached; the Triton kernels gather from it)."""
    device = torch.device(device)
    if device not in _tables:
        _tables[device] = torch.tensor(KVALUES, dtype=torch.float32, device=device)
    return _tables[device]


def _lookup(idx: torch.Tensor) -> torch.Tensor:
    return kvalues_table(idx.device)[idx.long()]


def dequantize_iq4_nl_ref(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    qs = blocks[:, 2:18]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1)
    return d * _lookup(q)


def dequantize_iq4_xs_ref(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = f16_field(blocks, 0)
    scales_h = blocks[:, 2].to(torch.int32) | (blocks[:, 3].to(torch.int32) << 8)  # (n,)
    sub = torch.arange(8, device=blocks.device)
    high = (scales_h[:, None] >> (2 * sub)) & 3
    low = (blocks[:, 4 + sub // 2].to(torch.int32) >> (4 * (sub % 2))) & 0x0F
    scale = ((low | (high << 4)) - 32).to(torch.float32)  # (n, 8)
    dl = (d * scale).reshape(n, 8, 1)
    qs = blocks[:, 8:136].reshape(n, 8, 1, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=2).reshape(n, 8, 32)
    return (dl * _lookup(q)).reshape(n, 256)


REFERENCES = {IQ4_NL: dequantize_iq4_nl_ref, IQ4_XS: dequantize_iq4_xs_ref}


# ---------------------------------------------------------------- Triton tiles (see quant_legacy)
from .quant_legacy import _legacy_blocks, _nibble_tile, load_f16, load_u8  # noqa: E402


@triton.jit
def tile_iq4_nl(rowp, u, n_blocks, rmask, table_ptr):
    base, mask = _legacy_blocks(rowp, u, n_blocks, rmask, 18)
    q, col = _nibble_tile(base, mask, 2)
    return load_f16(base, mask) * tl.load(table_ptr + q), col


@triton.jit
def tile_iq4_xs(rowp, u, rmask, table_ptr):
    base = rowp + u * 136
    p = tl.arange(0, 2)[None, :, None, None]
    g = tl.arange(0, 8)[None, None, :, None]  # 32-element sub-block
    s = tl.arange(0, 16)[None, None, None, :]
    q = (load_u8(base + 8 + g * 16 + s, rmask) >> (p * 4)) & 0x0F
    scales_h = load_u8(base + 2, rmask) | (load_u8(base + 3, rmask) << 8)
    low = (load_u8(base + 4 + g // 2, rmask) >> ((g % 2) * 4)) & 0x0F
    high = (scales_h >> (g * 2)) & 3
    dl = load_f16(base, rmask) * ((low | (high << 4)) - 32).to(tl.float32)
    return dl * tl.load(table_ptr + q), g * 32 + p * 16 + s
