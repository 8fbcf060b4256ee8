"""Triton kernels under the interpreter (CPU tensors): dequant bit-exact vs gguf.quants, fused
decode matmul and prefill path within 1e-5 (relative to max |ref|; the issue asks 1e-3) of
gguf.quants dequant -> float32 matmul; float16 activations within 1e-3."""
import numpy as np
import pytest
import torch

from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import QWeight, linear_reference
from support.quant_bytes import gguf_dequantized, random_quant_bytes
from tramontane.kernels.triton_compat import triton_usable

pytestmark = pytest.mark.skipif(not triton_usable(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter on CPU: TRITON_INTERPRET=1, see conftest)")

QTYPES = list(gt.QUANTIZED_TYPES)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _cols(ggml_type: int) -> int:
    # legacy types: 11 blocks = one full unit of 8 blocks + a partial one (tail masking)
    return 352 if gt.type_info(ggml_type).block_size == 32 else 512


@pytest.mark.parametrize("ggml_type", QTYPES, ids=gt.type_name)
def test_triton_dequant_bit_exact(ggml_type):
    from tramontane.kernels.qmatmul import dequantize_triton

    rng = np.random.default_rng(ggml_type)
    shape = (11, _cols(ggml_type))  # odd rows, not a multiple of the kernel's 8-row tile
    raw = random_quant_bytes(ggml_type, shape, rng, scale=None)
    w = QWeight.from_raw(raw, ggml_type, shape, DEV)
    ours = dequantize_triton(w, torch.float32).cpu().numpy()
    theirs = gguf_dequantized(raw, ggml_type, shape)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    # row slices are byte-row slices
    np.testing.assert_array_equal(dequantize_triton(w.rows(3, 8)).cpu().numpy().view(np.uint32),
                                  theirs[3:8].view(np.uint32))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float().cpu() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("ggml_type", QTYPES, ids=gt.type_name)
def test_triton_decode_and_prefill_match_dequant_matmul(ggml_type):
    from tramontane.kernels.qmatmul import linear_decode, linear_prefill

    rng = np.random.default_rng(1000 + ggml_type)
    shape = (13, _cols(ggml_type))
    raw = random_quant_bytes(ggml_type, shape, rng)
    w = QWeight.from_raw(raw, ggml_type, shape, DEV)
    w_ref = torch.from_numpy(gguf_dequantized(raw, ggml_type, shape))
    gen = torch.Generator().manual_seed(ggml_type)
    errs = {}
    for rows in (1, 2, 7):  # decode sizes (64 rows on the decode kernel: see test below)
        x = torch.randn(rows, shape[1], generator=gen)
        ref = x @ w_ref.t()
        # default config, and a forced split-K / 2-row-tile config
        for config in (None, (4, 2, 2)) if rows == 2 else (None,):
            out = linear_decode(x.to(DEV), w, config=config)
            assert out.shape == (rows, shape[0]) and out.dtype == torch.float32
            errs[("decode", rows, config)] = _rel_err(out, ref)
        if rows == 7:  # f16 activations: output dtype follows x
            out16 = linear_decode(x.to(DEV, torch.float16), w)
            assert out16.dtype == torch.float16
            # f16 output rounding (2^-11 relative) dominates
            assert _rel_err(out16, x.half().float() @ w_ref.t()) <= 1e-3
    # prefill: 37 weight rows in chunks of 16 (the smallest chunk: its rows start 16-byte
    # aligned), 16 + 16 + 5
    shape_p = (37, shape[1])
    raw_p = random_quant_bytes(ggml_type, shape_p, rng)
    w_p = QWeight.from_raw(raw_p, ggml_type, shape_p, DEV)
    w_ref_p = torch.from_numpy(gguf_dequantized(raw_p, ggml_type, shape_p))
    for rows in (2, 64, 300):
        x = torch.randn(rows, shape[1], generator=gen)
        ref = x @ w_ref_p.t()
        errs[("prefill", rows)] = _rel_err(linear_prefill(x.to(DEV), w_p, chunk_bytes=4 * shape[1] * 5), ref)
        errs[("reference", rows)] = _rel_err(linear_reference(x, w_p.to("cpu")), ref)
    # float32 everywhere: only summation order differs (measured ~1e-7); the issue asks 1e-3
    worst = max(errs.values())
    assert worst <= 1e-5, {k: v for k, v in errs.items() if v > 1e-5}


@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K, gt.Q5_0])
def test_decode_kernel_many_rows_and_3d_input(ggml_type):
    """The decode kernel also handles any row count (grid over 8-row tiles) and (..., in) inputs."""
    from tramontane.kernels.qmatmul import linear_decode

    rng = np.random.default_rng(5)
    shape = (9, 256)
    raw = random_quant_bytes(ggml_type, shape, rng)
    w = QWeight.from_raw(raw, ggml_type, shape, DEV)
    w_ref = torch.from_numpy(gguf_dequantized(raw, ggml_type, shape))
    for x in (torch.randn(1, 3, 256), torch.randn(64, 256)):
        out = linear_decode(x.to(DEV), w)
        assert out.shape == (*x.shape[:-1], 9)
        assert _rel_err(out, x @ w_ref.t()) <= 1e-5
