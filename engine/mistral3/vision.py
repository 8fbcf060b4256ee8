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

CPU with bf16 dot products (AVX512_BF16 or AMX) and a 16-bit float file (F16/BF16, the usual
mmproj): the matmuls' weights are converted once at load to bf16 (q/k/v and gate/up stacked), and
the tower runs on torch's oneDNN bf16 matmuls (2.3x the native F16 kernels' rate per core on
AVX512_BF16); attention, residual and norms stay float32. The work is split over as many threads
as the native pool has (rows for the matmuls and norms, heads for attention), each running torch
on one core: no OpenMP team whose spinning waits, on a loaded machine, cost more than they save. The float32 path is kept
bit for bit where exactness is asked for (TRAMONTANE_CPU_EXACT=1, kernels.linear.cpu_exact) and
on CPUs without bf16.

A quantized file (Q8_0, the usual quantized mmproj; Q4_K...) on a CPU with bf16 dot products
takes the bf16 path too, its matrices dequantized once at load: there oneDNN's bf16 matmuls
outrun the native int8 kernels (AVX512_BF16 on an AMD EPYC: ~185 GFLOP/s a core against ~135-170
for Q8_0, whose tile transposes each weight block on every call; 1.18x the CPU time per image),
at the cost of 2 bytes a weight in memory instead of ~1.06. Elsewhere (cpu_bf16=False, or no bf16
dot products: Intel client CPUs, AVX-VNNI) its matmuls stay on the native kernels (int8 dot
products), in the bf16 path's shape: per block one call for the norm and q/k/v, one for the norm
and gate/up (SwiGLU inside for SiLU), the o and down projections added to the residual in their
call; attention split by heads over the pool's thread count like the bf16 path. Nothing is
converted per call.
"""
from __future__ import annotations

import hashlib
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...kernels import cpu_native
from ...kernels.ggml_types import BF16, F16
from ...kernels.linear import CPU, FLOAT_DTYPES, QWeight, linear, native_plans
from ..api import EngineError, ImagePart
from ..gguf import GGUFError, GGUFFile, open_gguf
# the planner asks the same questions (device_map.DeviceInfo.bf16_dot, DeviceInfo.capability)
from ..host import cpu_has_bf16_dot, cuda_has_bf16
from .config import BLOCK_MATRICES, LAYOUTS, VisionConfig, _fail, read_config
from .image import image_grid, image_size_of, preprocess

def tower_dtype(device) -> torch.dtype:
    """The tower's matmul dtype on a device: float32 on the CPU; bf16 on GPUs that have it
    (Ampere and newer); float32 on older GPUs, never fp16: Pixtral's MLP activations and
    outputs pass 65504 on real images (fp16's largest), which would make them inf."""
    device = torch.device(device)
    if device.type == "cuda" and cuda_has_bf16(torch.cuda.get_device_capability(device)):
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


@dataclass
class _Bf16Block:
    """A block's matmul weights as bf16 (out, in) tensors for the CPU's bf16 path."""
    qkv: torch.Tensor  # q, k, v rows stacked: one matmul
    o: torch.Tensor
    gate_up: torch.Tensor  # gate rows then up rows
    down: torch.Tensor


@dataclass
class _Bf16Weights:
    patch: torch.Tensor
    blocks: list[_Bf16Block]
    merger: torch.Tensor
    mm1: torch.Tensor
    mm2: torch.Tensor


_WORKERS: dict[int, ThreadPoolExecutor] = {}


def _one_torch_thread() -> None:
    torch.set_num_threads(torch.get_num_threads())  # this thread's OpenMP count: torch's (1 beside the pool)


def split_run(fn, items: list) -> None:
    """fn(item) for each item at once: the first on the calling thread, the others on worker
    threads (torch releases the GIL inside its ops). Errors are raised here."""
    if len(items) == 1:
        fn(items[0])
        return
    n = len(items) - 1
    if n not in _WORKERS:
        _WORKERS[n] = ThreadPoolExecutor(n, thread_name_prefix="vision", initializer=_one_torch_thread)
    futures = [_WORKERS[n].submit(fn, item) for item in items[1:]]
    try:
        fn(items[0])
    finally:
        for f in futures:
            f.result()


def split_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) in up to `parts` near-equal non-empty ranges."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:])]


def _bf16_stack(weights: list[QWeight]) -> torch.Tensor:
    """16-bit float or quantized weights → one bf16 (sum of out, in) tensor (rows stacked),
    converted once (a quantized one through float32 in chunks of rows: one scratch that
    the allocator reuses, not a whole float32 matrix per weight left behind in the heap)."""
    out = torch.empty(sum(w.shape[0] for w in weights), weights[0].shape[1], dtype=torch.bfloat16)
    row = 0
    for w in weights:
        if w.is_quantized:
            step = max(1, (1 << 22) // w.shape[1])  # 16 MiB of float32 at a time
            for a in range(0, w.shape[0], step):
                b = min(a + step, w.shape[0])
                out[row + a:row + b].copy_(w.rows(a, b).dequantize())
        else:
            out[row:row + w.shape[0]].copy_(w.data)
        row += w.shape[0]
        if w.mapped and cpu_native.AVAILABLE:  # the file's pages are not needed any more
            cpu_native.drop_pages(w.data)
    return out


def give_back(mapped: np.ndarray) -> None:
    """Give back the pages of the file mapping `mapped` views (GGUFFile.raw), once its bytes
    were copied: they would stay resident otherwise (the row-reordered q/k of llama.cpp's
    layout, ~51 MiB of Mistral Small's Q8_0 projector)."""
    if cpu_native.AVAILABLE:
        with warnings.catch_warnings():  # the mapping is read-only; nothing writes through this view
            warnings.simplefilter("ignore", UserWarning)
            cpu_native.drop_pages(torch.from_numpy(mapped))


_GGML_FLOAT = {dtype: ggml for ggml, dtype in FLOAT_DTYPES.items()}


def in_dtype(w: QWeight, dtype: torch.dtype) -> QWeight:
    """A float weight (F32/F16/BF16) converted once, at load, to the tower's matmul dtype, so no
    call casts it again; a quantized weight, or one already in `dtype`, as it is."""
    if w.is_quantized or w.data.dtype == dtype or dtype not in _GGML_FLOAT:
        return w
    return QWeight(_GGML_FLOAT[dtype], w.shape, w.data.to(dtype))


def bf16_weights(patch: QWeight, blocks: list[_Block], merger: QWeight, mm1: QWeight,
                 mm2: QWeight) -> _Bf16Weights | None:
    """The tower's matmul weights in bf16 when every one is a 16-bit float (F16/BF16) or
    quantized, on the CPU, else None (a float32 file keeps float32)."""
    every = [patch, merger, mm1, mm2] + [getattr(b, m) for b in blocks for m in BLOCK_MATRICES]
    if any((w.ggml_type not in (F16, BF16) and not w.is_quantized) or not w.data.is_cpu for w in every):
        return None
    return _Bf16Weights(
        patch=_bf16_stack([patch]),
        blocks=[_Bf16Block(_bf16_stack([b.q, b.k, b.v]), _bf16_stack([b.o]), _bf16_stack([b.gate, b.up]),
                           _bf16_stack([b.down])) for b in blocks],
        merger=_bf16_stack([merger]), mm1=_bf16_stack([mm1]), mm2=_bf16_stack([mm2]))


def quantized_native(blocks: list[_Block], merger: QWeight, mm1: QWeight, mm2: QWeight) -> bool:
    """Whether the tower runs its quantized path (`_forward_native`): every block matrix and the
    projector quantized, on the CPU, with native kernels for their types."""
    every = [merger, mm1, mm2] + [getattr(b, m) for b in blocks for m in BLOCK_MATRICES]
    return cpu_native.AVAILABLE and all(
        w.is_quantized and w.data.is_cpu and cpu_native.supports(w.ggml_type) for w in every)


class VisionTower:
    """Pixtral encoder + projector. `encode(pixels)` / `encode_images(...)` / `encode_image(part)`."""

    def __init__(self, cfg: VisionConfig, path: Path, patch: QWeight, patch_bias, pre_norm, blocks,
                 mm_norm, merger, mm1, mm2, device, dtype, cache_bytes: int,
                 bf16: _Bf16Weights | None = None):
        self.cfg = cfg
        self.path = path
        self.patch, self.patch_bias, self.pre_norm = patch, patch_bias, pre_norm
        self.blocks: list[_Block] = blocks
        self.mm_norm, self.merger, self.mm1, self.mm2 = mm_norm, merger, mm1, mm2
        self.device = torch.device(device)
        self.dtype = dtype
        self.bf16 = bf16  # the CPU's bf16 weights (None: the float32 / `linear` path only)
        self.native = bf16 is None and self.device.type == "cpu" and quantized_native(blocks, merger, mm1, mm2)
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, gf_or_path, device="cpu", dtype: torch.dtype | None = None,
             cache_bytes: int = 512 << 20, cpu_bf16: bool | None = None) -> "VisionTower":
        """Load from an mmproj GGUF (path or open GGUFFile). `dtype` is the matmul dtype:
        default `tower_dtype(device)` (float32 on CPU and on GPUs without bf16, else bf16).
        cpu_bf16: make the CPU's bf16 weights (see the module's docstring); None: where the CPU
        has bf16 dot products and no dtype is asked for; the float32 path stays for exact mode."""
        if isinstance(gf_or_path, GGUFFile):
            return cls._load(gf_or_path, device, dtype, cache_bytes, cpu_bf16)
        try:
            gf = open_gguf(gf_or_path)
        except GGUFError as exc:
            raise EngineError(str(exc)) from exc
        try:
            return cls._load(gf, device, dtype, cache_bytes, cpu_bf16)  # CPU weights keep mapping the file
        except BaseException:
            gf.close()
            raise

    @classmethod
    def _load(cls, gf: GGUFFile, device, dtype, cache_bytes, cpu_bf16=None) -> "VisionTower":
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
                source, raw = raw, np.ascontiguousarray(raw.reshape(shape[0], -1)[rows]).reshape(-1)
                give_back(source)  # the copy is what every path reads from now on
            try:
                return QWeight.from_raw(raw, info.ggml_type, shape, device, name=name, from_mapping=rows is None)
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

        if cpu_bf16 is None:
            # not in exact mode, whose float32 path would never read them (the planner counts the same)
            cpu_bf16 = dtype is None and device.type == "cpu" and cpu_has_bf16_dot() and not CPU.exact
        bf16 = bf16_weights(patch, blocks, merger, mm1, mm2) if cpu_bf16 and device.type == "cpu" else None
        if dtype is None:
            dtype = tower_dtype(device)
        if bf16 is None and not (device.type == "cpu" and dtype == torch.float32):
            # a GPU (or an asked-for half dtype): float weights in the tower's dtype from now on.
            # The CPU's float32 path reads 16-bit weights in place (native kernels) and keeps them.
            patch, merger, mm1, mm2 = (in_dtype(w, dtype) for w in (patch, merger, mm1, mm2))
            for b in blocks:
                for name in BLOCK_MATRICES:
                    setattr(b, name, in_dtype(getattr(b, name), dtype))
        return cls(cfg, gf.path, patch, patch_bias, pre_norm, blocks, mm_norm, merger, mm1, mm2,
                   device, dtype, cache_bytes, bf16)

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
        # off the CPU's float32 path, float weights are in self.dtype since load (in_dtype): the
        # activations are never cast to a file's f16, whose range they can overflow
        return linear(x.to(self.dtype), w)

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
        q, k, v = (self._linear(x, w) for w in (blk.q, blk.k, blk.v))
        return self._linear(self._attend(q, k, v, spans, ropes, self.dtype), blk.o)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spans, ropes,
                dtype: torch.dtype) -> torch.Tensor:
        """(n, heads·head_dim) q, k, v (all heads or some) → the same shape of attention output
        in `dtype`: RoPE on q and k in float32, then attention in `dtype`, each image over its
        own rows only."""
        hd = self.cfg.head_dim
        n_heads = q.shape[-1] // hd
        q = q.view(-1, n_heads, hd).float()
        k = k.view(-1, n_heads, hd).float()
        v = v.view(-1, n_heads, hd)
        outs = []
        for (start, stop), (cos, sin) in zip(spans, ropes):
            # Each image attends only to itself (HF builds the same block-diagonal mask).
            qi = self._rotate(q[start:stop], cos[:, None], sin[:, None]).to(dtype).transpose(0, 1)
            ki = self._rotate(k[start:stop], cos[:, None], sin[:, None]).to(dtype).transpose(0, 1)
            vi = v[start:stop].to(dtype).transpose(0, 1)
            outs.append(F.scaled_dot_product_attention(qi[None], ki[None], vi[None])[0].transpose(0, 1))
        return torch.cat(outs, dim=0).reshape(-1, n_heads * hd)

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
        patches = torch.cat(patches, dim=0)
        if self.bf16 is not None and not CPU.exact:
            y = self._forward_bf16(patches, spans, ropes, grids, cpu_native.threads() if cpu_native.AVAILABLE else 1)
        elif self.native and not CPU.exact:
            y = self._forward_native(patches, spans, ropes, grids, cpu_native.threads())
        else:
            y = self._forward(patches, spans, ropes, grids)
        sizes = [(hp // m) * (wp // m) for hp, wp in grids]
        return list(torch.split(y, sizes, dim=0))

    def _forward(self, patches: torch.Tensor, spans, ropes, grids) -> torch.Tensor:
        """Unfolded patches of all images → projected tokens, matmuls in self.dtype by `linear`."""
        x = self._linear(patches, self.patch).float()
        if self.patch_bias is not None:
            x = x + self.patch_bias
        x = self._rms(x, self.pre_norm)
        for blk in self.blocks:
            x = x + self._attention(blk, self._rms(x, blk.attn_norm), spans, ropes).float()
            hn = self._rms(x, blk.ffn_norm)
            x = x + self._linear(self._act(self._linear(hn, blk.gate)) * self._linear(hn, blk.up), blk.down).float()
        return self._project(self._merged(self._rms(x, self.mm_norm), spans, grids))

    def _project(self, merged: torch.Tensor) -> torch.Tensor:
        """Merged patches → the text model's tokens: merger, mm1, GELU, mm2 (by `linear`)."""
        return self._linear(F.gelu(self._linear(self._linear(merged, self.merger), self.mm1)), self.mm2)

    def _forward_bf16(self, patches: torch.Tensor, spans, ropes, grids, threads: int) -> torch.Tensor:
        """`_forward` on the CPU's bf16 weights: bf16 matmuls (q/k/v and gate/up one call each),
        float32 attention, residual and norms; float32 out (the encoder's contract). Rows (and
        heads for attention) are split over `threads` threads."""
        bf16, w, h, hd = torch.bfloat16, self.bf16, self.cfg.hidden, self.cfg.head_dim
        n = patches.shape[0]
        rows = split_ranges(n, threads)
        heads = [(a * hd, b * hd) for a, b in split_ranges(self.cfg.n_heads, threads)]
        x = torch.empty(n, h)  # the float32 residual stream
        qkv = torch.empty(n, 3 * h, dtype=bf16)
        attn = torch.empty(n, h, dtype=bf16)

        def embed(r):
            y = F.linear(patches[r[0]:r[1]].to(bf16), w.patch).float()
            x[r[0]:r[1]] = self._rms(y + self.patch_bias if self.patch_bias is not None else y, self.pre_norm)

        split_run(embed, rows)
        for blk, wb in zip(self.blocks, w.blocks):
            def project(r, blk=blk, wb=wb):
                qkv[r[0]:r[1]] = F.linear(self._rms(x[r[0]:r[1]], blk.attn_norm).to(bf16), wb.qkv)

            def attend(c):  # float32: torch's CPU flash attention runs no faster in bf16
                a, b = c
                attn[:, a:b] = self._attend(qkv[:, a:b], qkv[:, h + a:h + b], qkv[:, 2 * h + a:2 * h + b], spans,
                                            ropes, torch.float32)

            def mlp(r, blk=blk, wb=wb):
                xs = x[r[0]:r[1]]
                xs += F.linear(attn[r[0]:r[1]], wb.o)  # float32 residual += the bf16 product
                gate, up = F.linear(self._rms(xs, blk.ffn_norm).to(bf16), wb.gate_up).chunk(2, dim=-1)
                xs += F.linear(self._act(gate) * up, wb.down)

            split_run(project, rows)
            split_run(attend, heads)
            split_run(mlp, rows)
        merged = self._merged(self._rms(x, self.mm_norm), spans, grids)
        y = torch.empty(merged.shape[0], self.text_hidden)

        def project_out(r):
            z = F.linear(merged[r[0]:r[1]].to(bf16), w.merger)
            y[r[0]:r[1]] = F.linear(F.gelu(F.linear(z, w.mm1)), w.mm2)

        split_run(project_out, split_ranges(merged.shape[0], threads))
        return y

    def _forward_native(self, patches: torch.Tensor, spans, ropes, grids, threads: int) -> torch.Tensor:
        """`_forward` on a quantized file's weights as they are: the native kernels' matmuls (which
        split rows over the pool themselves) with the RMSNorm, SwiGLU and residual add inside
        their calls; float32 attention split by heads over `threads` one-core torch threads."""
        h, hd, eps = self.cfg.hidden, self.cfg.head_dim, self.cfg.eps
        heads = [(a * hd, b * hd) for a, b in split_ranges(self.cfg.n_heads, threads)]
        n = patches.shape[0]
        x = self._linear(patches, self.patch).float()
        if self.patch_bias is not None:
            x = x + self.patch_bias
        x = cpu_native.rms_norm(x, self.pre_norm, eps)
        attn = torch.empty(n, h)
        for blk in self.blocks:
            q, k, v = cpu_native.norm_matmuls(x, blk.attn_norm, eps, native_plans((blk.q, blk.k, blk.v), x))

            def attend(c, q=q, k=k, v=v):
                a, b = c
                attn[:, a:b] = self._attend(q[:, a:b], k[:, a:b], v[:, a:b], spans, ropes, torch.float32)

            split_run(attend, heads)
            x = cpu_native.matmul_add(attn, native_plans((blk.o,), attn)[0], x)
            gate_plan, up_plan = native_plans((blk.gate, blk.up), x)
            if self.cfg.activation == "silu":
                act = cpu_native.norm_swiglu(x, blk.ffn_norm, eps, gate_plan, up_plan)
            else:
                gate, act = cpu_native.norm_matmuls(x, blk.ffn_norm, eps, [gate_plan, up_plan])

                def gelu_mul(r, gate=gate, act=act):
                    act[r[0]:r[1]] *= F.gelu(gate[r[0]:r[1]])

                split_run(gelu_mul, split_ranges(n, threads))
            x = cpu_native.matmul_add(act, native_plans((blk.down,), act)[0], x)
        return self._project(self._merged(cpu_native.rms_norm(x, self.mm_norm, eps), spans, grids))

    def _merged(self, x: torch.Tensor, spans, grids) -> torch.Tensor:
        return torch.cat([self._merge(x[a:b], hp, wp) for (a, b), (hp, wp) in zip(spans, grids)], dim=0)

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
                f"{c.merge} → {c.text_hidden}, {self.device}, {self.dtype}"
                f"{', bf16 matmuls on the CPU' if self.bf16 is not None else ''}"
                f"{', quantized matmuls on the native kernels' if self.native else ''})")
