"""F32 / F16 / BF16 weights: no blocks, the bytes are the values."""
from __future__ import annotations

import torch

from .ggml_types import BF16, F16, F32

FLOAT_DTYPES = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}


def float_view(raw: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The uint8 bytes seen as the file's float dtype (1-D, zero copy)."""
    return raw.contiguous().view(FLOAT_DTYPES[ggml_type])


def dequantize_float_ref(raw: torch.Tensor, ggml_type: int) -> torch.Tensor:
    return float_view(raw, ggml_type).to(torch.float32)
