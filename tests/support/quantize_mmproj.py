"""A quantized copy of an mmproj GGUF, made the way llama.cpp's clip quantizer chose its tensors:
every tensor named `*weight` that is 2-D with rows longer than one block is quantized (the
attention, MLP, merger and projector matrices); the 4-D patch conv, norms and biases keep their
type. Quantized with gguf-py (gguf.quants.quantize), not our engine.

    python tests/support/quantize_mmproj.py IN.gguf OUT.gguf [--type Q8_0]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES, LlamaFileType
from gguf.quants import dequantize, quantize

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.gguf_edit import rewrite_gguf
else:
    from .gguf_edit import rewrite_gguf

FILE_TYPES = {GGMLQuantizationType.Q8_0: LlamaFileType.MOSTLY_Q8_0}


def quantized_names(reader: GGUFReader, qtype: GGMLQuantizationType) -> list[str]:
    """The tensors clip's quantizer would quantize: `.*weight`, 2-D, ne[0] > block size."""
    block = GGML_QUANT_SIZES[qtype][0]
    return [t.name for t in reader.tensors
            if t.name.endswith("weight") and len(t.shape) == 2 and int(t.shape[0]) > block
            and int(t.shape[0]) % block == 0]


def quantized_mmproj_copy(src: str | Path, dst: str | Path,
                          qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0) -> Path:
    reader = GGUFReader(src)
    chosen = set(quantized_names(reader, qtype))
    replace = {}
    for t in reader.tensors:
        if t.name not in chosen:
            continue
        rows, cols = int(t.shape[1]), int(t.shape[0])
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            values = np.asarray(t.data, dtype=np.float32).reshape(rows, cols)
        else:
            values = dequantize(t.data, GGMLQuantizationType(t.tensor_type)).reshape(rows, cols)
        replace[t.name] = (quantize(values, qtype), qtype)
    return rewrite_gguf(src, dst, replace_tensors=replace, set_kv={"general.file_type": int(FILE_TYPES[qtype])})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", default="Q8_0", choices=[t.name for t in FILE_TYPES])
    args = ap.parse_args(argv)
    quantized_mmproj_copy(args.src, args.dst, GGMLQuantizationType[args.type])
    print(f"wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
