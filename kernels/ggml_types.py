"""GGML tensor types this engine can hold on a device: ids, block geometry, checks.

Ids are ggml's (== gguf.GGMLQuantizationType values); they are repeated here so the engine's
hot path does not depend on gguf-py's enum.
"""
from __future__ import annotations

from dataclasses import dataclass


class QuantFormatError(ValueError):
    """A weight's bytes, type or shape do not fit together."""


F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ4_NL, BF16, IQ4_XS = 20, 30, 23

QK_K = 256  # elements per K-quant super-block


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block

    @property
    def is_float(self) -> bool:
        return self.id in (F32, F16, BF16)


# Every ggml tensor type a GGUF file may name (ggml.h; tests/engine/test_memory.py checks this
# equals gguf.constants.GGML_QUANT_SIZES): the reader sizes any tensor with it.
GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in (
        GGMLType(F32, "F32", 1, 4), GGMLType(F16, "F16", 1, 2), GGMLType(Q4_0, "Q4_0", 32, 18),
        GGMLType(Q4_1, "Q4_1", 32, 20), GGMLType(Q5_0, "Q5_0", 32, 22), GGMLType(Q5_1, "Q5_1", 32, 24),
        GGMLType(Q8_0, "Q8_0", 32, 34), GGMLType(9, "Q8_1", 32, 40), GGMLType(Q2_K, "Q2_K", QK_K, 84),
        GGMLType(Q3_K, "Q3_K", QK_K, 110), GGMLType(Q4_K, "Q4_K", QK_K, 144), GGMLType(Q5_K, "Q5_K", QK_K, 176),
        GGMLType(Q6_K, "Q6_K", QK_K, 210), GGMLType(15, "Q8_K", QK_K, 292), GGMLType(16, "IQ2_XXS", QK_K, 66),
        GGMLType(17, "IQ2_XS", QK_K, 74), GGMLType(18, "IQ3_XXS", QK_K, 98), GGMLType(19, "IQ1_S", QK_K, 50),
        GGMLType(IQ4_NL, "IQ4_NL", 32, 18), GGMLType(21, "IQ3_S", QK_K, 110), GGMLType(22, "IQ2_S", QK_K, 82),
        GGMLType(IQ4_XS, "IQ4_XS", QK_K, 136), GGMLType(24, "I8", 1, 1), GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4), GGMLType(27, "I64", 1, 8), GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", QK_K, 56), GGMLType(BF16, "BF16", 1, 2), GGMLType(34, "TQ1_0", QK_K, 54),
        GGMLType(35, "TQ2_0", QK_K, 66), GGMLType(39, "MXFP4", 32, 17), GGMLType(40, "NVFP4", 64, 36),
        GGMLType(41, "Q1_0", 128, 18),
    )
}

# The ones this engine can hold on a device and multiply.
TYPES: dict[int, GGMLType] = {
    t: GGML_TYPES[t]
    for t in (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)
}

QUANTIZED_TYPES = tuple(t for t, info in TYPES.items() if not info.is_float)


def type_info(ggml_type: int) -> GGMLType:
    try:
        return TYPES[int(ggml_type)]
    except KeyError:
        raise QuantFormatError(
            f"ggml type {ggml_type} is not supported (supported: {', '.join(t.name for t in TYPES.values())})"
        ) from None


def type_name(ggml_type: int) -> str:
    info = TYPES.get(int(ggml_type))
    return info.name if info else f"type {ggml_type}"


def row_bytes(ggml_type: int, cols: int) -> int:
    """Bytes of one row of `cols` elements; raises if cols is not a whole number of blocks."""
    info = type_info(ggml_type)
    if cols <= 0 or cols % info.block_size:
        raise QuantFormatError(
            f"{info.name} rows must hold a positive multiple of {info.block_size} elements, got {cols}"
        )
    return cols // info.block_size * info.type_size


def f16_field(blocks, offset: int):
    """float32 of the little-endian f16 at byte `offset` of each block: (n_blocks, 1)."""
    import torch

    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)
