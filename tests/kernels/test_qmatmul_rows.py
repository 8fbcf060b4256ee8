"""The multi-row tensor-core kernel (qmatmul.linear_rows) under the interpreter (on a GPU when
there is one) against gguf.quants dequantization and float64 matmuls.

Bounds derived as in test_cpu_native.py, with the tensor cores' operand rounding in place of
the CPU kernels' int8 activation quantization:

* model: the activations are already bf16/fp16; the kernel rounds each dequantized weight to
  that dtype (round to nearest even) and accumulates exact products in float32. The same
  rounding in torch, times x in float64, must match within 1e-5 of sum |w_r| |x| per output
  (float32 accumulation) plus one unit in the last place of the output dtype (the output's own
  rounding; the interpreter truncates to bf16, the GPU rounds to nearest). One wrong weight in a
  row of K is an error of about 1/K of that sum, far above it (test_a_wrong_weight_is_caught);
* exact: against the float64 product with unrounded weights, the error is at most the weight
  rounding bound u * sum |w| |x| (u = 2^-8 bf16, 2^-11 fp16, plus 2^-25 |x| per fp16
  subnormal weight) plus the same two terms.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import FUSED_MAX_ROWS, QWeight, cuda_kernel_for
from tramontane.kernels.triton_compat import triton_usable
from support.quant_bytes import random_quant_bytes
from support.triton_toolchain import nvidia_backend

pytestmark = pytest.mark.skipif(not triton_usable(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter on CPU: TRITON_INTERPRET=1, see conftest)")

QTYPES = list(gt.QUANTIZED_TYPES)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-5  # of sum |w| |x| per output: float32 accumulation only
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}


def _cols(ggml_type: int) -> int:
    # legacy types: 11 blocks = one full unit of 8 blocks + a partial one (tail masking)
    return 352 if gt.type_info(ggml_type).block_size == 32 else 512


def _weight(ggml_type: int, shape, seed: int):
    raw = random_quant_bytes(ggml_type, shape, np.random.default_rng(seed))
    deq = gguf_dequantize(raw.reshape(shape[0], -1), GGMLQuantizationType(ggml_type)).astype(np.float32)
    return raw, deq


def _check(deq: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> float:
    """Both bounds of the module docstring; returns the worst model error over its bound.
    y in x.dtype, or float32 partial sums of a K split (then no output rounding term)."""
    dtype = x.dtype
    x64 = x.double().cpu().numpy()
    w_r = torch.from_numpy(deq).to(dtype).double().numpy()
    w64 = deq.astype(np.float64)
    if y.dtype == torch.float32:
        y64, out_ulp = y.double().sum(0).cpu().numpy(), 0.0
    else:
        y64, out_ulp = y.double().cpu().numpy(), 2.0 ** -MANTISSA[dtype]
    model = x64 @ w_r.T
    bound = RTOL * (np.abs(x64) @ np.abs(w_r).T) + out_ulp * np.abs(model) + 1e-30
    worst = float((np.abs(y64 - model) / bound).max())
    assert worst <= 1, f"{worst:.3g} x the bound against the rounded-weight model"
    exact = x64 @ w64.T
    u, sub = (2.0 ** -8, 0.0) if dtype == torch.bfloat16 else (2.0 ** -11, 2.0 ** -25)
    bound = ((u * (1 + 1e-6) + RTOL) * (np.abs(x64) @ np.abs(w64).T) + sub * np.abs(x64).sum(1, keepdims=True)
             + out_ulp * np.abs(exact) * (1 + u))
    over = np.abs(y64 - exact) - bound
    assert float(over.max()) <= 0, f"beyond the weight rounding bound by {over.max():.3g}"
    return worst


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("ggml_type", QTYPES, ids=gt.type_name)
def test_rows_kernel_matches_gguf_reference(ggml_type, dtype):
    from tramontane.kernels.qmatmul import _rows_parts, linear_rows, rows_config

    shape = (13, _cols(ggml_type))  # odd N, not a multiple of any BLOCK_N
    raw, deq = _weight(ggml_type, shape, 300 + ggml_type)
    w = QWeight.from_raw(raw, ggml_type, shape, DEV)
    gen = torch.Generator().manual_seed(ggml_type)
    for rows in (2, 3, 17, 64, 100):  # row tiles 32 (2-17 rows: padded), 64 (full; 100: 64 + 36)
        x = (torch.randn(rows, shape[1], generator=gen) * 3).to(dtype)
        out = linear_rows(x.to(DEV), w)
        assert out.shape == (rows, shape[0]) and out.dtype == dtype
        _check(deq, x, out)
    # a K split (float32 partials summed on the host) and a (..., in) input
    x = torch.randn(2, 3, shape[1], generator=gen).to(dtype)
    bm, bn, _, warps = rows_config(6, *shape, torch.device(DEV))
    out = linear_rows(x.to(DEV), w, config=(bm, bn, 2, warps))
    assert out.shape == (2, 3, shape[0]) and out.dtype == dtype
    _check(deq, x.reshape(6, -1), out.reshape(6, -1))
    # its float32 partials, before the output rounding: the accumulation bound alone
    _check(deq, x.reshape(6, -1), _rows_parts(x.to(DEV), w, (bm, bn, 2, warps)))


@pytest.mark.parametrize("ggml_type", [gt.Q6_K, gt.Q3_K, gt.Q4_K])
def test_rows_kernel_real_row_bytes(ggml_type):
    """K = 5120 (Mistral-Small's hidden size): Q6_K / Q3_K rows are 4200 / 2200 bytes, not a
    multiple of 16, so rows after the first start at unaligned addresses; and a weight row
    view starting at an odd row (as QWeight.rows gives)."""
    from tramontane.kernels.qmatmul import linear_rows

    shape = (5, 5120)
    raw, deq = _weight(ggml_type, shape, 7)
    w = QWeight.from_raw(raw, ggml_type, shape, DEV)
    x = torch.randn(3, shape[1], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    _check(deq, x, linear_rows(x.to(DEV), w))
    _check(deq[1:4], x, linear_rows(x.to(DEV), w.rows(1, 4)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K, gt.Q3_K, gt.Q8_0, gt.IQ4_XS])
def test_a_wrong_weight_is_caught(ggml_type, dtype):
    """The bound sees one flipped nibble in a 2048-wide row (the check is not vacuous). Checked
    on the float32 partial sums of a K split: a bf16 output's own rounding (2^-8 of |y|) is
    about the size of one weight's error at this K."""
    from tramontane.kernels.qmatmul import _rows_parts

    shape = (3, 2048)
    raw, deq = _weight(ggml_type, shape, 11)
    x = torch.randn(2, shape[1], generator=torch.Generator().manual_seed(2)).to(dtype)
    bad = raw.copy().reshape(shape[0], -1)
    bad[1, 16 + 40] ^= 0x0F  # a quant byte's low nibble in row 1 (in every type here)
    config = (16, 32, 2, 4)
    parts = _rows_parts(x.to(DEV), QWeight.from_raw(raw, ggml_type, shape, DEV), config)
    assert parts.dtype == torch.float32 and parts.shape == (2, 2, 3)
    _check(deq, x, parts)
    with pytest.raises(AssertionError):
        _check(deq, x, _rows_parts(x.to(DEV), QWeight.from_raw(bad, ggml_type, shape, DEV), config))


def test_rows_kernel_refuses_float32_activations():
    from tramontane.kernels.qmatmul import linear_rows

    raw, _ = _weight(gt.Q4_K, (4, 256), 1)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        linear_rows(torch.zeros(2, 256, device=DEV), QWeight.from_raw(raw, gt.Q4_K, (4, 256), DEV))


def test_cuda_path_by_rows_and_dtype():
    """linear() on CUDA: decode kernel for one row, the tensor-core kernel for 2..FUSED_MAX_ROWS
    bf16 rows, scratch + cuBLAS beyond; float32 (never rounded) and fp16 (pre-Ampere GPUs, no
    MMA from Triton there) keep the decode kernel up to 8 rows."""
    assert cuda_kernel_for(1, torch.bfloat16) == "decode"
    assert [cuda_kernel_for(r, torch.bfloat16) for r in (2, 9, FUSED_MAX_ROWS)] == ["rows"] * 3
    assert cuda_kernel_for(FUSED_MAX_ROWS + 1, torch.bfloat16) == "dense"
    for dtype in (torch.float32, torch.float16):
        assert [cuda_kernel_for(r, dtype) for r in (1, 8, 9, 600)] == ["decode", "decode", "dense", "dense"]


def test_rows_config_fills_the_gpu_and_bounds_the_split(monkeypatch):
    """Shapes of Mistral-Small-3.1-24B on a 132-SM GPU: the row tile holds the rows (up to the
    largest tile, 64), its one-stage shared memory fits every GPU from sm_80 (99 KiB on
    sm_86/89/120), and a K split only fills the GPU."""
    from tramontane.kernels import qmatmul

    class Gpu:
        type = "cuda"

    sms = 132
    monkeypatch.setattr(qmatmul, "_sm_count", lambda device: sms)
    for m, n, k in itertools.product((2, 3, 17, 64, 100, FUSED_MAX_ROWS), (5120, 1024, 32768, 131072), (5120, 32768)):
        bm, bn, split, warps = qmatmul.rows_config(m, n, k, Gpu())
        assert bm >= min(m, 64) and bm in (16, 32, 64, 128) and bn >= 16
        assert (bm + bn) * 512 <= 99 << 10
        most_split = max(1, k // 256 // qmatmul.ROWS_MIN_UNITS_PER_SPLIT)
        assert 1 <= split <= most_split
        programs = -(-n // bn) * -(-m // bm) * split
        assert programs >= 2 * sms or split == most_split


COMPILE_SCRIPT = r'''
import json, sys
import triton  # first: the kernels are then decorated for Triton's compiler (triton_compat)
from tramontane.kernels import aot, aot_build, ggml_types as gt, qmatmul
out = []
for d in qmatmul.COMPILE_SPECS:
    t = d["constexprs"].get("QTYPE")
    if d["kernel"] is qmatmul._rows_kernel and t in (gt.Q4_K, gt.Q6_K) and "*bf16" in d["signature"]["out_ptr"]:
        for cc in (80, 90):
            e = aot_build.compile_spec(aot.KernelSpec.of(d), cc)
            out.append([d["name"], cc, e["regs"], e["spill_bytes"], e["shared"] + e["shared_static"]])
print("RESULT " + json.dumps(out))
'''


@pytest.mark.skipif(not nvidia_backend(), reason="Triton with its NVIDIA backend (bundled ptxas) not installed")
def test_rows_kernel_compiles_for_sm80_and_sm90_without_real_spills():
    """The Q4_K_M types' multi-row specs (COMPILE_SPECS: the launches' own specializations,
    aligned and unaligned Q6_K rows) compile for Ampere and Hopper with Triton's ptxas: at most a
    couple of spilled words a thread (8 bytes measured for Q6_K 64x32 on sm_80; the tiles ruled
    out spill 144-984) and shared memory within the 99 KiB of sm_86/89/120."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    results = json.loads(line[len("RESULT "):])
    assert len(results) == 2 * 2 * 3  # Q4_K 2 tiles, Q6_K 2 tiles x 2 row alignments; 2 targets
    for name, cc, regs, spill, shared in results:
        assert spill <= 16 and shared <= 99 << 10, (name, cc, regs, spill, shared)
