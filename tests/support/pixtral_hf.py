"""A random HF Pixtral tower + Mistral-3 projector, and the mmproj GGUF llama.cpp's converter
would write from it: the reference side of the vision tests and of bench/vision.py."""
from __future__ import annotations

import io

import numpy as np
import torch

PATCH, MERGE = 14, 2
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def build_hf(shape: dict, image_size: int, activation: str = "silu", *, seed: int = 0, device: str = "cpu",
             attention: str = "sdpa", f16_exact: bool = False):
    """(PixtralVisionModel, Mistral3MultiModalProjector) with random weights, norms in [0.5, 1.5].
    `shape`: hidden, layers, heads, ffn, text_hidden. f16_exact: matrices rounded through f16,
    so an f16 file holds them exactly."""
    from transformers import Mistral3Config, PixtralVisionConfig
    from transformers.models.mistral3.modeling_mistral3 import Mistral3MultiModalProjector
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionModel

    vcfg = PixtralVisionConfig(hidden_size=shape["hidden"], intermediate_size=shape["ffn"],
                               num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                               head_dim=shape["hidden"] // shape["heads"], patch_size=PATCH,
                               image_size=image_size, hidden_act=activation)
    cfg = Mistral3Config(vision_config=vcfg, text_config={"model_type": "mistral", "hidden_size": shape["text_hidden"],
                                                           "rms_norm_eps": 1e-5}, spatial_merge_size=MERGE)
    cfg._attn_implementation = vcfg._attn_implementation = attention
    torch.manual_seed(seed)
    with torch.device(device):
        tower, projector = PixtralVisionModel(vcfg).eval(), Mistral3MultiModalProjector(cfg).eval()
    with torch.no_grad():
        for module in (tower, projector):
            for name, param in module.named_parameters():
                if param.dim() >= 2 and f16_exact:
                    param.copy_(param.half().float())
                elif param.dim() == 1 and ("norm" in name or "ln_pre" in name):
                    param.uniform_(0.5, 1.5)  # non-trivial norm weights
    return tower, projector


def write_mmproj(path, tower, projector, shape: dict, image_size: int, activation: str = "silu",
                 matrix_dtype=np.float16) -> None:
    """llama.cpp's converter layout: names, keys, Q/K rows permuted; matrices in matrix_dtype,
    norms float32."""
    import gguf

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "pixtral")
    for key, value in (("image_size", image_size), ("patch_size", PATCH), ("embedding_length", shape["hidden"]),
                       ("feed_forward_length", shape["ffn"]), ("block_count", shape["layers"]),
                       ("attention.head_count", shape["heads"]), ("projection_dim", shape["text_hidden"]),
                       ("spatial_merge_size", MERGE)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", list(MEAN))
    w.add_array("clip.vision.image_std", list(STD))
    w.add_bool("clip.use_silu" if activation == "silu" else "clip.use_gelu", True)
    heads = shape["heads"]

    def add(name, t, permute=False):
        arr = t.detach().float().cpu().numpy()
        if permute:  # llama.cpp's converter reorders Q/K rows for its RoPE
            arr = arr.reshape(heads, 2, arr.shape[0] // heads // 2, arr.shape[1]).swapaxes(1, 2).reshape(arr.shape)
        w.add_tensor(name, arr.astype(np.float32 if arr.ndim == 1 else matrix_dtype))

    add("v.patch_embd.weight", tower.patch_conv.weight)
    add("v.pre_ln.weight", tower.ln_pre.weight)
    for i, layer in enumerate(tower.transformer.layers):
        a, f = layer.attention, layer.feed_forward
        add(f"v.blk.{i}.ln1.weight", layer.attention_norm.weight)
        add(f"v.blk.{i}.attn_q.weight", a.q_proj.weight, permute=True)
        add(f"v.blk.{i}.attn_k.weight", a.k_proj.weight, permute=True)
        add(f"v.blk.{i}.attn_v.weight", a.v_proj.weight)
        add(f"v.blk.{i}.attn_out.weight", a.o_proj.weight)
        add(f"v.blk.{i}.ln2.weight", layer.ffn_norm.weight)
        add(f"v.blk.{i}.ffn_gate.weight", f.gate_proj.weight)
        add(f"v.blk.{i}.ffn_up.weight", f.up_proj.weight)
        add(f"v.blk.{i}.ffn_down.weight", f.down_proj.weight)
    add("mm.input_norm.weight", projector.norm.weight)
    add("mm.patch_merger.weight", projector.patch_merger.merging_layer.weight)
    add("mm.1.weight", projector.linear_1.weight)
    add("mm.2.weight", projector.linear_2.weight)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def photo(w: int, h: int, seed: int) -> bytes:
    """A photo-like PNG: random colour blocks, smoothly enlarged."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 6, 2), max(w // 6, 2), 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((w, h), Image.BILINEAR).save(buf, "PNG")
    return buf.getvalue()


def hf_encode(hf, pixels: torch.Tensor) -> torch.Tensor:
    """HF's tower + projector on one preprocessed image (3, H, W): its projected tokens."""
    tower, projector = hf
    sizes = torch.tensor([list(pixels.shape[1:])])
    with torch.no_grad():
        return projector(tower(pixels[None], image_sizes=sizes).last_hidden_state.squeeze(0), sizes)


def relative_errors(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per token: |ours - ref| / |ref| (L2 over the features)."""
    return (ours.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)
