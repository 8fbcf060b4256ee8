"""Scale-after-dot decode (qmatmul._decode_dot_kernel, one activation row, Q4_K) under the
interpreter: vs gguf.quants dequant -> float64 matmul, within 1e-5 of max |ref| (float32
activations; measured ~1e-7), with every split-K, row tails and 3-D input; f16 activations 1e-3."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import QWeight
from support.quant_bytes import random_quant_bytes
from tramontane.kernels.triton_compat import triton_usable

pytestmark = pytest.mark.skipif(not triton_usable(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter on CPU: TRITON_INTERPRET=1, see conftest)")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _dot_types():
    from tramontane.kernels.qmatmul import DOT_TYPES

    return sorted(DOT_TYPES)


@pytest.mark.parametrize("ggml_type", _dot_types(), ids=gt.type_name)
def test_dot_decode_matches_reference(ggml_type):
    from tramontane.kernels.qmatmul import _decode_parts, decode_config, linear_decode

    rng = np.random.default_rng(77 + ggml_type)
    shape = (37, 1024)  # 37 rows: one full 32-row tile + a masked tail; 4 units to split over
    raw = random_quant_bytes(ggml_type, shape, rng, scale=0.05)
    w = QWeight.from_raw(raw, ggml_type, shape, DEV)
    w_ref = torch.from_numpy(gguf_dequantize(raw.reshape(shape[0], -1), GGMLQuantizationType(ggml_type))).double()
    gen = torch.Generator().manual_seed(3)
    # activations with a mean offset: the dmin*m*sum(x) term must not be lost in cancellation
    x = torch.randn(1, shape[1], generator=gen) + 0.5
    ref = (x.double() @ w_ref.t()).float()
    bn, bm, _, warps = decode_config(*shape, 1, torch.device(DEV), ggml_type)
    assert bm == 1
    for split in (1, 2, 3, 4):  # 3: uneven shares of the 4 units
        out = linear_decode(x.to(DEV), w, config=(bn, 1, split, warps))
        err = float((out.cpu() - ref).abs().max() / ref.abs().max())
        assert err <= 1e-5, (split, err)
    out3 = linear_decode(x.reshape(1, 1, -1).to(DEV), w)  # (..., in) input, one row
    assert out3.shape == (1, 1, shape[0])
    assert float((out3.reshape(1, -1).cpu() - ref).abs().max() / ref.abs().max()) <= 1e-5
    x16 = x.half()
    out16 = linear_decode(x16.to(DEV), w)
    assert out16.dtype == torch.float16
    ref16 = x16.double() @ w_ref.t()
    assert float((out16.double().cpu() - ref16).abs().max() / ref16.abs().max()) <= 1e-3
    # bf16 activations take the packed path (4 per 8-byte load, unpacked by bit shifts); the
    # output is bf16 (one ulp = 2^-7 relative: the interpreter converts toward zero), a wrong
    # unpacking order would be off by O(1). Exactness of the sums: vs the f32 path below.
    xb = x.bfloat16()
    refb = xb.double() @ w_ref.t()
    for split in (1, 3):
        outb = linear_decode(xb.to(DEV), w, config=(bn, 1, split, warps))
        assert outb.dtype == torch.bfloat16
        assert float((outb.double().cpu() - refb).abs().max() / refb.abs().max()) <= 8e-3
    # split over K: float32 partials, so the packed-bf16 sums can be compared to the f32 path
    part = torch.empty(2, 1, shape[0])
    for src, dst in ((xb, part[0]), (xb.float(), part[1])):
        dst.copy_(_decode_parts(src.to(DEV), w, (bn, 1, 4, warps)).sum(0).cpu())
    assert float((part[0] - part[1]).abs().max() / part[1].abs().max()) <= 1e-6
    # a bf16 row at an odd element offset cannot be loaded 8 bytes at a time: scalar path
    xo = torch.zeros(1, shape[1] + 1, dtype=torch.bfloat16)
    xo[0, 1:] = xb[0]
    outo = linear_decode(xo[:, 1:].to(DEV), w)
    assert float((outo.double().cpu() - refb).abs().max() / refb.abs().max()) <= 8e-3


@pytest.mark.parametrize("ggml_type", _dot_types(), ids=gt.type_name)
def test_unaligned_weight_bytes_take_the_generic_kernel(ggml_type):
    """The dot units load 16/32-bit words: weight bytes at an odd address (a view into a byte
    buffer) must go to the byte-loading generic kernel, still correct."""
    from tramontane.kernels.qmatmul import linear_decode

    rng = np.random.default_rng(9)
    shape = (5, 512)
    raw = random_quant_bytes(ggml_type, shape, rng)
    buf = torch.zeros(raw.size + 1, dtype=torch.uint8, device=DEV)
    buf[1:] = torch.from_numpy(raw).to(DEV)
    w = QWeight(ggml_type, shape, buf[1:].view(shape[0], -1))
    assert w.data.data_ptr() % 2 == 1
    w_ref = torch.from_numpy(gguf_dequantize(raw.reshape(shape[0], -1), GGMLQuantizationType(ggml_type)))
    x = torch.randn(1, shape[1])
    ref = x @ w_ref.t()
    out = linear_decode(x.to(DEV), w)
    assert float((out.cpu() - ref).abs().max() / ref.abs().max()) <= 1e-5
