"""Pixtral vision encoder + Mistral 3 projector, loaded from an mmproj GGUF.

What it computes (HF `PixtralVisionModel` + `Mistral3MultiModalProjector`):

  pixels (3, H, W) → patch conv (p×p, stride p) → RMSNorm(pre_ln)
  → blocks: x += o(attn(RoPE2D(q), RoPE2D(k), v)) of RMSNorm(x);  x += down(act(gate)·up) of RMSNorm(x)
  → RMSNorm(mm.input_norm) → 2×2 merge, channel-major (feature ch·4 + ky·2 + kx, like
    F.unfold) → merging_layer (4h→h) → linear_1 → GELU(erf) → linear_2
  → (rows·cols, text_hidden) in patch-major merged order.

Two tensor layouts are accepted (same keys `clip.*`):
  * llama.cpp (`v.patch_embd`, `v.pre_ln`, `ln1/ln2`, `attn_out`, `mm.input_norm`,
    `mm.patch_merger`, `mm.1/mm.2`): its converter permuted the rows of attn_q/attn_k into
    interleaved RoPE pairs; we un-permute them at load so one rotate-half RoPE serves both.
  * Ollama (`v.patch_conv`, `v.encoder_norm`, `attn_norm/ffn_norm`, `attn_output`, `mm.norm`,
    `mm.patch_merger.merging_layer`, `mm.linear_1/mm.linear_2`): HF's row order.

Weights stay in the file's dtype on the device (QWeight / `linear`); the residual stream and
norms run in float32, matmuls in the compute dtype (float32 on CPU, the weights' half type on
CUDA). Images never attend to each other: their tokens share the matmuls, attention runs per
image.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...kernels.linear import QWeight, linear
from ..api import EngineError, ImagePart
from ..gguf import GGUFError, GGUFFile, open_gguf
from .config import LAYOUTS, VisionConfig, _fail, read_config
from .image import image_grid, image_size_of, preprocess

def tower_dtype(device) -> torch.dtype:
    """The tower's matmul dtype on a device: float32 on the CPU; bf16 on GPUs that have it
    (Ampere and newer); float32 on older GPUs, never fp16: Pixtral's MLP activations and
    outputs pass 65504 on real images (fp16's largest), which would make them inf."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
        return torch.bfloat16
    return torch.float32


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation (interleaved pairs → rotate-half).

    The converter wrote w.reshape(heads, 2, hd/2, in).swapaxes(1, 2): file row (h, i, j) holds
    HF row (h, j, i). So HF row (h, j, i) = file row h·hd + 2i + j.
    """
    hd = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, hd // 2, 2).transpose(0, 2, 1).reshape(-1)


@dataclass
class _Block:
    attn_norm: torch.Tensor
    q: QWeight
    k: QWeight
    v: QWeight
    o: QWeight
    ffn_norm: torch.Tensor
    gate: QWeight
    up: QWeight
    down: QWeight


class VisionTower:
    """Pixtral encoder + projector. `encode(pixels)` / `encode_images(...)` / `encode_image(part)`."""

    def __init__(self, cfg: VisionConfig, path: Path, patch: QWeight, patch_bias, pre_norm, blocks,
                 mm_norm, merger, mm1, mm2, device, dtype, cache_bytes: int):
        self.cfg = cfg
        self.path = path
        self.patch, self.patch_bias, self.pre_norm = patch, patch_bias, pre_norm
        self.blocks: list[_Block] = blocks
        self.mm_norm, self.merger, self.mm1, self.mm2 = mm_norm, merger, mm1, mm2
        self.device = torch.device(device)
        self.dtype = dtype
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, gf_or_path, device="cpu", dtype: torch.dtype | None = None,
             cache_bytes: int = 512 << 20) -> "VisionTower":
        """Load from an mmproj GGUF (path or open GGUFFile). `dtype` is the matmul dtype:
        default `tower_dtype(device)` (float32 on CPU and on GPUs without bf16, else bf16)."""
        if isinstance(gf_or_path, GGUFFile):
            return cls._load(gf_or_path, device, dtype, cache_bytes)
        try:
            gf = open_gguf(gf_or_path)
        except GGUFError as exc:
            raise EngineError(str(exc)) from exc
        try:
            return cls._load(gf, device, dtype, cache_bytes)  # CPU weights keep mapping the file
        except BaseException:
            gf.close()
            raise

    @classmethod
    def _load(cls, gf: GGUFFile, device, dtype, cache_bytes) -> "VisionTower":
        cfg = read_config(gf)
        names = LAYOUTS[cfg.layout]
        device = torch.device(device)

        def shape_of(name: str) -> tuple[int, ...]:
            return tuple(gf.tensors[name].shape)

        def expect(name: str, shape: tuple[int, ...]) -> None:
            if shape_of(name) != shape:
                raise _fail(gf.path, f"tensor {name} has shape {shape_of(name)}, expected {shape} "
                                     f"from the clip.vision.* keys")

        def qweight(name: str, shape: tuple[int, int], rows: np.ndarray | None = None) -> QWeight:
            info = gf.tensors[name]
            raw = gf.raw(name)
            if rows is not None:  # reorder whole rows of bytes (works for any row-wise type)
                raw = np.ascontiguousarray(raw.reshape(shape[0], -1)[rows]).reshape(-1)
            try:
                return QWeight.from_raw(raw, info.ggml_type, shape, device, name=name)
            except ValueError as exc:  # QuantFormatError
                raise _fail(gf.path, str(exc)) from exc

        def vector(name: str, size: int) -> torch.Tensor:
            expect(name, (size,))
            try:
                return torch.from_numpy(np.array(gf.array(name), dtype=np.float32)).to(device)
            except GGUFError as exc:
                raise EngineError(str(exc)) from exc

        def matrix(role: str, out_f: int, in_f: int, i: int | None = None, rows=None) -> QWeight:
            name = (names[role].format(i=i) if i is not None else names[role]) + ".weight"
            expect(name, (out_f, in_f))
            return qweight(name, (out_f, in_f), rows)

        h, p = cfg.hidden, cfg.patch_size
        patch_name = names["patch"] + ".weight"
        expect(patch_name, (h, 3, p, p))
        patch = qweight(patch_name, (h, 3 * p * p))  # conv as unfold + linear
        patch_bias = None
        if names["patch"] + ".bias" in gf.tensors:
            patch_bias = vector(names["patch"] + ".bias", h)
        pre_norm = vector(names["pre_norm"] + ".weight", h)
        qk_rows = unpermute_rows(h, cfg.n_heads) if cfg.layout == "llama.cpp" else None
        blocks = []
        for i in range(cfg.n_layers):
            blocks.append(_Block(
                attn_norm=vector(names["attn_norm"].format(i=i) + ".weight", h),
                q=matrix("q", h, h, i, qk_rows),
                k=matrix("k", h, h, i, qk_rows),
                v=matrix("v", h, h, i),
                o=matrix("o", h, h, i),
                ffn_norm=vector(names["ffn_norm"].format(i=i) + ".weight", h),
                gate=matrix("gate", cfg.ffn, h, i),
                up=matrix("up", cfg.ffn, h, i),
                down=matrix("down", h, cfg.ffn, i),
            ))
        mm_norm = vector(names["mm_norm"] + ".weight", h)
        merger = matrix("merger", h, h * cfg.merge ** 2)
        text_hidden = cfg.text_hidden
        mm1 = matrix("mm1", text_hidden, h)
        mm2 = matrix("mm2", text_hidden, text_hidden)

        if dtype is None:
            dtype = tower_dtype(device)
        return cls(cfg, gf.path, patch, patch_bias, pre_norm, blocks, mm_norm, merger, mm1, mm2,
                   device, dtype, cache_bytes)

    # -- properties the prompt builder needs -------------------------------------------------
    @property
    def image_size(self) -> int:
        return self.cfg.image_size

    @property
    def patch_size(self) -> int:
        return self.cfg.patch_size

    @property
    def merge(self) -> int:
        return self.cfg.merge

    @property
    def mean(self) -> tuple[float, float, float]:
        return self.cfg.mean

    @property
    def std(self) -> tuple[float, float, float]:
        return self.cfg.std

    @property
    def text_hidden(self) -> int:
        return self.cfg.text_hidden

    def grid(self, image: bytes | ImagePart, source: str | None = None) -> tuple[int, int]:
        """(rows, cols) of image tokens for an image file, from its header (cheap)."""
        data, name = (image.data, image.name) if isinstance(image, ImagePart) else (image, source or "image")
        return image_grid(image_size_of(data, name), self.image_size, self.patch_size, self.merge)

    def preprocess(self, image: bytes | ImagePart, source: str | None = None):
        data, name = (image.data, image.name) if isinstance(image, ImagePart) else (image, source or "image")
        return preprocess(data, image_size=self.image_size, patch_size=self.patch_size, merge=self.merge,
                          mean=self.mean, std=self.std, source=name)

    # -- forward ------------------------------------------------------------------------------
    def _linear(self, x: torch.Tensor, w: QWeight) -> torch.Tensor:
        x = x.to(self.dtype)
        if not w.is_quantized and w.data.dtype != self.dtype and not w.data.is_cpu:
            # f16 weights (mmproj-f16) under bf16 / float32 math: the weight is cast for the call,
            # not the activations to f16, whose range they can overflow
            return F.linear(x, w.data.to(self.dtype))
        return linear(x, w)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.eps) * weight

    def _rope(self, hp: int, wp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (hp·wp, head_dim) for a patch grid, patch-major (row by row)."""
        hd = self.cfg.head_dim
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=self.device) / hd))
        rows = torch.arange(hp, device=self.device, dtype=torch.float32)
        cols = torch.arange(wp, device=self.device, dtype=torch.float32)
        row_angles = torch.outer(rows, inv[0::2])[:, None, :].expand(hp, wp, hd // 4)
        col_angles = torch.outer(cols, inv[1::2])[None, :, :].expand(hp, wp, hd // 4)
        half = torch.cat([row_angles, col_angles], dim=-1).reshape(hp * wp, hd // 2)
        angles = torch.cat([half, half], dim=-1)
        return angles.cos(), angles.sin()

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) if self.cfg.activation == "silu" else F.gelu(x)

    def _attention(self, blk: _Block, x: torch.Tensor, spans, ropes) -> torch.Tensor:
        n_heads, hd = self.cfg.n_heads, self.cfg.head_dim
        q = self._linear(x, blk.q).view(-1, n_heads, hd).float()
        k = self._linear(x, blk.k).view(-1, n_heads, hd).float()
        v = self._linear(x, blk.v).view(-1, n_heads, hd)
        outs = []
        for (start, stop), (cos, sin) in zip(spans, ropes):
            # Each image attends only to itself (HF builds the same block-diagonal mask).
            qi = self._rotate(q[start:stop], cos[:, None], sin[:, None]).to(self.dtype).transpose(0, 1)
            ki = self._rotate(k[start:stop], cos[:, None], sin[:, None]).to(self.dtype).transpose(0, 1)
            vi = v[start:stop].to(self.dtype).transpose(0, 1)
            outs.append(F.scaled_dot_product_attention(qi[None], ki[None], vi[None])[0].transpose(0, 1))
        attn = torch.cat(outs, dim=0).reshape(-1, n_heads * hd)
        return self._linear(attn, blk.o)

    def _merge(self, x: torch.Tensor, hp: int, wp: int) -> torch.Tensor:
        """(hp·wp, h) → (hp/m · wp/m, h·m²), feature index ch·m² + ky·m + kx (F.unfold order)."""
        m, h = self.merge, x.shape[-1]
        grid = x.view(hp // m, m, wp // m, m, h)  # (R, ky, C, kx, ch)
        return grid.permute(0, 2, 4, 1, 3).reshape((hp // m) * (wp // m), h * m * m)

    @torch.no_grad()
    def encode_images(self, pixel_list: list[torch.Tensor]) -> list[torch.Tensor]:
        """Several preprocessed images (3, H, W) → per image (rows·cols, text_hidden) in
        `self.dtype` on `self.device`, rows in patch-major merged order. One call, no
        attention across images."""
        if not pixel_list:
            return []
        p, m = self.patch_size, self.merge
        patches, spans, ropes, grids = [], [], [], []
        start = 0
        for pixels in pixel_list:
            if pixels.dim() != 3 or pixels.shape[0] != 3 or pixels.shape[1] % (p * m) or pixels.shape[2] % (p * m):
                raise EngineError(f"{self.path}: pixels must be (3, H, W) with H and W multiples of "
                                  f"{p * m}, got {tuple(pixels.shape)}")
            hp, wp = pixels.shape[1] // p, pixels.shape[2] // p
            # Patch conv as unfold + linear: unfold's (ch, ky, kx) order is the conv weight's.
            cols = F.unfold(pixels.to(self.device, torch.float32)[None], kernel_size=p, stride=p)[0].t()
            patches.append(cols)
            spans.append((start, start + hp * wp))
            ropes.append(self._rope(hp, wp))
            grids.append((hp, wp))
            start += hp * wp
        x = self._linear(torch.cat(patches, dim=0), self.patch).float()
        if self.patch_bias is not None:
            x = x + self.patch_bias
        x = self._rms(x, self.pre_norm)
        for blk in self.blocks:
            x = x + self._attention(blk, self._rms(x, blk.attn_norm), spans, ropes).float()
            hn = self._rms(x, blk.ffn_norm)
            x = x + self._linear(self._act(self._linear(hn, blk.gate)) * self._linear(hn, blk.up), blk.down).float()
        x = self._rms(x, self.mm_norm)
        merged = torch.cat([self._merge(x[a:b], hp, wp) for (a, b), (hp, wp) in zip(spans, grids)], dim=0)
        y = self._linear(merged, self.merger)
        y = self._linear(F.gelu(self._linear(y, self.mm1)), self.mm2)
        sizes = [(hp // m) * (wp // m) for hp, wp in grids]
        return list(torch.split(y, sizes, dim=0))

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """One preprocessed image (3, H, W) → (rows·cols, text_hidden)."""
        return self.encode_images([pixels])[0]

    # -- images with a content-hash cache ------------------------------------------------------
    def encode_image(self, image: ImagePart) -> torch.Tensor:
        """Embeddings of an image file, cached by the sha256 of its bytes (a follow-up turn with
        the same picture never re-encodes it). The returned tensor is shared with the cache:
        treat it as read-only."""
        return self.encode_image_parts([image])[0]

    def encode_image_parts(self, images: list[ImagePart]) -> list[torch.Tensor]:
        keys = [hashlib.sha256(im.data).hexdigest() for im in images]
        todo = {}
        for key, im in zip(keys, images):
            if key in self._cache:
                self._cache.move_to_end(key)
                self.cache_hits += 1
            elif key not in todo:
                todo[key] = im
        if todo:
            self.cache_misses += len(todo)
            pixels = [self.preprocess(im)[0] for im in todo.values()]
            for key, emb in zip(todo, self.encode_images(pixels)):
                self._remember(key, emb)
        out = []
        for key in keys:
            if key in self._cache:
                out.append(self._cache[key])
            else:  # larger than the whole cache budget: encode without keeping it
                out.append(self.encode_images([self.preprocess(images[keys.index(key)])[0]])[0])
        return out

    def _remember(self, key: str, emb: torch.Tensor) -> None:
        size = emb.numel() * emb.element_size()
        if size > self.cache_bytes:
            return
        self._cache[key] = emb
        while sum(t.numel() * t.element_size() for t in self._cache.values()) > self.cache_bytes:
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        self._cache.clear()

    def __repr__(self) -> str:
        c = self.cfg
        return (f"VisionTower({self.path.name}, {c.layout} layout, {c.n_layers}x{c.hidden} "
                f"heads {c.n_heads}, {c.activation}, image {c.image_size}/patch {c.patch_size}/merge "
                f"{c.merge} → {c.text_hidden}, {self.device}, {self.dtype})")
