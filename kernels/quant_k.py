"""K-quants: 256-element super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Block layouts (ggml-common.h), byte offsets:
  Q2_K (84 B):  scales[16] @0 (lo4 scale, hi4 min), qs[64] @16 (2 bit), f16 d @80, f16 dmin @82
  Q3_K (110 B): hmask[32] @0, qs[64] @32 (2 bit), scales[12] @96 (16 x 6 bit), f16 d @108
  Q4_K (144 B): f16 d @0, f16 dmin @2, scales[12] @4 (8 x 6 bit scale + min), qs[128] @16
  Q5_K (176 B): f16 d @0, f16 dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
  Q6_K (210 B): ql[128] @0, qh[64] @128, int8 scales[16] @192, f16 d @208
The float operations follow gguf-py's order so results are bit-identical to gguf.quants.
"""
from __future__ import annotations

import torch

from .ggml_types import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, f16_field
from .triton_compat import tl, triton

# ---------------------------------------------------------------- torch references


def _shifted(x: torch.Tensor, shifts: list[int], dim: int) -> torch.Tensor:
    """Insert a new axis `dim` holding x >> s for each s (uint8 arithmetic)."""
    s = torch.tensor(shifts, dtype=torch.uint8, device=x.device)
    shape = [1] * (x.dim() + 1)
    shape[dim] = len(shifts)
    return x.unsqueeze(dim) >> s.reshape(shape)


def _q2_3_low_bits(qs: torch.Tensor) -> torch.Tensor:
    """(n, 64) bytes of 2-bit quants -> (n, 256): element h*128 + s*32 + l = byte h*32+l >> 2s."""
    n = qs.shape[0]
    return (_shifted(qs.reshape(n, 2, 32), [0, 2, 4, 6], 2) & 3).reshape(n, 256)


def _bit_planes(hmask: torch.Tensor) -> torch.Tensor:
    """(n, 32) bytes -> (n, 256): element b*32 + l = bit b of byte l."""
    n = hmask.shape[0]
    return (_shifted(hmask, list(range(8)), 1) & 1).reshape(n, 256)


def dequantize_q2_k_ref(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, 0:16]
    d, dmin = f16_field(blocks, 80), f16_field(blocks, 82)
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = _q2_3_low_bits(blocks[:, 16:80]).reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, 256)


def q3_k_scales(sc: torch.Tensor) -> torch.Tensor:
    """(n, 12) packed bytes -> (n, 16) signed 6-bit scales: low 4 bits from bytes 0-7
    (low nibbles then high nibbles), high 2 bits from bytes 8-11 (2 bits at a time)."""
    n = sc.shape[0]
    low = _shifted(sc[:, 0:8], [0, 4], 1).reshape(n, 16) & 0x0F
    high = _shifted(sc[:, 8:12], [0, 2, 4, 6], 1).reshape(n, 16) & 0x03
    return (low | (high << 4)).to(torch.int8) - 32


def dequantize_q3_k_ref(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = f16_field(blocks, 108)
    dl = (d * q3_k_scales(blocks[:, 96:108]).to(torch.float32)).reshape(n, 16, 1)
    low = _q2_3_low_bits(blocks[:, 32:96]).to(torch.int8)
    # a *clear* hmask bit subtracts 4
    high = (_bit_planes(blocks[:, 0:32]) ^ 1).to(torch.int8) << 2
    q = (low - high).reshape(n, 16, 16).to(torch.float32)
    return (dl * q).reshape(n, 256)


def k_scale_min(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 12) packed bytes of Q4_K/Q5_K -> 8 six-bit scales and 8 six-bit mins (uint8)."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scale, mins


def _k_scaled(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, mn = k_scale_min(blocks[:, 4:16])
    dl = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (dmin * mn.to(torch.float32)).reshape(n, 8, 1)
    return (dl * q.reshape(n, 8, 32).to(torch.float32) - ml).reshape(n, 256)


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, 128) bytes -> (n, 256): element c*64 + h*32 + l = nibble h of byte c*32 + l."""
    n = qs.shape[0]
    return (_shifted(qs.reshape(n, 4, 32), [0, 4], 2) & 0x0F).reshape(n, 256)


def dequantize_q4_k_ref(blocks: torch.Tensor) -> torch.Tensor:
    return _k_scaled(blocks, _k_nibbles(blocks[:, 16:144]))


def dequantize_q5_k_ref(blocks: torch.Tensor) -> torch.Tensor:
    q = _k_nibbles(blocks[:, 48:176]) | (_bit_planes(blocks[:, 16:48]) << 4)
    return _k_scaled(blocks, q)


def dequantize_q6_k_ref(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (f16_field(blocks, 208) * scales).reshape(n, 16, 1)
    # element h*128 + r: low 4 bits = nibble r//64 of ql byte h*64 + r%64,
    # high 2 bits = bits 2*(r//32) of qh byte h*32 + r%32
    ql = (_shifted(blocks[:, 0:128].reshape(n, 2, 64), [0, 4], 2) & 0x0F).reshape(n, 256)
    qh = (_shifted(blocks[:, 128:192].reshape(n, 2, 32), [0, 2, 4, 6], 2) & 0x03).reshape(n, 256)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, 16, 16).to(torch.float32)).reshape(n, 256)


REFERENCES = {
    Q2_K: dequantize_q2_k_ref,
    Q3_K: dequantize_q3_k_ref,
    Q4_K: dequantize_q4_k_ref,
    Q5_K: dequantize_q5_k_ref,
    Q6_K: dequantize_q6_k_ref,
}


# ---------------------------------------------------------------- Triton tiles (see quant_legacy)
# One super-block (256 elements) per unit; `base` = row pointer + u * type_size.
from .quant_legacy import load_f16, load_u8  # noqa: E402


@triton.jit
def _q2_3_layout():
    """Element j = (g//2)*128 + p*32 + (g%2)*16 + s of the 2-bit layouts (Q2_K, Q3_K):
    its bits are (qs byte g*16 + s) >> 2p and its 16-element sub-block is j // 16."""
    p = tl.arange(0, 4)[None, :, None, None]
    g = tl.arange(0, 4)[None, None, :, None]
    s = tl.arange(0, 16)[None, None, None, :]
    col = (g // 2) * 128 + p * 32 + (g % 2) * 16 + s
    sub = (g // 2) * 8 + p * 2 + (g % 2)
    return p, g, s, col, sub


@triton.jit
def tile_q2_k(rowp, u, rmask):
    base = rowp + u * 84
    p, g, s, col, sub = _q2_3_layout()
    q = ((load_u8(base + 16 + g * 16 + s, rmask) >> (p * 2)) & 3).to(tl.float32)
    sc = load_u8(base + sub, rmask)
    dl = load_f16(base + 80, rmask) * (sc & 0x0F).to(tl.float32)
    ml = load_f16(base + 82, rmask) * (sc >> 4).to(tl.float32)
    return dl * q - ml, col


@triton.jit
def tile_q3_k(rowp, u, rmask):
    base = rowp + u * 110
    p, g, s, col, sub = _q2_3_layout()
    low = (load_u8(base + 32 + g * 16 + s, rmask) >> (p * 2)) & 3
    hbit = (load_u8(base + (g % 2) * 16 + s, rmask) >> ((g // 2) * 4 + p)) & 1
    q = (low - ((hbit ^ 1) << 2)).to(tl.float32)
    sc_lo = (load_u8(base + 96 + sub % 8, rmask) >> ((sub // 8) * 4)) & 0x0F
    sc_hi = (load_u8(base + 104 + sub % 4, rmask) >> ((sub // 4) * 2)) & 3
    dl = load_f16(base + 108, rmask) * ((sc_lo | (sc_hi << 4)) - 32).to(tl.float32)
    return dl * q, col


@triton.jit
def _k_scale_min(base, rmask, i):
    """Q4_K/Q5_K 6-bit scale and min of sub-block i (int tensor, 0..7) as float32 d*sc, dmin*m."""
    b_i = load_u8(base + 4 + i, rmask)
    b_i4 = load_u8(base + 8 + i, rmask)  # byte i + 4
    b_im4 = load_u8(base + 4 + (i % 4), rmask)  # byte i - 4 (used for i >= 4)
    lo = i < 4
    sc = tl.where(lo, b_i & 0x3F, (b_i4 & 0x0F) | ((b_im4 >> 6) << 4))
    mn = tl.where(lo, b_i4 & 0x3F, (b_i4 >> 4) | ((b_i >> 6) << 4))
    return load_f16(base, rmask) * sc.to(tl.float32), load_f16(base + 2, rmask) * mn.to(tl.float32)


@triton.jit
def _k_nibble_tile(base, q_lo, q_hi, rmask):
    """[BN, 4 chunks, 32 bytes, 2 nibbles] values of Q4_K/Q5_K and their columns: element
    c*64 + h*32 + l comes from byte c*32 + l, nibble h, of sub-block 2c + h. The nibble axis is
    innermost (tl.join), so both nibbles of a byte stay in the thread that loaded it."""
    g = tl.arange(0, 4)[None, :, None]
    s = tl.arange(0, 32)[None, None, :]
    dl_lo, ml_lo = _k_scale_min(base, rmask, g * 2)
    dl_hi, ml_hi = _k_scale_min(base, rmask, g * 2 + 1)
    v_lo = dl_lo * q_lo.to(tl.float32) - ml_lo
    v_hi = dl_hi * q_hi.to(tl.float32) - ml_hi
    return tl.join(v_lo, v_hi), tl.join(g * 64 + s, g * 64 + 32 + s)


@triton.jit
def tile_q4_k(rowp, u, rmask):
    base = rowp + u * 144
    rmask = tl.reshape(rmask, [rmask.shape[0], 1, 1])
    base = tl.reshape(base, [base.shape[0], 1, 1])
    g = tl.arange(0, 4)[None, :, None]  # 64-element chunk
    s = tl.arange(0, 32)[None, None, :]
    q = load_u8(base + 16 + g * 32 + s, rmask)
    return _k_nibble_tile(base, q & 0x0F, q >> 4, rmask)


@triton.jit
def tile_q5_k(rowp, u, rmask):
    # [BN, 2 nibbles, 4 chunks, 32 bytes] (measured on sm_90 PTX: fewer instructions per element
    # for Q5_K than the joined-nibble layout of Q4_K)
    base = rowp + u * 176
    p = tl.arange(0, 2)[None, :, None, None]
    g = tl.arange(0, 4)[None, None, :, None]
    s = tl.arange(0, 32)[None, None, None, :]
    q = (load_u8(base + 48 + g * 32 + s, rmask) >> (p * 4)) & 0x0F
    q = q | (((load_u8(base + 16 + s, rmask) >> (g * 2 + p)) & 1) << 4)
    dl, ml = _k_scale_min(base, rmask, g * 2 + p)
    return dl * q.to(tl.float32) - ml, g * 64 + p * 32 + s


@triton.jit
def tile_q6_k(rowp, u, rmask):
    base = rowp + u * 210
    # element j = h*128 + p*32 + l with h = g//2, l = (g%2)*16 + s
    p = tl.arange(0, 4)[None, :, None, None]
    g = tl.arange(0, 4)[None, None, :, None]
    s = tl.arange(0, 16)[None, None, None, :]
    h = g // 2
    l = (g % 2) * 16 + s
    # bit work in uint8 (one widening at the end)
    ql = tl.load(base + h * 64 + (p % 2) * 32 + l, mask=rmask, other=0)
    qh = tl.load(base + 128 + h * 32 + l, mask=rmask, other=0)
    ql = (ql >> ((p // 2) * 4).to(tl.uint8)) & 0x0F
    qh = (qh >> (p * 2).to(tl.uint8)) & 3
    q = ((ql | (qh << 4)).to(tl.int32) - 32).to(tl.float32)
    sub = h * 8 + p * 2 + (g % 2)
    sc = tl.load(base + 192 + sub, mask=rmask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    dl = load_f16(base + 208, rmask) * sc
    return dl * q, h * 128 + p * 32 + l


# ---------------------------------------------------------------- scale-after-dot (1-row decode)
# dot_* return, for one 256-element unit of BN rows, partial dot products with one activation
# row x as a small [BN, k] float32 tensor (the caller accumulates it over units and sums it at
# the very end). Instead of dequantizing every element (int->float, scale, offset, then FMA with
# x), they turn the raw integer quants into exact floats (_nibble_f32: 2 instructions), FMA them
# with x into per-sub-block sums that one thread holds whole (the weight words are split into
# separate same-layout tensors rather than a reduced axis, so Triton keeps them in-thread and
# needs no shuffles), and apply the sub-block's scale d*sc once and its offset dmin*m*sum(x)
# once. The float results differ from dequantize-then-matmul only in rounding order (~1e-7).


@triton.jit
def load_x4(x, X_BF16: tl.constexpr):
    """Activations x[0..3] (x: pointers to 4 consecutive ones) as four float32 tensors. bf16
    (X_BF16, 8-byte aligned): one 8-byte load, and bf16 -> f32 is putting the 16 bits on top."""
    if X_BF16:
        v = tl.load(x.to(tl.pointer_type(tl.int64)))
        lo = v.to(tl.uint32)
        hi = (v >> 32).to(tl.uint32)
        return ((lo << 16).to(tl.float32, bitcast=True), (lo & 0xFFFF0000).to(tl.float32, bitcast=True),
                (hi << 16).to(tl.float32, bitcast=True), (hi & 0xFFFF0000).to(tl.float32, bitcast=True))
    else:
        return (tl.load(x).to(tl.float32), tl.load(x + 1).to(tl.float32),
                tl.load(x + 2).to(tl.float32), tl.load(x + 3).to(tl.float32))


@triton.jit
def _nibble_f32(w, p: tl.constexpr, f2p23):
    """The 4-bit field at bit p (<= 19) of uint32 words as float32, exactly, in 2 instructions
    (one LOP3 for and+or, one FADD) instead of shift, mask and int->float convert: OR-ing the
    exponent of 2**(23-p) makes the field's lowest bit the float's unit, so the bits read as
    2**(23-p) + field. f2p23 is the bit pattern of 2.0**23 (0x4B000000) passed at run time:
    with two immediates ptxas would emit two LOP3s."""
    bits = (w & (0xF << p)) | (f2p23 - (p << 23))
    return bits.to(tl.float32, bitcast=True) - (1 << (23 - p))


@triton.jit
def _q4_word_dot(w, x, x_hi, f2p23, dot_lo, dot_hi, xs_lo, xs_hi, X_BF16: tl.constexpr):
    """Adds, over the 4 bytes b of uint32 words w, low nibble * x[b] and high nibble * x_hi[b]
    (x, x_hi: pointers to the 4 activations of each word) to dot_lo / dot_hi, and those
    activations to xs_lo / xs_hi."""
    v = w >> 12  # brings the fields above bit 19 (byte 3 low, bytes 2-3 high) down
    # activations broadcast to the weight tile's shape up front: every later op then stays in
    # the weight's register layout (the per-row copies are the same registers; otherwise
    # Triton reloads x in a second layout for the sums)
    x0, x1, x2, x3 = load_x4(x, X_BF16)
    h0, h1, h2, h3 = load_x4(x_hi, X_BF16)
    x0 = tl.broadcast_to(x0, w.shape)
    x1 = tl.broadcast_to(x1, w.shape)
    x2 = tl.broadcast_to(x2, w.shape)
    x3 = tl.broadcast_to(x3, w.shape)
    h0 = tl.broadcast_to(h0, w.shape)
    h1 = tl.broadcast_to(h1, w.shape)
    h2 = tl.broadcast_to(h2, w.shape)
    h3 = tl.broadcast_to(h3, w.shape)
    dot_lo += _nibble_f32(w, 0, f2p23) * x0
    dot_lo += _nibble_f32(w, 8, f2p23) * x1
    dot_lo += _nibble_f32(w, 16, f2p23) * x2
    dot_lo += _nibble_f32(v, 12, f2p23) * x3
    dot_hi += _nibble_f32(w, 4, f2p23) * h0
    dot_hi += _nibble_f32(w, 12, f2p23) * h1
    dot_hi += _nibble_f32(v, 8, f2p23) * h2
    dot_hi += _nibble_f32(v, 16, f2p23) * h3
    return dot_lo, dot_hi, xs_lo + ((x0 + x1) + (x2 + x3)), xs_hi + ((h0 + h1) + (h2 + h3))


@triton.jit
def _k_scale_min_pair(base, rmask, c):
    """Q4_K/Q5_K d*sc and dmin*m of sub-blocks 2c and 2c + 1 (c: int tensor 0..3) from one
    32-bit and three 16-bit loads (_k_scale_min: three byte loads per sub-block, plus d, dmin)."""
    dm = tl.load(base.to(tl.pointer_type(tl.uint32)), mask=rmask, other=0)  # f16 d | f16 dmin
    d = (dm & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = (dm >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    words = base.to(tl.pointer_type(tl.uint16))
    s_i = tl.load(words + 2 + c, mask=rmask, other=0).to(tl.uint32)  # scale bytes 2c, 2c + 1
    s_i4 = tl.load(words + 4 + c, mask=rmask, other=0).to(tl.uint32)  # bytes 2c + 4, 2c + 5
    s_im4 = tl.load(words + c, mask=rmask, other=0).to(tl.uint32)  # bytes 2c - 4, 2c - 3 (c >= 2)
    lo = c < 2
    # both bytes of each word at once: (byte 0 result) | (byte 1 result) << 8
    sc = tl.where(lo, s_i & 0x3F3F, (s_i4 & 0x0F0F) | ((s_im4 >> 2) & 0x3030))
    mn = tl.where(lo, s_i4 & 0x3F3F, ((s_i4 >> 4) & 0x0F0F) | ((s_i >> 2) & 0x3030))
    return (d * (sc & 0xFF).to(tl.float32), dmin * (mn & 0xFF).to(tl.float32),
            d * (sc >> 8).to(tl.float32), dmin * (mn >> 8).to(tl.float32))


@triton.jit
def dot_q4_k(rowp, u, rmask, xp, f2p23, X_BF16: tl.constexpr):
    """Q4_K: byte c*32 + l holds element c*64 + l (low nibble, sub-block 2c) and c*64 + 32 + l
    (high nibble, sub-block 2c + 1). Tile [BN, 4 chunks c, 4 words j], two halves of 16 bytes
    each, so one thread holds a whole 32-byte chunk (both sub-blocks: one scale computation)."""
    base = tl.reshape(rowp, [rowp.shape[0], 1, 1]) + u * 144
    rmask = tl.reshape(rmask, [rmask.shape[0], 1, 1])
    c = tl.arange(0, 4)[None, :, None]
    j = tl.arange(0, 4)[None, None, :]
    words = (base + 16).to(tl.pointer_type(tl.uint32)) + c * 8 + j
    w_a = tl.load(words, mask=rmask, other=0)
    w_b = tl.load(words + 4, mask=rmask, other=0)
    x = xp + u * 256 + c * 64 + j * 4
    zero = tl.zeros(w_a.shape, tl.float32)
    dot_lo, dot_hi, xs_lo, xs_hi = _q4_word_dot(w_a, x, x + 32, f2p23, zero, zero, zero, zero, X_BF16)
    dot_lo, dot_hi, xs_lo, xs_hi = _q4_word_dot(w_b, x + 16, x + 48, f2p23, dot_lo, dot_hi, xs_lo, xs_hi, X_BF16)
    # sum over the 4 words j first (in-thread), then scale once per sub-block and row
    dot_lo = tl.sum(dot_lo, axis=2)
    dot_hi = tl.sum(dot_hi, axis=2)
    xs_lo = tl.sum(xs_lo, axis=2)
    xs_hi = tl.sum(xs_hi, axis=2)
    base2 = tl.reshape(base, [base.shape[0], 1])
    rmask2 = tl.reshape(rmask, [rmask.shape[0], 1])
    c2 = tl.arange(0, 4)[None, :]
    dl_lo, ml_lo, dl_hi, ml_hi = _k_scale_min_pair(base2, rmask2, c2)
    return dl_lo * dot_lo + dl_hi * dot_hi - (ml_lo * xs_lo + ml_hi * xs_hi)


@triton.jit
def _q6_field(merged, p: tl.constexpr, f2p23_rows):
    """Q6_K quant - 32 as float32, exactly, from the 6-bit field at bit p of a merged word (one
    LOP3, one FADD; see _nibble_f32 for the exponent trick - the -32 folds into the FADD)."""
    bits = (merged & (0x3F << p)) | (f2p23_rows - (p << 23))
    return bits.to(tl.float32, bitcast=True) - ((1 << (23 - p)) + 32)


@triton.jit
def _q6_pair_dot(ql_words, qh_words, rmask, f2p23, x0, x1, y0, y1, z0, z1, v0, v1,
                 dot0, dot1, dot2, dot3):
    """Adds the 8 elements of one byte pair (bytes 0/1 = bits 0-7/8-15 of 16-bit words) to the
    per-p dot products; x/y/z/v: activations of p = 0/1/2/3 for byte 0 and 1."""
    ql_a = tl.load(ql_words, mask=rmask, other=0).to(tl.uint32)  # p = 0 (low nibbles), 2 (high)
    ql_b = tl.load(ql_words + 16, mask=rmask, other=0).to(tl.uint32)  # p = 1, 3
    qh = tl.load(qh_words, mask=rmask, other=0).to(tl.uint32)
    # 6-bit fields of both bytes side by side (no overlap): nibble | 2 qh bits above it
    f0 = (ql_a & 0x0F0F) | ((qh << 4) & 0x3030)  # p = 0 at bits 0, 8
    f2 = (ql_a & 0xF0F0) | ((qh << 4) & 0x30300)  # p = 2 at bits 4, 12
    f1 = (ql_b & 0x0F0F) | ((qh << 2) & 0x3030)  # p = 1 at bits 0, 8
    f3 = (ql_b & 0xF0F0) | ((qh << 2) & 0x30300)  # p = 3 at bits 4, 12
    # one FMA per element into the running sums (a+b*c+d*e would add an FMUL and an FADD)
    dot0 += _q6_field(f0, 0, f2p23) * x0
    dot0 += _q6_field(f0, 8, f2p23) * x1
    dot1 += _q6_field(f1, 0, f2p23) * y0
    dot1 += _q6_field(f1, 8, f2p23) * y1
    dot2 += _q6_field(f2, 4, f2p23) * z0
    dot2 += _q6_field(f2, 12, f2p23) * z1
    dot3 += _q6_field(f3, 4, f2p23) * v0
    dot3 += _q6_field(f3, 12, f2p23) * v1
    return dot0, dot1, dot2, dot3


@triton.jit
def _int8_of(word16, g):
    """Byte g (0 low, 1 high) of uint16 words as a signed value, float32."""
    return ((word16.to(tl.int32) << (24 - 8 * g)) >> 24).to(tl.float32)


@triton.jit
def dot_q6_k(rowp, u, rmask, xp, f2p23, X_BF16: tl.constexpr):
    """Q6_K: element h*128 + p*32 + l (h < 2, p < 4, l < 32) = low 4 bits from ql byte
    h*64 + (p%2)*32 + l (nibble p//2), high 2 bits from qh byte h*32 + l (bits 2p), scale
    int8 #(h*8 + p*2 + l//16). Tile [BN, 2 h, 2 g = l//16]: each thread walks the 16 l of its
    (h, g) as 8 byte pairs t (the 210-byte blocks are only 2-byte aligned: 16-bit loads), so a
    16-element sub-block is summed inside one thread and scaled once."""
    base = tl.reshape(rowp, [rowp.shape[0], 1, 1]) + u * 210
    rmask = tl.reshape(rmask, [rmask.shape[0], 1, 1])
    h = tl.arange(0, 2)[None, :, None]
    g = tl.arange(0, 2)[None, None, :]
    words = base.to(tl.pointer_type(tl.uint16))
    ql_words = words + h * 32 + g * 8  # ql byte h*64 + g*16 (+ 32 for p = 1, 3)
    qh_words = words + 64 + h * 16 + g * 8  # qh byte 128 + h*32 + g*16
    x = xp + u * 256 + h * 128 + g * 16
    # a per-row (not uniform) copy of 2**23's bits: ptxas keeps it in an ordinary register,
    # where LOP3 can take it along with an immediate mask (one instruction, not two)
    f2p23 = tl.where(rmask, f2p23, 0)
    dot0 = tl.zeros(ql_words.shape, tl.float32)
    dot1 = tl.zeros(ql_words.shape, tl.float32)
    dot2 = tl.zeros(ql_words.shape, tl.float32)
    dot3 = tl.zeros(ql_words.shape, tl.float32)
    for q in tl.static_range(4):  # bytes l = g*16 + 4q .. 4q + 3
        # activations of those 4 bytes for each p (4 consecutive ones each)
        x00, x01, x10, x11 = load_x4(x + 4 * q, X_BF16)
        y00, y01, y10, y11 = load_x4(x + 32 + 4 * q, X_BF16)
        z00, z01, z10, z11 = load_x4(x + 64 + 4 * q, X_BF16)
        v00, v01, v10, v11 = load_x4(x + 96 + 4 * q, X_BF16)
        dot0, dot1, dot2, dot3 = _q6_pair_dot(ql_words + 2 * q, qh_words + 2 * q, rmask, f2p23,
                                              x00, x01, y00, y01, z00, z01, v00, v01,
                                              dot0, dot1, dot2, dot3)
        dot0, dot1, dot2, dot3 = _q6_pair_dot(ql_words + 2 * q + 1, qh_words + 2 * q + 1, rmask, f2p23,
                                              x10, x11, y10, y11, z10, z11, v10, v11,
                                              dot0, dot1, dot2, dot3)
    # int8 scale of (h, p, g) = byte 192 + h*8 + 2p + g, taken from 16-bit word 96 + h*4 + p
    # (a byte load contiguous along g would make Triton give each thread both g, halving the
    # rows per thread that share its activations)
    sc_words = words + 96 + h * 4
    sc0 = _int8_of(tl.load(sc_words, mask=rmask, other=0), g)
    sc1 = _int8_of(tl.load(sc_words + 1, mask=rmask, other=0), g)
    sc2 = _int8_of(tl.load(sc_words + 2, mask=rmask, other=0), g)
    sc3 = _int8_of(tl.load(sc_words + 3, mask=rmask, other=0), g)
    d = load_f16(base + 208, rmask)
    return tl.sum(d * ((sc0 * dot0 + sc1 * dot1) + (sc2 * dot2 + sc3 * dot3)), axis=2)
