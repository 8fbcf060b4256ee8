"""The decoder's weights from a GGUF file, uploaded tensor by tensor to each layer's device: the
token table kept as stored (`TokenEmbedding`), each layer's norms and matmul weights (`LayerWeights`:
QKV and gate+up fused where one type allows), float32 copies on a CPU without the native kernels
when they fit in half the free RAM, the output head (the table itself when tied)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ...kernels import ggml_types
from ...kernels import linear as _linear_mod
from ...kernels.linear import QWeight, prepare
from ..gguf import GGUFError, GGUFFile
from ..host import available_ram
from .config import TextConfig


class TokenEmbedding:
    """token_embd kept as the file stores it (a QWeight); looked-up rows are dequantized.

    Quantized tables stay quantized on the device (131072×5120 is 1.3 GB in bf16, 0.4 GB in
    Q4_K), and a tied head multiplies with the very same bytes."""

    def __init__(self, weight: QWeight, dtype: torch.dtype):
        self.weight = weight
        self.dtype = dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.is_quantized and w.data.is_cpu and _linear_mod.cpu_native.supports(w.ggml_type):
            # straight from the mapped rows (no gathered copy, no pool hand-off for one token)
            return _linear_mod.cpu_native.dequantize_rows(w.ggml_type, w.data, ids, w.shape[1]).to(self.dtype)
        # On the table's device: ids there already (decode keeps its token in a device tensor),
        # rows gathered and dequantized there (Triton on CUDA): no host tensor, no sync per token.
        rows = w.data.index_select(0, ids.to(w.data.device))
        if not w.is_quantized:
            return rows.to(self.dtype)
        return QWeight(w.ggml_type, (ids.numel(), w.shape[1]), rows).dequantize(self.dtype)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    wo: QWeight
    w_down: QWeight
    wqkv: QWeight | None = None  # fused when the three types match
    wq: QWeight | None = None
    wk: QWeight | None = None
    wv: QWeight | None = None
    w_gate_up: QWeight | None = None  # fused when the two types match
    w_gate: QWeight | None = None
    w_up: QWeight | None = None


_DTYPE_TYPES = {torch.bfloat16: ggml_types.BF16, torch.float16: ggml_types.F16}


def want_dense(gf: GGUFFile, cfg: TextConfig, device: torch.device, requested: bool | None) -> bool:
    """CPU linear weights as float32 copies: as `requested`, else only without the native kernels
    (the torch path dequantizes every weight on every call) and when they fit half the free RAM."""
    if device.type != "cpu":
        return False
    if requested is not None:
        return requested
    if native_cpu():
        return False  # the native kernels run on the file's blocks: no float32 copy
    dense_bytes = sum(4 * math.prod(t.shape) for n, t in gf.tensors.items()
                      if n.startswith("blk.") and len(t.shape) == 2)
    dense_bytes += 4 * cfg.vocab_size * cfg.hidden  # the head
    return dense_bytes <= available_ram() // 2


def native_cpu() -> bool:
    """CPU linears run on the native kernels (not built, or TRAMONTANE_CPU_EXACT: torch)."""
    return _linear_mod.cpu_native.AVAILABLE and not _linear_mod.is_cpu_exact()


def _fusable(gf: GGUFFile, names: Sequence[str], device: torch.device | None = None) -> bool:
    """One type: the weights can be concatenated into one matmul. Not on the CPU with the
    native kernels: a concatenation is an anonymous copy of file bytes the mapping already
    holds (separate calls on the mapped weights cost a few microseconds each)."""
    if device is not None and device.type == "cpu" and native_cpu():
        return False
    return len({gf.tensors[n].ggml_type for n in names}) == 1


def upload(model, gf: GGUFFile, name: str, dense: bool = True, device: torch.device | None = None,
           dtype: torch.dtype | None = None) -> QWeight:
    """Tensor `name` of the file on `device` (the head's by default), counted in model.weight_bytes;
    dense: a float32 copy where model.dense_weights says so, the CPU kernels' plan made now."""
    device, dtype = device or model.device, dtype or model.dtype
    info = gf.tensors[name]
    model.weight_bytes += info.nbytes
    w = QWeight.from_raw(gf.raw(name), info.ggml_type, tuple(info.shape), device, from_mapping=True)
    if dense and model.dense_weights and device.type == "cpu" and w.ggml_type != ggml_types.F32:
        w = QWeight(ggml_types.F32, w.shape, w.dequantize(torch.float32))
    elif device.type != "cpu" and w.ggml_type == ggml_types.F32 and dtype in _DTYPE_TYPES:
        # An f32 file on a GPU: hold the weights in the compute dtype (as HF loading in bf16
        # does), so matmuls run natively instead of upcasting activations every call.
        w = QWeight(_DTYPE_TYPES[dtype], w.shape, w.data.to(dtype))
    if dense and w.data.device.type == "cpu":
        prepare(w)  # the CPU kernels' plan (a repack where one applies) while loading, not in the first reply
    return w


def upload_fused(model, gf: GGUFFile, names: Sequence[str], device=None, dtype=None) -> QWeight:
    parts = [upload(model, gf, n, device=device, dtype=dtype) for n in names]
    fused = QWeight.cat(parts)
    del parts  # the separate copies go; only the fused one stays on the device
    return fused


def norm_weight(model, gf: GGUFFile, name: str, device: torch.device | None = None) -> torch.Tensor:
    model.weight_bytes += gf.tensors[name].nbytes
    return torch.from_numpy(np.array(gf.array(name), dtype=np.float32)).to(device or model.device)


def load_weights(model, gf: GGUFFile, progress=None) -> None:
    """The decoder's tensors onto the model's segments; progress(fraction, what) after each layer."""
    cfg = model.cfg
    try:
        # Looked-up rows are dequantized on the fly: the table stays as stored.
        # Rows come out in the first layers' dtype (no cast at the first boundary).
        first = model.segments[0]
        model.embedding = TokenEmbedding(
            upload(model, gf, "token_embd.weight", dense=False, device=model.embedding_device), first.dtype)
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            seg = model.segment_of(i)
            on = dict(device=seg.device, dtype=seg.dtype)
            qkv = [b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"]
            gate_up = [b + "ffn_gate.weight", b + "ffn_up.weight"]
            layer = LayerWeights(
                attn_norm=norm_weight(model, gf, b + "attn_norm.weight", seg.device),
                ffn_norm=norm_weight(model, gf, b + "ffn_norm.weight", seg.device),
                wo=upload(model, gf, b + "attn_output.weight", **on),
                w_down=upload(model, gf, b + "ffn_down.weight", **on),
            )
            if _fusable(gf, qkv, seg.device):
                layer.wqkv = upload_fused(model, gf, qkv, **on)
            else:  # e.g. Q4_K_M: attn_v is Q6_K while q/k are Q4_K
                layer.wq, layer.wk, layer.wv = (upload(model, gf, n, **on) for n in qkv)
            if _fusable(gf, gate_up, seg.device):
                layer.w_gate_up = upload_fused(model, gf, gate_up, **on)
            else:
                layer.w_gate, layer.w_up = (upload(model, gf, n, **on) for n in gate_up)
            model.layers.append(layer)
            if progress is not None:
                progress((i + 1) / cfg.n_layers, f"loading layer {i + 1}/{cfg.n_layers}")
        model.output_norm = norm_weight(model, gf, "output_norm.weight")
        # No output.weight: the head is the embedding table (tied), same device bytes.
        if not cfg.tied_embeddings:
            model.head = upload(model, gf, "output.weight")
        elif (model.embedding_device != model.device or model.dense_weights and model.device.type == "cpu"
              and model.embedding.weight.ggml_type != ggml_types.F32):
            # Tied, but the table is looked up elsewhere (or kept quantized): a head copy here.
            model.head = upload(model, gf, "token_embd.weight")
            model.weight_bytes -= gf.tensors["token_embd.weight"].nbytes  # counted once
        else:
            model.head = model.embedding.weight
    except ggml_types.QuantFormatError as exc:
        raise GGUFError(f"{gf.path}: {exc}") from None
