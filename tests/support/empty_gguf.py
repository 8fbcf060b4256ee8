"""Model files with real headers and no data: the tensor inventory of a big model (shapes and
llama.cpp's quant types) in a sparse file of a few kilobytes on disk, for the device planner."""
from __future__ import annotations

import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import GGML_QUANT_SIZES


def tensor_bytes(shape, qtype) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


def q4_k_m_type(name: str, n_layers: int):
    """llama.cpp's Q4_K_M (llama_tensor_get_type): Q6_K for output, and for attn_v / ffn_down
    of the layers its use_more_bits picks (first and last eighth, every third between); Q4_K
    elsewhere. The one copy: the quantized fixtures and bench/model.py use it too."""
    if name == "output.weight":
        return T.Q6_K
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down"):
        i = int(parts[1])
        more = i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2
        return T.Q6_K if more else T.Q4_K
    return T.Q4_K


def write_empty_gguf(path, n_layers: int, hidden: int, ffn: int, mix: str = "q4_k_m",
                      n_heads: int = 32, n_kv: int = 8, head_dim: int = 128, vocab: int = 131072):
    """A mistral3 GGUF with the real header and tensor infos, and a hole where the data goes."""
    w = GGUFWriter(str(path), "mistral3")
    w.add_block_count(n_layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_context_length(131072)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(1e9)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    tensors = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    for i in range(n_layers):
        b = f"blk.{i}."
        tensors.update({b + "attn_norm.weight": (hidden,), b + "ffn_norm.weight": (hidden,),
                        b + "attn_q.weight": (n_heads * head_dim, hidden), b + "attn_k.weight": (n_kv * head_dim, hidden),
                        b + "attn_v.weight": (n_kv * head_dim, hidden), b + "attn_output.weight": (hidden, n_heads * head_dim),
                        b + "ffn_gate.weight": (ffn, hidden), b + "ffn_up.weight": (ffn, hidden),
                        b + "ffn_down.weight": (hidden, ffn)})
    data = 0
    for name, shape in tensors.items():
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
            n = 4 * shape[0]
        else:
            qtype = q4_k_m_type(name, n_layers) if mix == "q4_k_m" else T.Q8_0
            block, size = GGML_QUANT_SIZES[qtype]
            n = tensor_bytes(shape, qtype)
            w.add_tensor_info(name, (shape[0], shape[1] // block * size), np.dtype(np.uint8), n, raw_dtype=qtype)
        data += (n + 31) // 32 * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    os.truncate(path, (os.path.getsize(path) + 31) // 32 * 32 + data)
    return path
