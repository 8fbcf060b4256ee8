"""Reference HF models for GGUF fixtures: the weights of a GGUF file, dequantized with
gguf-py's `gguf.quants.dequantize` (not our kernels) and with Q/K rows un-permuted back to HF's
rotate-half layout, loaded into HF transformers' `MistralForCausalLM`.

So a test can compare our engine on a (quantized) GGUF against HF running exactly the same
numbers. `tests/engine/mistral3/test_reference_fixtures.py` proves the path on the f32
fixtures: the model built here reproduces the original HF checkpoint's logits.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

HF_TEXT_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
HF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half rows -> llama.cpp interleaved-pair rows (what convert_hf_to_gguf does)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `permute_rows`."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_as_f32(tensor) -> np.ndarray:
    """Any reader tensor as float32 in numpy/torch order (rows, cols), via gguf.quants."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if qtype == GGMLQuantizationType.F32:
        return np.array(tensor.data, dtype=np.float32).reshape(shape)
    return dequantize(np.asarray(tensor.data), qtype).astype(np.float32).reshape(shape)


def _kv(reader: GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def dequantized_state_dict(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """(HF MistralForCausalLM state dict as float32 arrays, hyper-parameters) of a text GGUF."""
    reader = GGUFReader(path)
    arch = _kv(reader, "general.architecture")
    if _kv(reader, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise NotImplementedError(f"{path}: YaRN files: use the committed HF dir (ministral3_tiny/)")
    hp = {
        "arch": arch,
        "n_layer": _kv(reader, f"{arch}.block_count"),
        "n_embd": _kv(reader, f"{arch}.embedding_length"),
        "n_ff": _kv(reader, f"{arch}.feed_forward_length"),
        "n_head": _kv(reader, f"{arch}.attention.head_count"),
        "n_head_kv": _kv(reader, f"{arch}.attention.head_count_kv"),
        "head_dim": _kv(reader, f"{arch}.attention.key_length"),
        "rope_theta": _kv(reader, f"{arch}.rope.freq_base"),
        "rms_eps": _kv(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        "context_length": _kv(reader, f"{arch}.context_length"),
        "n_vocab": len(reader.fields["tokenizer.ggml.tokens"].data),
    }
    sd: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = tensor_as_f32(t)
        if t.name in HF_TEXT_NAMES:
            sd[HF_TEXT_NAMES[t.name]] = w
            continue
        _, bid, role, _ = t.name.split(".")
        if role == "attn_q":
            w = unpermute_rows(w, hp["n_head"])
        elif role == "attn_k":
            w = unpermute_rows(w, hp["n_head_kv"])
        sd[f"model.layers.{bid}.{HF_BLOCK_NAMES[role]}.weight"] = w
    if "lm_head.weight" not in sd:  # tied head
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd, hp


def hf_text_model_from_gguf(path: str | Path):
    """HF `MistralForCausalLM` (float32, eval) holding the dequantized weights of a text GGUF."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    sd, hp = dequantized_state_dict(path)
    cfg = MistralConfig(
        vocab_size=hp["n_vocab"], hidden_size=hp["n_embd"], intermediate_size=hp["n_ff"],
        num_hidden_layers=hp["n_layer"], num_attention_heads=hp["n_head"],
        num_key_value_heads=hp["n_head_kv"], head_dim=hp["head_dim"], rms_norm_eps=hp["rms_eps"],
        max_position_embeddings=hp["context_length"], sliding_window=None,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": hp["rope_theta"]},
    )
    model = MistralForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"{path}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


def write_hf_dir_from_gguf(path: str | Path, out_dir: str | Path) -> Path:
    """Save `hf_text_model_from_gguf(path)` as an HF dir (safetensors) at `out_dir`."""
    model = hf_text_model_from_gguf(path)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def greedy_tokens(model, ids, n: int) -> list[int]:
    """`n` greedy tokens of our decoder after the prompt `ids` (prefill, then one decode a step)."""
    from tramontane.engine.runtime.decoder import decode, new_cache

    cache = new_cache(model, len(ids) + n)
    logits = model.logits(ids, 0, cache)
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = decode(model, out[-1], cache)
    return out
