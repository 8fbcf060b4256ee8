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

The block loop is written once (`VisionTower._forward`); how its steps run is what it is given,
chosen per call (`VisionTower._steps`):
  * `_TorchSteps`: `linear` in the tower's dtype and torch's norms. GPUs, float32 files, CPUs
    without bf16 dot products, and exact mode (TRAMONTANE_CPU_EXACT=1, kernels.linear.cpu_exact).
  * `_Bf16Steps`: a CPU with bf16 dot products (AVX512_BF16 or AMX) and a 16-bit float (the usual
    mmproj) or quantized file. The matmuls' weights are converted once at load to bf16 (q/k/v and
    gate/up stacked) for torch's oneDNN bf16 matmuls: 2.3x the native F16 kernels' rate per core
    on AVX512_BF16; for Q8_0 (AMD EPYC) ~185 GFLOP/s a core against ~135-170 on the int8 kernels,
    whose tile transposes each weight block on every call (1.18x the CPU time per image), at 2
    bytes a weight in memory instead of ~1.06. Attention, residual and norms stay float32.
  * `_NativeSteps`: a quantized file elsewhere (cpu_bf16=False, or no bf16 dot products: Intel
    client CPUs, AVX-VNNI) on the native int8 kernels as it is: per block one call for the norm
    and q/k/v, one for the norm and gate/up (SwiGLU inside for SiLU), the o and down projections
    added to the residual in their call. Nothing is converted per call.
Both CPU paths split the work over the native pool's thread count (rows; heads for attention),
each thread running torch on one core: no OpenMP team whose spinning waits, on a loaded machine,
cost more than they save.
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
from ...kernels.linear import FLOAT_DTYPES, QWeight, is_cpu_exact, linear, native_plans
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
    """Whether the tower runs its quantized path (`_NativeSteps`): every block matrix and the
    projector quantized, on the CPU, with native kernels for their types."""
    every = [merger, mm1, mm2] + [getattr(b, m) for b in blocks for m in BLOCK_MATRICES]
    return cpu_native.AVAILABLE and all(
        w.is_quantized and w.data.is_cpu and cpu_native.supports(w.ggml_type) for w in every)


class _TorchSteps:
    """The block loop's steps by `linear` and torch's norms, on one thread (the module's
    docstring): the reference the other two are tested against."""
    attn_dtype = attn_out = None  # attention's compute and stored dtypes (None: the tower's)

    def __init__(self, tower: "VisionTower", threads: int):
        self.t, self.threads = tower, threads

    def _rows(self, n: int, width: int, dtype: torch.dtype, fn) -> torch.Tensor:
        """An (n, width) tensor whose rows [a, b) are fn(a, b), the ranges over the threads."""
        out = torch.empty(n, width, dtype=dtype)

        def run(r):
            out[r[0]:r[1]] = fn(*r)

        split_run(run, split_ranges(n, self.threads))
        return out

    def patches(self, patches):  # the patch conv before its bias, float32
        return self.t._linear(patches, self.t.patch).float()

    def norm(self, x, weight):
        return self.t._rms(x, weight)

    def norm_qkv(self, i: int, x) -> list[torch.Tensor]:
        blk = self.t.blocks[i]
        hn = self.t._rms(x, blk.attn_norm)
        return [self.t._linear(hn, w) for w in (blk.q, blk.k, blk.v)]

    def matmul_add(self, a, i: int, role: str, x):  # x + a @ W.T, W block i's "o" or "down"
        return x + self.t._linear(a, getattr(self.t.blocks[i], role)).float()

    def norm_ffn(self, i: int, x):  # act(gate) · up of block i's FFN norm of x
        blk = self.t.blocks[i]
        hn = self.t._rms(x, blk.ffn_norm)
        return self.t._act(self.t._linear(hn, blk.gate)) * self.t._linear(hn, blk.up)

    def project(self, merged):  # merger, linear_1, GELU, linear_2: the text model's tokens
        t = self.t
        return t._linear(F.gelu(t._linear(t._linear(merged, t.merger), t.mm1)), t.mm2)


class _NativeSteps(_TorchSteps):
    """A quantized file's matrices on the native kernels (which split rows over the pool), float32
    attention; the patch conv and the projector as `_TorchSteps` (their `linear` is native)."""
    attn_dtype = attn_out = torch.float32

    def norm(self, x, weight):
        return cpu_native.rms_norm(x, weight, self.t.cfg.eps)

    def norm_qkv(self, i: int, x) -> list[torch.Tensor]:
        blk = self.t.blocks[i]
        return cpu_native.norm_matmuls(x, blk.attn_norm, self.t.cfg.eps, native_plans((blk.q, blk.k, blk.v), x))

    def matmul_add(self, a, i: int, role: str, x):
        return cpu_native.matmul_add(a, native_plans((getattr(self.t.blocks[i], role),), a)[0], x)

    def norm_ffn(self, i: int, x):
        blk, eps = self.t.blocks[i], self.t.cfg.eps
        plans = native_plans((blk.gate, blk.up), x)
        if self.t.cfg.activation == "silu":
            return cpu_native.norm_swiglu(x, blk.ffn_norm, eps, *plans)
        gate, up = cpu_native.norm_matmuls(x, blk.ffn_norm, eps, plans)
        return self._rows(len(x), up.shape[1], torch.float32, lambda a, b: up[a:b] * F.gelu(gate[a:b]))


class _Bf16Steps(_TorchSteps):
    """The CPU's bf16 weights (`_Bf16Weights`) on torch's matmuls, every step's rows split over the
    threads; attention in float32 (torch's CPU flash attention runs no faster in bf16)."""
    attn_dtype, attn_out = torch.float32, torch.bfloat16

    def _norm_linear(self, x, norm, w: torch.Tensor) -> torch.Tensor:  # bf16 (n, out) of norm(x) @ w.T
        return self._rows(x.shape[0], w.shape[0], torch.bfloat16,
                          lambda a, b: F.linear(self.t._rms(x[a:b], norm).to(torch.bfloat16), w))

    def patches(self, patches):
        w = self.t.bf16.patch
        return self._rows(len(patches), w.shape[0], torch.float32, lambda a, b: F.linear(patches[a:b].bfloat16(), w))

    def norm(self, x, weight):
        return self._rows(x.shape[0], x.shape[1], torch.float32, lambda a, b: self.t._rms(x[a:b], weight))

    def norm_qkv(self, i: int, x) -> list[torch.Tensor]:
        return self._norm_linear(x, self.t.blocks[i].attn_norm, self.t.bf16.blocks[i].qkv).chunk(3, dim=-1)

    def matmul_add(self, y, i: int, role: str, x):  # the float32 residual + the bf16 product
        w = getattr(self.t.bf16.blocks[i], role)
        return self._rows(len(x), x.shape[1], torch.float32, lambda a, b: x[a:b] + F.linear(y[a:b], w))

    def norm_ffn(self, i: int, x):
        gate, up = self._norm_linear(x, self.t.blocks[i].ffn_norm, self.t.bf16.blocks[i].gate_up).chunk(2, dim=-1)
        return self.t._act(gate) * up

    def project(self, merged):
        w = self.t.bf16
        return self._rows(len(merged), w.mm2.shape[0], torch.float32, lambda a, b: F.linear(
            F.gelu(F.linear(F.linear(merged[a:b].bfloat16(), w.merger), w.mm1)), w.mm2))


class VisionTower:
    """Pixtral encoder + projector. `encode(pixels)` / `encode_images(...)` / `encode_image(part)`."""

    def __init__(self, cfg: VisionConfig, path: Path, patch: QWeight, patch_bias, pre_norm, blocks,
                 mm_norm, merger, mm1, mm2, device, dtype, cache_bytes: int,
                 bf16: _Bf16Weights | None = None):
        self.cfg, self.path = cfg, path
        self.patch, self.patch_bias, self.pre_norm = patch, patch_bias, pre_norm
        self.blocks: list[_Block] = blocks
        self.mm_norm, self.merger, self.mm1, self.mm2 = mm_norm, merger, mm1, mm2
        self.device, self.dtype = torch.device(device), dtype
        self.bf16 = bf16  # the CPU's bf16 weights (None: the float32 / `linear` path only)
        self.native = bf16 is None and self.device.type == "cpu" and quantized_native(blocks, merger, mm1, mm2)
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.cache_hits = self.cache_misses = 0

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
        shapes = dict(q=(h, h), k=(h, h), v=(h, h), o=(h, h), gate=(cfg.ffn, h), up=(cfg.ffn, h), down=(h, cfg.ffn))
        blocks = [_Block(attn_norm=vector(names["attn_norm"].format(i=i) + ".weight", h),
                         ffn_norm=vector(names["ffn_norm"].format(i=i) + ".weight", h),
                         **{m: matrix(m, *shapes[m], i, qk_rows if m in ("q", "k") else None) for m in BLOCK_MATRICES})
                  for i in range(cfg.n_layers)]
        mm_norm = vector(names["mm_norm"] + ".weight", h)
        merger = matrix("merger", h, h * cfg.merge ** 2)
        text_hidden = cfg.text_hidden
        mm1 = matrix("mm1", text_hidden, h)
        mm2 = matrix("mm2", text_hidden, text_hidden)

        if cpu_bf16 is None:
            # not in exact mode, whose float32 path would never read them (the planner counts the same)
            cpu_bf16 = dtype is None and device.type == "cpu" and cpu_has_bf16_dot() and not is_cpu_exact()
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

    # -- what the prompt builder needs ------------------------------------------------------
    image_size = property(lambda self: self.cfg.image_size)
    patch_size = property(lambda self: self.cfg.patch_size)
    merge = property(lambda self: self.cfg.merge)
    mean = property(lambda self: self.cfg.mean)  # per channel (R, G, B)
    std = property(lambda self: self.cfg.std)
    text_hidden = property(lambda self: self.cfg.text_hidden)

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

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spans, ropes,
                   steps: _TorchSteps) -> torch.Tensor:
        """Every image's attention over its own rows, before W_o, in the steps' dtypes: heads split
        over the steps' threads, each writing its columns."""
        hd = self.cfg.head_dim
        out = torch.empty(q.shape[0], q.shape[1], dtype=steps.attn_out or self.dtype, device=q.device)

        def attend(c):
            a, b = c
            out[:, a:b] = self._attend(q[:, a:b], k[:, a:b], v[:, a:b], spans, ropes,
                                          steps.attn_dtype or self.dtype)

        split_run(attend, [(a * hd, b * hd) for a, b in split_ranges(self.cfg.n_heads, steps.threads)])
        return out

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
        y = self._forward(patches, spans, ropes, grids, self._steps())
        sizes = [(hp // m) * (wp // m) for hp, wp in grids]
        return list(torch.split(y, sizes, dim=0))

    def _steps(self) -> _TorchSteps:
        """How this call's steps run: the one choice between the paths (the module's docstring)."""
        if self.bf16 is not None and not is_cpu_exact():
            return _Bf16Steps(self, cpu_native.threads() if cpu_native.AVAILABLE else 1)
        if self.native and not is_cpu_exact():
            return _NativeSteps(self, cpu_native.threads())
        return _TorchSteps(self, 1)

    def _forward(self, patches: torch.Tensor, spans, ropes, grids, steps: _TorchSteps) -> torch.Tensor:
        """THE block loop (HF's PixtralTransformer + projector, llama.cpp's clip graph for
        Pixtral), the math in order: patch conv (+ bias), pre-norm; per block
        x += o(attention(q, k, v of norm(x))), x += down(act(gate) · up of norm(x)); then the
        projector's norm, 2×2 merge, merger, linear_1, GELU, linear_2. `steps` runs each one
        (`_steps`); the residual stream is float32."""
        x = steps.patches(patches)
        if self.patch_bias is not None:
            x = x + self.patch_bias
        x = steps.norm(x, self.pre_norm)
        for i in range(len(self.blocks)):
            q, k, v = steps.norm_qkv(i, x)
            x = steps.matmul_add(self._attention(q, k, v, spans, ropes, steps), i, "o", x)
            x = steps.matmul_add(steps.norm_ffn(i, x), i, "down", x)
        return steps.project(self._merged(steps.norm(x, self.mm_norm), spans, grids))

    def _merged(self, x: torch.Tensor, spans, grids) -> torch.Tensor:
        """Each image's (hp·wp, h) rows → (hp/m · wp/m, h·m²), feature ch·m² + ky·m + kx (F.unfold's
        order): the grid (R, ky, C, kx, ch) permuted to (R, C, ch, ky, kx)."""
        m, h = self.merge, x.shape[-1]
        return torch.cat([x[a:b].view(hp // m, m, wp // m, m, h).permute(0, 2, 4, 1, 3).reshape(-1, h * m * m)
                          for (a, b), (hp, wp) in zip(spans, grids)], dim=0)

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
        # this call's embeddings: one the new ones evict, or one larger than the cache, is returned all the same
        found, todo = {}, {}
        for key, im in zip(keys, images):
            if key in self._cache:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                found[key] = self._cache[key]
            elif key not in todo:
                todo[key] = im
        if todo:
            self.cache_misses += len(todo)
            for key, emb in zip(todo, self.encode_images([self.preprocess(im)[0] for im in todo.values()])):
                found[key] = emb
                self._remember(key, emb)
        return [found[key] for key in keys]

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
