"""Triton kernels over raw GGUF blocks: dequantize, the fused decode matmul, and the fused
multi-row (tensor-core) matmul.

All walk a weight in units of 256 elements per row (one K-quant super-block or 8 legacy blocks)
and get the unit's values from the per-family tile functions (quant_legacy / quant_k /
quant_iq4), chosen at compile time by the QTYPE constexpr.

Decode (few activation rows): each program owns BLOCK_N output rows and a 1/SPLIT_K share of
the units; it reads each raw byte of its rows exactly once, dequantizes in registers, multiplies
by up to BLOCK_M activation rows and writes float32 partial sums; the host sums the SPLIT_K
partials (deterministic, no atomics). The dense weight never exists in memory.

Multi-row (2..linear.FUSED_MAX_ROWS bf16 rows: short turns, batched decode, short
prompts and the last chunk of long ones; _rows_kernel): each program dequantizes a
[BLOCK_N, 256] unit of its weight rows in registers with the same tile functions, rounds it to
the activation dtype and feeds it to tl.dot against the [BLOCK_M, 256] activations taken at
the tile's own columns (fp32 accumulation; same grid, split-K and partials as decode). No
weight scratch. Row tiles of 32 and 64 (_ROWS_TILES): each unit is dequantized once per
BLOCK_M rows. Works for any row count and for fp16 too (tests: up to 100 rows).

Long prefill chunks (more rows; linear.FUSED_MAX_ROWS says why): Triton-dequantize a chunk of
weight rows to the activation dtype in a scratch buffer, then torch.matmul (cuBLAS), each weight
once per call.

Compiled offline (Triton 3.9's ptxas, the bf16 COMPILE_SPECS; registers a thread, +bytes
spilled (ptxas stack frame), /shared memory of one block; the larger of the aligned / unaligned
row variants; decode of Q4_K / Q6_K: the dot kernel). Decode kernels: no spills. Multi-row:
8 bytes in two of 48 (Q4_0 32x32 sm_90, Q6_K 64x32 sm_80), nothing elsewhere:
    type    decode 1 row     rows 32x32 (2-32 rows)   rows 64x32 (33+ rows)
            sm_90   sm_80    sm_90      sm_80         sm_90      sm_80
    Q4_0       120    121   128+8B/16K   128/16K       155/48K   181/32K
    Q4_1       118    126     128/16K   126/16K       128/48K   199/32K
    Q5_0       126    128     126/32K   128/32K       156/48K   184/48K
    Q5_1       106    112      80/32K   102/32K       128/48K   148/48K
    Q8_0       120     72     169/16K   172/16K       187/48K   254/32K
    Q2_K        95     96      80/32K   110/32K       128/48K   144/48K
    Q3_K       143    128     135/32K   160/32K       159/48K   192/48K
    Q4_K       127    128     161/32K   211/32K       247/48K   255/48K
    Q5_K       106     96     120/32K    98/32K       128/48K   161/48K
    Q6_K       172    128     228/16K   255/16K       222/48K 255+8B/32K
    IQ4_NL     152    154     156/32K   177/32K       166/48K   255/32K
    IQ4_XS     127    128     147/32K   176/32K       127/48K   254/32K

One activation row of Q4_K / Q6_K (the types of Q4_K_M files) takes a second kernel,
_decode_dot_kernel, with scale-after-dot units (quant_k.dot_q4_k / dot_q6_k): the raw quants
are turned into exact float32 values with one LOP3 + one FADD (OR-ing a float exponent onto the
bit field, see quant_k._nibble_f32) and multiplied straight into per-sub-block sums held in one
thread; d*sc is applied once per sub-block and dmin*m once against a per-program sum of x (Q4_K);
Q6_K's -32 folds into the FADD. Weight bytes come in as 16-byte (Q4_K) or 16-bit (Q6_K, 2-byte
aligned 210-byte blocks) loads, bf16 activations 4 per 8-byte load. Programs are one warp of 32
rows (4 rows per thread share each activation), split over K for ~16 warps per SM.

Performance status (no GPU was available while writing this). Proxy: the sm_90 PTX / SASS of
the inner loop, compiled offline (`python bench/kernels.py --ptx`), in instructions per weight
element; an H200 SM issues 128 thread-instructions per clock against ~18.4 bytes/clock of HBM,
so memory can be kept busy with at most 128 * bytes per element / 18.4 instructions per
element (Q4_K, 0.5625 B: 3.9, or 4.9 for 80 %; Q6_K, 0.82 B: 5.7, or 7.1 for 80 %); the
"issue-bound %" below is that number over the measured SASS count:

    type rows kernel               PTX   SASS  regs  issue-bound % of HBM
    Q4_K   1  generic 16x1/4 warps 8.12  8.47   78   46 %   (before)
    Q4_K   1  dot     32x1/1 warp  6.45  4.55  127   86 %   (bf16 x; f32 x: SASS 4.84)
    Q6_K   1  generic  8x1/2 warps 15.7  15.7  115   37 %   (before)
    Q6_K   1  dot     32x1/1 warp  8.41  6.46  172   88 %   (bf16 x; f32 x: SASS 6.65)
    Q4_K   8  generic  8x8/8 warps 28.8  28.5  126   14 %   (3.6 per multiply-add; unchanged)
    Q6_K   8  generic  8x8/8 warps 34.0  33.1  127   17 %   (4.1 per multiply-add; unchanged)

SASS is the better proxy (ptxas folds many PTX movs/converts). Not modelled: latency and
occupancy (127-172 registers allow 11-16 one-warp programs per SM, each loading its whole unit
up front; 16-row tiles take fewer registers - Q6_K 119 - for ~3 % more instructions), so treat
these as ceilings and confirm with `bench/kernels.py` / `--sweep` on the GPU. Left at one row: the
16-bit loads of Q6_K's 2-byte aligned blocks and their zero-extension (a lossless load-time
repack into 16-byte aligned ql/qh/scale planes would save ~0.5 instruction per element, at the
cost of a CUDA-only layout that QWeight.rows/cat/dequantize must follow - not done: the proxy
is already past 80 % without it), and sum(x) per sub-block for Q4_K.
At 8 rows the generic decode is issue-bound far below bandwidth with one FMA per multiply-add;
bf16/fp16 rows from 2 on therefore take the tensor-core kernel (float32 activations, which it
would round, stay on the decode kernel up to 8 rows). Other types still
use the generic kernel: ~8 instructions per element for Q8_0/Q2_K/Q4_1, ~10-14 for
Q4_0/Q5_x/IQ4, ~20 for Q3_K; Q5_K could reuse dot_q4_k's units plus a bit plane.
`bench/kernels.py` measures the real numbers (`--sweep` searches the tile configs).
"""
from __future__ import annotations

import contextlib

import torch

from . import ggml_types as gt
from .quant_iq4 import kvalues_table, tile_iq4_nl, tile_iq4_xs
from .quant_k import dot_q4_k, dot_q6_k, tile_q2_k, tile_q3_k, tile_q4_k, tile_q5_k, tile_q6_k
from .quant_legacy import tile_q4_0, tile_q4_1, tile_q5_0, tile_q5_1, tile_q8_0
from . import triton_compat
from .triton_compat import interpreting, launch, tl, triton
from .triton_compat import sm_count as _sm_count  # tests patch it here

UNIT = 256  # elements per row handled by one tile call
F32_BITS_2P23 = 0x4B000000  # bit pattern of float32 2**23, see quant_k._nibble_f32

TRITON_TYPES = (gt.Q4_0, gt.Q4_1, gt.Q5_0, gt.Q5_1, gt.Q8_0, gt.Q2_K, gt.Q3_K, gt.Q4_K,
                gt.Q5_K, gt.Q6_K, gt.IQ4_NL, gt.IQ4_XS)


@triton.jit
def _tile(QTYPE: tl.constexpr, rowp, u, n_blocks, rmask, table_ptr):
    # ggml ids: Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q2_K 10 .. Q6_K 14, IQ4_NL 20, IQ4_XS 23
    if QTYPE == 2:
        return tile_q4_0(rowp, u, n_blocks, rmask)
    elif QTYPE == 3:
        return tile_q4_1(rowp, u, n_blocks, rmask)
    elif QTYPE == 6:
        return tile_q5_0(rowp, u, n_blocks, rmask)
    elif QTYPE == 7:
        return tile_q5_1(rowp, u, n_blocks, rmask)
    elif QTYPE == 8:
        return tile_q8_0(rowp, u, n_blocks, rmask)
    elif QTYPE == 10:
        return tile_q2_k(rowp, u, rmask)
    elif QTYPE == 11:
        return tile_q3_k(rowp, u, rmask)
    elif QTYPE == 12:
        return tile_q4_k(rowp, u, rmask)
    elif QTYPE == 13:
        return tile_q5_k(rowp, u, rmask)
    elif QTYPE == 14:
        return tile_q6_k(rowp, u, rmask)
    elif QTYPE == 20:
        return tile_iq4_nl(rowp, u, n_blocks, rmask, table_ptr)
    else:
        tl.static_assert(QTYPE == 23, "unsupported ggml type")
        return tile_iq4_xs(rowp, u, rmask, table_ptr)


@triton.jit
def _dequant_kernel(w_ptr, out_ptr, table_ptr, N, K, row_bytes, n_blocks,
                    QTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    u = tl.program_id(1)
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None, None, None]
    rmask = rows < N
    vals, col = _tile(QTYPE, w_ptr + rows * row_bytes, u, n_blocks, rmask, table_ptr)
    kcol = u * 256 + col
    tl.store(out_ptr + rows * K + kcol, vals.to(out_ptr.dtype.element_ty), mask=rmask & (kcol < K))


@triton.jit
def _weight_rows(w_ptr, N, row_bytes, BLOCK_N: tl.constexpr):
    """The BLOCK_N weight rows of this program (grid axis 0) of the matmul kernels: their
    indices (int64), and as [BLOCK_N, 1, 1, 1] for _tile / _dot their mask and row pointers."""
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rows4 = rows[:, None, None, None]
    return rows, rows4 < N, w_ptr + rows4 * row_bytes


@triton.jit
def _decode_kernel(x_ptr, w_ptr, part_ptr, table_ptr, M, N, K, row_bytes, n_blocks, n_units,
                   units_per_split, stride_xm,
                   QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows, rmask, rowp = _weight_rows(w_ptr, N, row_bytes, BLOCK_N)
    m_ids = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    u_start = pid_k * units_per_split
    u_stop = tl.minimum(u_start + units_per_split, n_units)
    if BLOCK_M == 1:
        # one activation row: accumulate products elementwise and reduce once at the end, so
        # the loop body is loads + integer unpacking + FMAs, with no cross-lane reductions
        # (the host gives every split at least one unit; the first one is peeled to get
        # the tile's shape for the accumulator)
        w, col = _tile(QTYPE, rowp, u_start, n_blocks, rmask, table_ptr)
        kcol = u_start * 256 + col
        x = tl.load(x_ptr + pid_m * stride_xm + kcol, mask=kcol < K, other=0.0).to(tl.float32)
        acc_full = w * x
        for u in range(u_start + 1, u_stop):
            w, col = _tile(QTYPE, rowp, u, n_blocks, rmask, table_ptr)
            kcol = u * 256 + col
            x = tl.load(x_ptr + pid_m * stride_xm + kcol, mask=kcol < K, other=0.0).to(tl.float32)
            acc_full += w * x
        acc += tl.sum(tl.sum(tl.sum(acc_full, axis=3), axis=2), axis=1)[:, None]
    else:
        # several activation rows: one [BLOCK_M, BLOCK_N, ...] product tile per unit, so each
        # dequantized weight is reused BLOCK_M times from registers; reduced once at the end
        m5 = (pid_m * BLOCK_M + m_ids)[:, None, None, None, None]
        x_rows = x_ptr + m5 * stride_xm
        w, col = _tile(QTYPE, rowp, u_start, n_blocks, rmask, table_ptr)
        kcol = (u_start * 256 + col)[None]
        x = tl.load(x_rows + kcol, mask=(m5 < M) & (kcol < K), other=0.0).to(tl.float32)
        acc_full = w[None] * x
        for u in range(u_start + 1, u_stop):
            w, col = _tile(QTYPE, rowp, u, n_blocks, rmask, table_ptr)
            kcol = (u * 256 + col)[None]
            x = tl.load(x_rows + kcol, mask=(m5 < M) & (kcol < K), other=0.0).to(tl.float32)
            acc_full += w[None] * x
        acc += tl.trans(tl.sum(tl.sum(tl.sum(acc_full, axis=4), axis=3), axis=2))  # [BLOCK_N, BLOCK_M]
    m_all = pid_m * BLOCK_M + m_ids
    out = part_ptr + pid_k.to(tl.int64) * M * N + m_all[None, :].to(tl.int64) * N + rows[:, None]
    # float32 partials when split over K, else the final output dtype directly (one launch)
    tl.store(out, acc.to(part_ptr.dtype.element_ty), mask=(rows[:, None] < N) & (m_all[None, :] < M))


@triton.jit
def _dot(QTYPE: tl.constexpr, rowp, u, rmask, xp, f2p23, X_BF16: tl.constexpr):
    if QTYPE == 12:
        return dot_q4_k(rowp, u, rmask, xp, f2p23, X_BF16)
    else:
        tl.static_assert(QTYPE == 14, "no scale-after-dot unit for this type")
        return dot_q6_k(rowp, u, rmask, xp, f2p23, X_BF16)


@triton.jit
def _decode_dot_kernel(x_ptr, w_ptr, part_ptr, table_ptr, M, N, K, row_bytes, n_blocks, n_units,
                       units_per_split, stride_xm, f2p23,
                       QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       X_BF16: tl.constexpr):
    """One activation row, K-quants with a scale-after-dot unit (see quant_k.dot_q4_k).
    Same grid and outputs as _decode_kernel. X_BF16: x is bfloat16 with 8-byte aligned rows
    (loaded 4 at a time)."""
    tl.static_assert(BLOCK_M == 1)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows, rmask, rowp = _weight_rows(w_ptr, N, row_bytes, BLOCK_N)
    xp = x_ptr + pid_m * stride_xm
    u_start = pid_k * units_per_split
    u_stop = tl.minimum(u_start + units_per_split, n_units)
    acc = _dot(QTYPE, rowp, u_start, rmask, xp, f2p23, X_BF16)  # peeled: gives the accumulator its shape
    for u in range(u_start + 1, u_stop):
        acc += _dot(QTYPE, rowp, u, rmask, xp, f2p23, X_BF16)
    acc = tl.sum(acc, axis=1)  # every unit returns [BLOCK_N, a]
    out = part_ptr + pid_k.to(tl.int64) * M * N + pid_m.to(tl.int64) * N + rows
    tl.store(out, acc.to(part_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _mma(x, w, acc, BF16_AS_F32: tl.constexpr):
    """acc + x @ w.T on tensor cores: x [BLOCK_M, 256] bf16/fp16, w [BLOCK_N, 256] float32
    rounded to x's dtype, float32 accumulation. BF16_AS_F32 only under the interpreter (numpy has
    no bfloat16 matmul, and its float32 -> bf16 cast truncates): the same bf16 values - w
    rounded to nearest even as cvt.rn.bf16.f32 does - widened to float32, whose products are
    exact there as on the tensor cores."""
    if BF16_AS_F32:
        bits = w.to(tl.uint32, bitcast=True)
        w = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w.to(x.dtype)), acc)


@triton.jit(do_not_specialize=["M", "n_blocks", "n_units", "units_per_split"])
def _rows_kernel(x_ptr, w_ptr, out_ptr, table_ptr, M, N, K, row_bytes, n_blocks, n_units,
                 units_per_split, stride_xm,
                 QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BF16_AS_F32: tl.constexpr):
    """Several activation rows on tensor cores: each program dequantizes a [BLOCK_N, 256] unit
    of weight rows in registers (the same _tile as the decode kernels), rounds it to x's dtype
    and multiplies it with the [BLOCK_M, 256] activations at the unit's columns (the tile's own
    column order: a dot product does not care in which order K is walked). Grid and outputs as
    _decode_kernel: (N tiles, SPLIT_K, M tiles), float32 partials when split over K."""
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows, rmask, rowp = _weight_rows(w_ptr, N, row_bytes, BLOCK_N)
    m_ids = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    x_rows = x_ptr + m_ids.to(tl.int64)[:, None] * stride_xm
    m_ok = (m_ids < M)[:, None]
    u_start = pid_k * units_per_split
    u_stop = tl.minimum(u_start + units_per_split, n_units)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for u in range(u_start, u_stop):
        w, col = _tile(QTYPE, rowp, u, n_blocks, rmask, table_ptr)
        col = tl.reshape(tl.broadcast_to(col, [1, w.shape[1], w.shape[2], w.shape[3]]), [1, 256])
        w = tl.reshape(w, [BLOCK_N, 256])
        kcol = u * 256 + col
        x = tl.load(x_rows + kcol, mask=m_ok & (kcol < K), other=0.0)
        acc = _mma(x, w, acc, BF16_AS_F32)
    out = out_ptr + pid_k.to(tl.int64) * M * N + m_ids.to(tl.int64)[:, None] * N + rows[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok & (rows[None, :] < N))


def _packed_bf16(x2: torch.Tensor) -> bool:
    """Can the dot kernel load this bf16 activation matrix 4 values (8 bytes) at a time?"""
    return x2.dtype == torch.bfloat16 and x2.data_ptr() % 8 == 0 and x2.stride(0) % 4 == 0


def _check(w) -> None:
    if w.ggml_type not in TRITON_TYPES:
        raise gt.QuantFormatError(f"no Triton kernel for {gt.type_name(w.ggml_type)} weights")


def _table(device) -> torch.Tensor:
    return kvalues_table(device)


def _launch_opts(device: torch.device, fp_fusion: bool) -> dict:
    # Dequant: no FMA contraction, values must round exactly like gguf-py's separate ops.
    # Decode: FMAs wanted (explicit: Triton's default is due to flip to off).
    return {"enable_fp_fusion": fp_fusion} if device.type == "cuda" else {}


def dequantize_triton(w, dtype=torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """(out_features, in_features) dense copy of a quantized QWeight, computed by Triton."""
    _check(w)
    n, k = w.shape
    data = w.data if w.data.is_contiguous() else w.data.contiguous()
    if out is None:
        out = torch.empty(n, k, dtype=dtype, device=data.device)
    block_n = 8
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, UNIT))
    n_blocks = k // gt.type_info(w.ggml_type).block_size
    with _on_device(data.device):
        launch(_dequant_kernel, grid, data, out, _table(data.device), n, k, data.shape[1], n_blocks,
               QTYPE=w.ggml_type, BLOCK_N=block_n, num_warps=4, **_launch_opts(data.device, False))
    return out


# (BLOCK_N, num_warps) for one activation row, chosen offline from the sm_90 PTX of the inner
# loop (instructions per weight element, barriers) and ptxas register counts (no spills):
# BLOCK_N=16 / 4 warps gives 8-14 instructions per element for most types where the old
# 8 / 4 gave up to 34. To be confirmed on the GPU: `bench/kernels.py --sweep`.
_DECODE_TILE_1ROW = {gt.Q6_K: (8, 2)}
# Types with a scale-after-dot unit for one activation row (_decode_dot_kernel), and its tile:
# 32 rows on one warp gives each thread 4 rows of the same 64 columns, so the activations it
# loads and sums are reused 4 times (instructions per element, registers: module docstring).
DOT_TYPES = {gt.Q4_K: (32, 1), gt.Q6_K: (32, 1)}
# byte alignment the dot units' weight loads need (Q4_K: 32-bit words - 16-byte vectors when
# Triton sees a 16-aligned pointer; Q6_K: 16-bit words); every row start then has it too
# (row_bytes is a multiple of 16 / of 2). Weights at other addresses (odd views of a byte
# buffer) take the generic kernel, which loads bytes.
_DOT_ALIGN = {gt.Q4_K: 4, gt.Q6_K: 2}


def decode_config(n: int, k: int, m: int, device: torch.device, ggml_type: int = gt.Q4_K,
                  dot: bool = True) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_M, SPLIT_K, num_warps): enough programs to fill every SM a few times.
    dot=False: the generic kernel's config even for DOT_TYPES (weight bytes not aligned)."""
    n_units = triton.cdiv(k, UNIT)
    if m <= 1 and ggml_type in DOT_TYPES and dot:
        # one-warp programs, each a few hundred instructions per unit with its loads up front:
        # ~16 warps per SM so some warps' loads are in flight while others compute
        # (register use ~100-170/thread allows 11-20). Partial sums cost split * n floats.
        block_n, warps = DOT_TYPES[ggml_type]
        want = 16 * _sm_count(device) // warps
        split_k = max(1, min(n_units, triton.cdiv(want, triton.cdiv(n, block_n))))
        return block_n, 1, split_k, warps
    if m <= 1:
        block_m = 1
        block_n, warps = _DECODE_TILE_1ROW.get(ggml_type, (16, 4))
    else:  # [BLOCK_M, BLOCK_N, unit] products in registers: 2-4 PTX instructions per MAC
        block_m = 2 if m <= 2 else 4 if m <= 4 else 8
        block_n, warps = (16 if block_m == 2 else 8), 8
    programs = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    want = 4 * _sm_count(device)
    split_k = max(1, min(n_units // 4 if n_units >= 8 else 1, triton.cdiv(want, programs)))
    return block_n, block_m, split_k, warps


def linear_decode(x: torch.Tensor, w, config: tuple[int, ...] | None = None) -> torch.Tensor:
    """Fused dequant+matmul for few activation rows. x (..., in) -> (..., out) in x.dtype.
    config: (BLOCK_N, BLOCK_M, SPLIT_K[, num_warps]), default from decode_config."""
    n = w.shape[0]
    part = _decode_parts(x, w, config)
    out = part[0] if part.shape[0] == 1 else part.sum(0).to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def _decode_parts(x: torch.Tensor, w, config: tuple[int, ...] | None) -> torch.Tensor:
    """(SPLIT_K, rows, out) partial sums: float32 when split over K, else already x.dtype."""
    _check(w)
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m = x2.shape[0]
    data = w.data if w.data.is_contiguous() else w.data.contiguous()
    dot = w.ggml_type in DOT_TYPES and data.data_ptr() % _DOT_ALIGN[w.ggml_type] == 0
    block_n, block_m, split_k, *warps = config or decode_config(n, k, m, x.device, w.ggml_type, dot)
    num_warps = warps[0] if warps else 4
    n_units = triton.cdiv(k, UNIT)
    units_per_split = triton.cdiv(n_units, split_k)
    split_k = triton.cdiv(n_units, units_per_split)
    part = torch.empty(split_k, m, n, dtype=torch.float32 if split_k > 1 else x.dtype, device=x.device)
    grid = (triton.cdiv(n, block_n), split_k, triton.cdiv(m, block_m))
    n_blocks = k // gt.type_info(w.ggml_type).block_size
    with _on_device(x.device):
        if block_m == 1 and dot:
            launch(_decode_dot_kernel, grid, x2, data, part, _table(x.device), m, n, k, data.shape[1], n_blocks,
                                     n_units, units_per_split, x2.stride(0), F32_BITS_2P23, QTYPE=w.ggml_type,
                                     BLOCK_N=block_n, BLOCK_M=1, X_BF16=_packed_bf16(x2), num_warps=num_warps,
                                     **_launch_opts(x.device, True))
        else:
            launch(_decode_kernel, grid, x2, data, part, _table(x.device), m, n, k, data.shape[1], n_blocks, n_units,
                                 units_per_split, x2.stride(0), QTYPE=w.ggml_type, BLOCK_N=block_n,
                                 BLOCK_M=block_m, num_warps=num_warps, **_launch_opts(x.device, True))
    return part


# Multi-row tiles (BLOCK_M, BLOCK_N, num_warps) by activation rows (up to the key's rows; None:
# any more). Chosen offline from Triton's ptxas for sm_90 and sm_80, every type: the whole
# [BLOCK_N, 256] float32 unit, its bf16 copy and the [BLOCK_M, 256] activation operand are live
# at once, so 32 weight rows on 8 warps. Measured spills (bytes, stack frame): 64 weight rows
# spill 144-336 (Q4_K, Q6_K, Q8_0 on sm_90), 4 warps spill too, 128 activation rows spill for
# Q4_K (712 sm_90, 928 sm_80) and Q6_K / IQ4_NL / IQ4_XS on sm_80 (136-200); the two tiles
# here spill 8 bytes in 2 of 48 cases (table: module docstring). Shared memory with one stage:
# (BLOCK_M + BLOCK_N) x 512 bytes, 48 KiB at 64 rows. One stage: Triton's default 3 would triple
# the activation buffers, and the weight loads feed integer work, not the dot - nothing else to
# overlap. bf16 only in `linear` (fp16 means a GPU before sm_80, where this Triton's tl.dot
# emits FMAs, not MMAs - sm_75 PTX - and spills 2-5 KB); fp16 works, for tests and callers.
_ROWS_TILES = ((32, (32, 32, 8)), (None, (64, 32, 8)))
ROWS_NUM_STAGES = 1
ROWS_MIN_UNITS_PER_SPLIT = 4  # K units (of 256) per split: each program's loop amortizes its setup


def rows_config(m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, num_warps) of the multi-row kernel for m activation rows of an
    (n, k) weight: the smallest row tile holding m (a 2-row turn pads to 32), and a K split when
    the tiles alone give fewer than ~2 programs per SM (short turns: 5120 / 32 = 160 programs
    for a 5120-row weight, 1.2 per SM of an H200)."""
    block_m, block_n, warps = next(cfg for limit, cfg in _ROWS_TILES if limit is None or m <= limit)
    programs = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    n_units = triton.cdiv(k, UNIT)
    most = max(1, n_units // ROWS_MIN_UNITS_PER_SPLIT)
    split_k = max(1, min(most, triton.cdiv(2 * _sm_count(device), programs)))
    return block_m, block_n, split_k, warps


def linear_rows(x: torch.Tensor, w, config: tuple[int, ...] | None = None) -> torch.Tensor:
    """Fused dequant + tensor-core matmul for 2..FUSED_MAX_ROWS (linear.py) bf16/fp16 activation rows:
    x (..., in) -> (..., out) in x.dtype; the weight is only read, as raw blocks. config:
    (BLOCK_M, BLOCK_N, SPLIT_K, num_warps), default rows_config."""
    part = _rows_parts(x, w, config)
    out = part[0] if part.shape[0] == 1 else part.sum(0).to(x.dtype)
    return out.reshape(*x.shape[:-1], w.shape[0])


def _rows_parts(x: torch.Tensor, w, config: tuple[int, ...] | None) -> torch.Tensor:
    """(SPLIT_K, rows, out) partial sums: float32 when split over K, else already x.dtype."""
    _check(w)
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"linear_rows multiplies bfloat16 or float16 activations on tensor cores, got {x.dtype}")
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m = x2.shape[0]
    data = w.data if w.data.is_contiguous() else w.data.contiguous()
    block_m, block_n, split_k, warps = config or rows_config(m, n, k, x.device)
    n_units = triton.cdiv(k, UNIT)
    units_per_split = triton.cdiv(n_units, split_k)
    split_k = triton.cdiv(n_units, units_per_split)
    part = torch.empty(split_k, m, n, dtype=torch.float32 if split_k > 1 else x.dtype, device=x.device)
    grid = (triton.cdiv(n, block_n), split_k, triton.cdiv(m, block_m))
    n_blocks = k // gt.type_info(w.ggml_type).block_size
    with _on_device(x.device):
        launch(_rows_kernel, grid, x2, data, part, _table(x.device), m, n, k, data.shape[1], n_blocks, n_units,
               units_per_split, x2.stride(0), QTYPE=w.ggml_type, BLOCK_M=block_m, BLOCK_N=block_n,
               BF16_AS_F32=x.dtype == torch.bfloat16 and interpreting(), num_warps=warps,
               num_stages=ROWS_NUM_STAGES, **_launch_opts(x.device, True))
    return part


def _on_device(device: torch.device):
    """Triton launches on the *current* CUDA device: make it the tensors' one (multi-GPU maps)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def linear_prefill(x: torch.Tensor, w, chunk_bytes: int) -> torch.Tensor:
    """Many activation rows: Triton dequant of weight-row chunks into scratch, then matmul.
    chunk_bytes: the scratch per chunk (the caller's budget: linear.PREFILL_CHUNK_BYTES)."""
    n, k = w.shape
    x2 = x.reshape(-1, k)
    # float16/float32 compute stays in x's dtype; the interpreter cannot do bf16 arithmetic
    dtype = x.dtype
    out = torch.empty(x2.shape[0], n, dtype=dtype, device=x.device)
    step = max(1, chunk_bytes // (k * x.element_size()))
    # chunks of 16 rows: every chunk's first row is then 16-byte aligned whatever the row size
    # (Q6_K at K=5120: 4200 bytes), as the dequant kernel's compiled specializations assume
    step = max(16, step // 16 * 16)
    scratch = torch.empty(min(step, n), k, dtype=dtype, device=x.device)
    for start in range(0, n, step):
        part = w.rows(start, min(start + step, n))
        wd = dequantize_triton(part, dtype, out=scratch[: part.shape[0]])
        torch.matmul(x2, wd.t(), out=out[:, start : start + part.shape[0]])
    return out.reshape(*x.shape[:-1], n)


# ----------------------------------------------------------------------------- compile specs
# (out, in) of every quantized matmul the engine runs on CUDA: Mistral-Small-3.1-24B (hidden
# 5120, ffn 32768) and Ministral-3 3B / 8B / 14B (hidden 3072 / 4096 / 5120, ffn 9216 / 14336 /
# 16384), all with 32 x 128 query heads, 8 x 128 KV heads and a 131072 vocabulary, fused QKV
# and gate|up (QWeight.cat) too; and the Pixtral tower + projector (1024 wide, ffn 4096).
MODEL_HIDDEN_FFN = ((5120, 32768), (3072, 9216), (4096, 14336), (5120, 16384))
VISION_SHAPES = ((1024, 1024), (4096, 1024), (1024, 4096), (5120, 1024), (5120, 5120))


def model_shapes() -> list[tuple[int, int]]:
    q, kv, vocab = 32 * 128, 8 * 128, 131072
    shapes = set(VISION_SHAPES)
    for hidden, ffn in MODEL_HIDDEN_FFN:
        shapes |= {(q, hidden), (kv, hidden), (q + 2 * kv, hidden), (hidden, q), (ffn, hidden),
                   (2 * ffn, hidden), (hidden, ffn), (vocab, hidden)}
    return sorted(shapes)


# Activation dtypes by compute capability, as the engine picks them (mistral3.text.default_dtype,
# vision.tower_dtype): bf16 from sm_80, fp16 below it, float32 (the tower below sm_80, 1-8 rows)
# anywhere.
_DTYPE_CC = {"bf16": (80, 10_000), "fp16": (0, 79), "fp32": (0, 10_000)}
# ints claimed when their real value is a multiple of 16. Not N: chunks, views and embedding
# rows have any count, and it only feeds masks.
_INT_ARGS = ("K", "row_bytes", "stride_xm", "f2p23")


def _spec(name, kernel, types: dict, constexprs: dict, values: dict, warps: int, stages: int,
          fp_fusion: bool, dtype: str) -> dict:
    """One COMPILE_SPECS entry (the format kernels/aot.KernelSpec.of reads). Pointers are
    claimed 16-byte aligned (torch allocations, 16-row chunks), except the weight's when its
    rows are not a multiple of 16 bytes (then no row pointer is, and views of it need not be);
    _INT_ARGS are claimed where the real value is a multiple of 16 (Triton's own rule)."""
    div = [a for a, t in types.items() if t.startswith("*") and a != "w_ptr"]
    div += [a for a in _INT_ARGS if a in types and values[a] % 16 == 0]
    if values["row_bytes"] % 16 == 0:
        div.append("w_ptr")
    sig = {**types, **{c: "constexpr" for c in constexprs}}
    lo, hi = _DTYPE_CC[dtype]
    return {"name": name, "kernel": kernel, "signature": sig, "constexprs": constexprs, "divisible": sorted(div),
            "num_warps": warps, "num_stages": stages, "options": {"enable_fp_fusion": fp_fusion},
            "min_cc": lo, "max_cc": hi}


def compile_specs() -> list[dict]:
    """The specializations real launches use, for the model shapes above: every type, activation
    dtype and tile config the host code picks (dequantize_triton, linear_decode, linear_rows),
    float32 partials or direct output, aligned or unaligned weight rows where a real shape has
    them. Read by kernels/aot_build.py (COMPILE_SPECS)."""
    specs, seen = [], set()

    def add(spec):
        key = repr({k: v for k, v in spec.items() if k != "name"})
        if key not in seen:
            seen.add(key)
            specs.append(spec)

    rows_types = {"x_ptr": "", "w_ptr": "*u8", "out_ptr": "", "table_ptr": "*fp32", "M": "i32", "N": "i32",
                  "K": "i32", "row_bytes": "i32", "n_blocks": "i32", "n_units": "i32",
                  "units_per_split": "i32", "stride_xm": "i32"}
    dec_types = {**rows_types, "part_ptr": ""}
    del dec_types["out_ptr"]
    dec_types = {k: dec_types[k] for k in ("x_ptr", "w_ptr", "part_ptr", "table_ptr", "M", "N", "K", "row_bytes",
                                            "n_blocks", "n_units", "units_per_split", "stride_xm")}
    deq_types = {"w_ptr": "*u8", "out_ptr": "", "table_ptr": "*fp32", "N": "i32", "K": "i32", "row_bytes": "i32",
                 "n_blocks": "i32"}
    for t in TRITON_TYPES:
        tn = gt.type_name(t)
        for n, k in model_shapes():
            values = {"N": n, "K": k, "row_bytes": gt.row_bytes(t, k), "stride_xm": k, "f2p23": F32_BITS_2P23}
            for dt in ("bf16", "fp16", "fp32"):
                add(_spec(f"dequant {tn} {dt}", _dequant_kernel, {**deq_types, "out_ptr": f"*{dt}"},
                          {"QTYPE": t, "BLOCK_N": 8}, values, 4, 3, False, dt))
                for part in sorted({dt, "fp32"}):  # x.dtype output, or float32 partials of a K split
                    types = {**dec_types, "x_ptr": f"*{dt}", "part_ptr": f"*{part}"}
                    if t in DOT_TYPES:  # one row: the scale-after-dot kernel
                        bn, warps = DOT_TYPES[t]
                        add(_spec(f"decode_dot {tn} {dt}->{part}", _decode_dot_kernel, {**types, "f2p23": "i32"},
                                  {"QTYPE": t, "BLOCK_N": bn, "BLOCK_M": 1, "X_BF16": dt == "bf16"},
                                  values, warps, 3, True, dt))
                    # the generic decode kernel: one row (types without a dot unit), and 2-8
                    # float32 / fp16 rows (bf16 rows from 2 on take the tensor-core kernel)
                    for m in ((1,) if dt == "bf16" else (1, 2, 4, 8)):
                        if m == 1 and t in DOT_TYPES:
                            continue
                        bn, bm, _, warps = decode_config(n, k, m, torch.device("cpu"), t, dot=False)
                        add(_spec(f"decode {tn} {dt}->{part} m{bm}", _decode_kernel, types,
                                  {"QTYPE": t, "BLOCK_N": bn, "BLOCK_M": bm}, values, warps, 3, True, dt))
                    if dt != "bf16":  # the tensor-core kernel: bf16 only (linear.cuda_kernel_for)
                        continue
                    for _, (bm, bn, warps) in _ROWS_TILES:
                        add(_spec(f"rows {tn} {dt}->{part} {bm}x{bn}", _rows_kernel,
                                  {**rows_types, "x_ptr": f"*{dt}", "out_ptr": f"*{part}"},
                                  {"QTYPE": t, "BLOCK_M": bm, "BLOCK_N": bn, "BF16_AS_F32": False},
                                  values, warps, ROWS_NUM_STAGES, True, dt))
    return specs


def __getattr__(name: str):
    """COMPILE_SPECS, made on first use (kernels/aot_build.py and the compile tests read it;
    importing this module for inference does not pay for it)."""
    if name == "COMPILE_SPECS":
        globals()["COMPILE_SPECS"] = specs = compile_specs() if triton_compat.HAVE_TRITON else []
        return specs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
