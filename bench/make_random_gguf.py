"""Random GGUF files with real shapes, for the GPU check and benchmarks (nothing under tests/ uses it).

    python bench/make_random_gguf.py model OUT.gguf [--layers 40 --hidden 5120 ...]   # Mistral-Small-3.1-24B Q4_K_M
    python bench/make_random_gguf.py mmproj OUT.gguf --proj 5120                       # its Pixtral projector, f16

The text model: a mistral3 GGUF with the tekken vocabulary of tests/fixtures (131072 tokens),
llama-quantize's Q4_K_M type choice (tests/support/empty_gguf.q4_k_m_type: Q6_K for the head and
for attn_v / ffn_down of the layers its use_more_bits picks), blocks of random bytes with small
positive scales, written tensor by tensor (a 14.3 GB file in a minute, in little memory). The
projector: llama.cpp's Pixtral layout (clip, projector_type pixtral), random f16 weights of
Mistral-Small-3.1's tower (24 x 1024, ffn 4096, 16 heads, patch 14, image 1540, merge 2, SiLU).
Outputs are noise; every matmul has the real shape and type, so speeds compare like for like.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.empty_gguf import q4_k_m_type  # noqa: E402  (the one copy of llama.cpp's rule)

VOCAB = ROOT / "tests" / "fixtures" / "tekken_240911_tokenizer.gguf"
# byte offset of the f16 `d` (and `dmin`) in a block
SCALE_AT = {T.Q4_K: (0, 2), T.Q6_K: (208, None)}


def _field(f):
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        sub = f.types[1]
        if sub == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data], t, sub
        return [f.parts[i].tolist()[0] for i in f.data], t, sub
    if t == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode(), t, None
    return f.parts[f.data[0]].tolist()[0], t, None


def _blocks(rng, qtype, rows: int, cols: int) -> np.ndarray:
    """(rows, row_bytes) random blocks whose scales are small and positive (d 0.002, dmin 0.001)."""
    bsz, tsz = GGML_QUANT_SIZES[qtype]
    nb = cols // bsz
    out = np.frombuffer(rng.bytes(rows * nb * tsz), dtype=np.uint8).reshape(rows, nb, tsz).copy()
    d_at, dmin_at = SCALE_AT[qtype]
    out[:, :, d_at:d_at + 2] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if dmin_at is not None:
        out[:, :, dmin_at:dmin_at + 2] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
    return out.reshape(rows, nb * tsz)


def write_model(out: str, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                vocab_file: Path = VOCAB, seed: int = 5) -> int:
    src = GGUFReader(str(vocab_file))
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = GGUFWriter(out, "mistral3")
    w.add_name(f"random-mistral3-{layers}x{hidden}-q4_k_m")
    for k, v in (("block_count", layers), ("context_length", 131072), ("embedding_length", hidden),
                 ("feed_forward_length", ffn), ("attention.head_count", heads),
                 ("attention.head_count_kv", kv_heads), ("attention.key_length", head_dim),
                 ("attention.value_length", head_dim), ("vocab_size", vocab), ("rope.dimension_count", head_dim)):
        w.add_uint32(f"mistral3.{k}", v)
    w.add_float32("mistral3.rope.freq_base", 1e9)
    w.add_float32("mistral3.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("general.file_type", 15)  # MOSTLY_Q4_K_M
    w.add_uint32("general.quantization_version", 2)
    for k, f in src.fields.items():
        if k.startswith("tokenizer."):
            v, t, sub = _field(f)
            if t == GGUFValueType.ARRAY and sub == GGUFValueType.STRING:
                w.add_array(k, v)
            elif t == GGUFValueType.ARRAY:
                w.add_key_value(k, v, t, sub_type=sub)
            else:
                w.add_key_value(k, v, t)
    q, kv = heads * head_dim, kv_heads * head_dim
    plan = [("token_embd.weight", vocab, hidden), ("output_norm.weight", hidden, 0), ("output.weight", vocab, hidden)]
    for i in range(layers):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", hidden, 0), (p + "attn_q.weight", q, hidden), (p + "attn_k.weight", kv, hidden),
                 (p + "attn_v.weight", kv, hidden), (p + "attn_output.weight", hidden, q),
                 (p + "ffn_norm.weight", hidden, 0), (p + "ffn_gate.weight", ffn, hidden),
                 (p + "ffn_up.weight", ffn, hidden), (p + "ffn_down.weight", hidden, ffn)]
    types = {name: (None if cols == 0 else q4_k_m_type(name, layers)) for name, _, cols in plan}
    for name, rows, cols in plan:
        qt = types[name]
        if qt is None:
            w.add_tensor_info(name, (rows,), np.dtype(np.float32), rows * 4)
        else:
            bsz, tsz = GGML_QUANT_SIZES[qt]
            w.add_tensor_info(name, (rows, cols // bsz * tsz), np.dtype(np.uint8), rows * cols // bsz * tsz, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, rows, cols in plan:
        qt = types[name]
        if qt is None:
            w.write_tensor_data(np.ones(rows, dtype=np.float32))
        else:
            step = max(1, (256 << 20) // (cols // GGML_QUANT_SIZES[qt][0] * GGML_QUANT_SIZES[qt][1]))
            parts = [_blocks(rng, qt, min(step, rows - r), cols) for r in range(0, rows, step)]
            w.write_tensor_data(np.concatenate(parts) if len(parts) > 1 else parts[0])
    w.close()
    return os.path.getsize(out)


def write_mmproj(out: str, proj: int, layers: int = 24, hidden: int = 1024, ffn: int = 4096, heads: int = 16,
                 seed: int = 11) -> int:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(out, "clip")
    w.add_string("general.type", "mmproj")
    w.add_name("random-pixtral")
    w.add_uint32("general.file_type", 1)
    w.add_bool("clip.has_vision_encoder", True)
    for k, v in (("projection_dim", proj), ("image_size", 1540), ("patch_size", 14), ("embedding_length", hidden),
                 ("feed_forward_length", ffn), ("block_count", layers), ("attention.head_count", heads),
                 ("spatial_merge_size", 2)):
        w.add_uint32(f"clip.vision.{k}", v)
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    w.add_string("clip.projector_type", "pixtral")
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_bool("clip.use_silu", True)
    w.add_uint32("general.quantization_version", 2)

    def mat(name, out_f, in_f):  # numpy (out, in)
        w.add_tensor(name, (rng.standard_normal((out_f, in_f), dtype=np.float32) / np.sqrt(in_f)).astype(np.float16))

    def norm(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    w.add_tensor("v.token_embd.img_break", rng.standard_normal(proj, dtype=np.float32))  # libmtmd reads it
    mat("mm.1.weight", proj, hidden)
    mat("mm.2.weight", proj, proj)
    norm("mm.input_norm.weight", hidden)
    mat("mm.patch_merger.weight", hidden, 4 * hidden)
    norm("v.pre_ln.weight", hidden)
    w.add_tensor("v.patch_embd.weight",
                 (rng.standard_normal((hidden, 3, 14, 14), dtype=np.float32) / np.sqrt(588)).astype(np.float16))
    for i in range(layers):
        b = f"v.blk.{i}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(b + n + ".weight", hidden, hidden)
        norm(b + "ln1.weight", hidden)
        mat(b + "ffn_gate.weight", ffn, hidden)
        mat(b + "ffn_up.weight", ffn, hidden)
        mat(b + "ffn_down.weight", hidden, ffn)
        norm(b + "ln2.weight", hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.path.getsize(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["model", "mmproj"])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=None, help="model 40, mmproj 24")
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=32768)
    ap.add_argument("--proj", type=int, default=5120, help="mmproj: the text model's hidden size")
    a = ap.parse_args(argv)
    if a.what == "model":
        n = write_model(a.out, a.layers or 40, a.hidden, a.heads, a.kv_heads, a.head_dim, a.ffn)
    else:
        n = write_mmproj(a.out, a.proj, a.layers or 24)
    print(f"{a.out}: {n / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
