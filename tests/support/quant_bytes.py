"""Random *valid* quantized weights for tests and fixtures: random bytes whose f16 scale
fields are replaced by finite f16 values (random bytes there could be inf/NaN), and their
dequantization by gguf.quants, the reference the kernels are held to."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tramontane.kernels.ggml_types import (
    BF16, F16, F32, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
    row_bytes, type_info,
)

# byte offsets of the f16 fields (d, dmin/m) inside one block
F16_FIELDS = {
    Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,),
    Q2_K: (80, 82), Q3_K: (108,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,),
    IQ4_NL: (0,), IQ4_XS: (0,),
}


def random_quant_bytes(ggml_type: int, shape: tuple[int, int], rng: np.random.Generator,
                       scale: float | None = 0.02) -> np.ndarray:
    """uint8 bytes of a (rows, cols) tensor of `ggml_type`. With `scale`, the f16 fields are
    |N(0, scale)|-ish with random sign (values of a sane size for matmul checks); with
    scale=None they are any finite f16 bit pattern (for bit-exactness checks)."""
    rows, cols = shape
    info = type_info(ggml_type)
    n_bytes = rows * row_bytes(ggml_type, cols)
    if info.is_float:
        dtype = {F32: np.float32, F16: np.float16}.get(ggml_type)
        if dtype is not None:
            return rng.standard_normal(rows * cols).astype(dtype).view(np.uint8)
        assert ggml_type == BF16
        f = rng.standard_normal(rows * cols).astype(np.float32).view(np.uint32)
        return (f >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=n_bytes, dtype=np.uint8)
    blocks = raw.reshape(-1, info.type_size)
    for off in F16_FIELDS[ggml_type]:
        if scale is None:
            bits = blocks[:, off : off + 2].copy().view(np.uint16)
            inf_nan = (bits & 0x7C00) == 0x7C00
            bits[inf_nan] &= np.uint16(0xBFFF)  # clear the top exponent bit: finite
            blocks[:, off : off + 2] = bits.view(np.uint8)
        else:
            vals = (rng.standard_normal(blocks.shape[0]) * scale).astype(np.float16)
            blocks[:, off : off + 2] = vals.reshape(-1, 1).view(np.uint8)
    return raw


def gguf_dequantized(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> np.ndarray:
    """gguf.quants' float32 (rows, cols) of a weight's raw bytes, any row layout of them."""
    return gguf_dequantize(raw.reshape(shape[0], row_bytes(ggml_type, shape[1])),
                           GGMLQuantizationType(ggml_type)).astype(np.float32)
