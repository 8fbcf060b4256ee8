"""`QWeight` (a 2-D weight kept in its GGUF form) and `linear(x, w)`, the one matmul the model calls.

Paths picked by `linear`:
  * CUDA + Triton, quantized, 1 activation row (float32 / float16 activations: up to
    DECODE_MAX_ROWS): fused decode kernel (qmatmul.py) - reads the raw blocks once, dequantizes in registers,
    never writes the weight.
  * CUDA + Triton, quantized, 2..FUSED_MAX_ROWS (192) bf16 rows (short turns, batched
    decode, short prompts): fused multi-row kernel - weight units dequantized in registers
    and multiplied on tensor cores (tl.dot), no weight scratch.
  * CUDA + Triton, quantized, more rows (long prefill chunks): Triton dequant of a chunk of
    weight rows to the activation dtype in a scratch buffer, then cuBLAS (torch.matmul); each
    weight is dequantized once per call (per prefill chunk), never per row tile.
  * CPU with the native kernels (kernels/cpu, built by pip install): quantized and F16/BF16
    weights are multiplied straight on their GGUF bytes (the memory-mapped file, no float copy;
    cpu_native.py, docs/design-cpu-kernels.md). F32 weights go to torch (BLAS).
  * CPU without them (or another device without Triton): torch reference dequant to float32,
    then matmul; warns once on CPU. A weight's dense copy is cached while the process-wide
    CPU_DENSE_CACHE_BYTES budget (1 GiB) lasts - small models run at full speed; beyond it
    weights are dequantized PREFILL_CHUNK_BYTES (32 MiB) of rows at a time on every call, so
    memory stays bounded for any file.
  * F32 / F16 / BF16 weights keep the file dtype on every device (F32 stays F32: exact, and
    such tensors are small in real files); the matmul runs in the weight dtype when it equals
    the activation dtype, else in float32.
Outputs come back in x.dtype.
"""
from __future__ import annotations

import functools
import threading
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..env import read_env
from . import cpu_native, quant_iq4, quant_k, quant_legacy
from .ggml_types import BF16, F16, F32, QuantFormatError, row_bytes, type_info, type_name
from .triton_compat import HAVE_TRITON

# Float weights have no blocks: their bytes are the values, in this dtype.
FLOAT_DTYPES = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}

REFERENCES = {**quant_legacy.REFERENCES, **quant_k.REFERENCES, **quant_iq4.REFERENCES}

DECODE_MAX_ROWS = 8  # float32 / float16 activation rows up to which the fused decode kernel is used
# CUDA, bf16 activations: rows up to which the fused multi-row kernel runs; above it the weight
# is dequantized to scratch (once per call) and multiplied by cuBLAS. By arithmetic, per weight
# element, on an H200-class GPU (132 SMs x 128 lanes x ~1.8 GHz = 30e12 thread instructions/s,
# ~600 TFLOP/s bf16 reachable from Triton's tl.dot, ~700 from cuBLAS, 4.8 TB/s):
#   fused: each weight unit is dequantized in registers once per 64-row tile (qmatmul.
#          _ROWS_TILES; 128 rows would spill), ~10 instructions (tile, bf16 convert, staging
#          for the MMA) = 0.33 ps a tile; the MMA, 2M flop = M x 0.0033 ps;
#   dense: the same dequant once per call plus writing and reading back 2+2 bytes (0.83 ps from
#          HBM, less while the 32 MiB chunk stays in L2): ~1.2 ps a call; cuBLAS M x 0.0029 ps.
#   M = 64: fused 0.33 + 0.21 = 0.54 vs dense 1.2 + 0.19 = 1.4; M = 128: 1.1 vs 1.6;
#   M = 192: 1.0 + 0.63 = 1.6 vs 1.8; M = 256: 1.3 + 0.85 = 2.2 vs 1.9; M = 2048 (the CUDA
#   prefill chunk): 10.6 + 6.8 = 17.4 vs 7.1.
# So: fused up to 192 rows (short turns, batched decode and short prompts run no dequant pass
# and never a weight-sized scratch); longer chunks pay one dequant pass per call - 1.2 ps
# against 5.9 ps of MMA at 2048 rows (~20 %) - instead of one for every call of 9+ rows before.
# Both sides are estimates (the 64 x 32 tiles also re-read activations from L2 once per 32
# weight rows); measured on a GPU by bench/rows_crossover.py; this constant is the only place.
FUSED_MAX_ROWS = 192
PREFILL_CHUNK_BYTES = 32 << 20  # dequantized scratch per chunk (CPU float32 / GPU compute dtype)
# CPU: float32 dense copies of weights are cached first come, first served, up to this total
# (released when the QWeight dies); weights past the budget are dequantized chunk by chunk on
# every call. 0 disables the cache. Bounded either way, fast for small models.
CPU_DENSE_CACHE_BYTES = 1 << 30


@functools.cache
def is_cpu_exact() -> bool:
    """Whether CPU matmuls keep the float32 torch path (TRAMONTANE_CPU_EXACT, read once from the
    settings, tramontane/env.py): the native kernels quantize activations to int8 per block (as
    llama.cpp does; relative error per product ~1e-3), the exact path does not (slow, dense
    caches). Nothing here changes it; a test that runs both paths sets the variable and calls
    is_cpu_exact.cache_clear() (tests/support/cpu_kernels.cpu_exact)."""
    return read_env().cpu_exact


class DenseCacheBudget:
    """The bytes of float32 weight copies (QWeight._dense) this process holds, against the one
    CPU_DENSE_CACHE_BYTES budget: a copy is admitted while the total stays within it and its bytes
    are given back when its weight dies. Weights of any thread share it, hence the lock."""

    def __init__(self) -> None:
        self.used = 0
        self._lock = threading.Lock()

    def admit(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > CPU_DENSE_CACHE_BYTES:
                return False
            self.used += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


DENSE_CACHE = DenseCacheBudget()


@functools.cache
def _warn_no_native() -> None:
    """The missing-kernels warning, once a process (the cache remembers that it was given)."""
    warnings.warn(
        "tramontane: the native CPU kernels are not built "
        f"({cpu_native.IMPORT_ERROR}); quantized matmuls on the CPU use the much slower torch "
        "reference path (reinstall with `pip install -e .` and a C compiler to build them)",
        RuntimeWarning, stacklevel=3)


def native_cpu(w: "QWeight") -> bool:
    """Whether `linear` runs this CPU weight on the native kernels (F32 weights go to torch)."""
    return (not is_cpu_exact() and w.data.device.type == "cpu" and w.ggml_type != F32
            and cpu_native.supports(w.ggml_type))


def _as_uint8_tensor(raw) -> torch.Tensor:
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raw = raw.view(np.uint8)
        with warnings.catch_warnings():  # memmaps are read-only; we never write through them
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(raw.reshape(-1))
    if isinstance(raw, torch.Tensor):
        if raw.dtype != torch.uint8:
            raw = raw.contiguous().view(torch.uint8)
        return raw.reshape(-1)
    raise TypeError(f"raw weight bytes must be a numpy array or torch tensor, got {type(raw).__name__}")


def dequantize(raw: torch.Tensor, ggml_type: int, shape) -> torch.Tensor:
    """float32 reference dequantization of raw GGUF bytes (any device torch supports)."""
    raw = _as_uint8_tensor(raw)
    shape = tuple(int(s) for s in shape)
    info = type_info(ggml_type)
    n = int(np.prod(shape)) if shape else 1
    expected = row_bytes(ggml_type, shape[-1]) * (n // shape[-1]) if shape else 0
    if raw.numel() != expected:
        raise QuantFormatError(
            f"{info.name} tensor of shape {shape} needs {expected} bytes, got {raw.numel()}"
        )
    if info.is_float:
        return raw.contiguous().view(FLOAT_DTYPES[ggml_type]).to(torch.float32).reshape(shape)
    if raw.device.type == "cpu" and cpu_native.supports(info.id) and n:
        rows = n // shape[-1]
        return cpu_native.dequantize(info.id, raw.reshape(rows, -1), rows, shape[-1]).reshape(shape)
    blocks = raw.reshape(-1, info.type_size)
    return REFERENCES[info.id](blocks).reshape(shape)


@dataclass
class QWeight:
    """A 2-D weight (out_features, in_features) in its GGUF form.

    `data` is uint8 (rows, row_bytes) raw blocks for quantized types - rows are independent,
    so slicing rows or concatenating weights is slicing/concatenating bytes - or a float
    tensor (out, in) in the file dtype for F32/F16/BF16.
    """

    ggml_type: int
    shape: tuple[int, int]
    data: torch.Tensor
    # CPU only: float32 dense copy kept while the global CPU_DENSE_CACHE_BYTES budget allows
    _dense: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # True when `data` views the model file's read-only mapping (from_gguf on the CPU)
    mapped: bool = field(default=False, repr=False, compare=False)
    # CPU native kernels: (ggml_type, data pointer, row bytes, out_features) once checked, False
    # if not native; made for the kernel variant _native_variant (cpu_native.variant() then)
    _native: tuple | bool | None = field(default=None, repr=False, compare=False)
    _native_variant: str | None = field(default=None, repr=False, compare=False)
    # CPU, Q4_K or Q6_K on a repacking variant: the rows the plan points at (cpu_native.repack)
    _repacked: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_raw(cls, raw, ggml_type: int, shape, device="cpu", name: str = "", from_mapping: bool = False) -> QWeight:
        """Wrap GGUFFile.raw(name) bytes. On CPU the memmap is used in place (no copy); for
        another device the bytes are copied straight there, one tensor at a time. from_mapping:
        raw views a read-only file mapping (then `mapped` on the CPU: its pages may be given back)."""
        what = f"tensor {name!r}: " if name else ""
        try:
            info = type_info(ggml_type)
            shape = tuple(int(s) for s in shape)
            if len(shape) != 2 or shape[0] <= 0:
                raise QuantFormatError(f"a linear weight must be 2-D (out, in), got shape {shape}")
            rb = row_bytes(ggml_type, shape[1])
        except QuantFormatError as e:
            raise QuantFormatError(what + str(e)) from None
        data = _as_uint8_tensor(raw)
        if data.numel() != shape[0] * rb:
            raise QuantFormatError(
                f"{what}{info.name} weight of shape {shape} needs {shape[0] * rb} bytes, got {data.numel()}"
            )
        if info.is_float:
            data = data.view(FLOAT_DTYPES[info.id]).reshape(shape)
        else:
            data = data.reshape(shape[0], rb)
        w = cls(info.id, shape, data.to(device))
        w.mapped = from_mapping and w.data.device.type == "cpu"
        return w

    @classmethod
    def from_gguf(cls, gf, name: str, device="cpu") -> QWeight:
        """Tensor `name` of an open GGUFFile (engine.gguf_file). On CPU the weight keeps the file
        mapped (zero copy); errors name the file and the tensor."""
        if name not in gf.tensors:
            raise QuantFormatError(f"{gf.path}: no tensor {name!r}")
        info = gf.tensors[name]
        return cls.from_raw(gf.raw(name), info.ggml_type, info.shape, device, name=f"{gf.path}: {name}",
                            from_mapping=True)

    @classmethod
    def cat(cls, weights: list[QWeight]) -> QWeight:
        """Concatenate along the output rows (fused QKV / gate_up)."""
        if not weights:
            raise ValueError("QWeight.cat needs at least one weight")
        first = weights[0]
        for w in weights[1:]:
            if w.ggml_type != first.ggml_type or w.shape[1] != first.shape[1]:
                raise ValueError(
                    "QWeight.cat needs one type and one in_features: got "
                    + ", ".join(f"{type_name(v.ggml_type)} {v.shape}" for v in weights)
                )
            if w.data.device != first.data.device:
                raise ValueError("QWeight.cat needs all weights on one device")
        data = torch.cat([w.data for w in weights], dim=0)
        return cls(first.ggml_type, (sum(w.shape[0] for w in weights), first.shape[1]), data)

    def rows(self, start: int, stop: int) -> QWeight:
        """Output rows [start, stop) as a QWeight (a view, no copy)."""
        start, stop, _ = slice(start, stop).indices(self.shape[0])
        if stop <= start:
            raise ValueError(f"empty row range [{start}, {stop}) of a weight with {self.shape[0]} rows")
        return QWeight(self.ggml_type, (stop - start, self.shape[1]), self.data[start:stop])

    @property
    def is_quantized(self) -> bool:
        return not type_info(self.ggml_type).is_float

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def to(self, device) -> QWeight:
        return QWeight(self.ggml_type, self.shape, self.data.to(device))

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """(out, in) dense weight; Triton on CUDA, torch reference elsewhere."""
        if not self.is_quantized:
            return self.data.to(dtype)
        if self.data.device.type == "cuda" and HAVE_TRITON:
            from .qmatmul import dequantize_triton

            return dequantize_triton(self, dtype)
        return dequantize(self.data, self.ggml_type, self.shape).to(dtype)

    def __repr__(self) -> str:
        return f"QWeight({type_name(self.ggml_type)}, shape={self.shape}, device={self.data.device})"


def _chunk_rows(w: QWeight, bytes_per_value: int) -> int:
    return max(1, PREFILL_CHUNK_BYTES // (w.shape[1] * bytes_per_value))


def _cached_dense(w: QWeight) -> torch.Tensor | None:
    """The CPU float32 dense weight if cached or if it fits the remaining budget, else None."""
    if w._dense is not None:
        return w._dense
    nbytes = w.shape[0] * w.shape[1] * 4
    if w.data.device.type != "cpu":
        return None
    if w.ggml_type == F32:
        return w.data  # already dense float32 (a view of the file)
    if not DENSE_CACHE.admit(nbytes):
        return None
    w._dense = dequantize(w.data.reshape(-1), w.ggml_type, w.shape)
    weakref.finalize(w, DENSE_CACHE.give_back, nbytes)
    return w._dense


def linear_reference(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """Torch reference: float32 dequant (cached on CPU within budget, else by row chunks) +
    matmul. Any device; bounded memory."""
    x32 = x.reshape(-1, w.shape[1]).to(torch.float32)
    dense = _cached_dense(w)
    if dense is not None:
        return (x32 @ dense.t()).to(x.dtype).reshape(*x.shape[:-1], w.shape[0])
    out = torch.empty(x32.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    step = _chunk_rows(w, 4)
    for start in range(0, w.shape[0], step):
        part = w.rows(start, min(start + step, w.shape[0]))
        wd = dequantize(part.data.reshape(-1), part.ggml_type, part.shape).to(x.device)
        torch.matmul(x32, wd.t(), out=out[:, start : start + part.shape[0]])
    return out.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])


def _linear_native(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    y = cpu_native.matmul(x.reshape(-1, w.shape[1]), w.ggml_type, w.data, w.shape[0], w.shape[1])
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])


def _linear_float(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    if x.device.type == "cpu" and native_cpu(w):
        return _linear_native(x, w)  # f16/bf16 weights, float32 math, no float32 weight copy
    if x.dtype == w.data.dtype:
        return F.linear(x, w.data)
    if x.device.type == "cpu":
        return linear_reference(x, w)
    if w.data.dtype == torch.float32:
        return F.linear(x.float(), w.data).to(x.dtype)
    # f16 weights with bf16 activations (or the reverse): cast the small activations, never
    # the weight — upcasting a weight per call would copy the whole model on every token.
    return F.linear(x.to(w.data.dtype), w.data).to(x.dtype)


def _native_plan(w: QWeight) -> tuple | bool:
    """(ggml_type, data pointer, row bytes, out_features), cached per weight (is_cpu_exact() is
    checked on every call, not here). A Q4_K or Q6_K weight on a repacking variant is repacked
    here, once (decode is compute-bound on Q4_K there: ~1.2x the GB/s repacked; Q6_K prefill
    loses its in-register transposes), and the file's pages it was read from are given back, so
    resident memory stays about the file's size."""
    w._native_variant = cpu_native.variant()
    if (w.data.device.type != "cpu" or w.ggml_type == F32 or not cpu_native.supports(w.ggml_type)
            or w.data.dim() != 2 or w.data.stride(1) != 1):
        return False
    repacked = cpu_native.repacked_type(w.ggml_type)
    if repacked is not None and w.shape[1] % 256 == 0:
        if w._repacked is None:
            w._repacked = cpu_native.repack(w.ggml_type, w.data, give_back=w.mapped and w.data.is_contiguous())
        return (repacked, w._repacked.data_ptr(), w._repacked.stride(0), w.shape[0])
    return (w.ggml_type, w.data.data_ptr(), w.data.stride(0) * w.data.element_size(), w.shape[0])


def prepare(w: QWeight) -> None:
    """Make w's native plan now (a loader calls it, so that repacking happens while the model
    loads, not in the first reply)."""
    _plan(w)


def _plan(w: QWeight) -> tuple | bool:
    """w's cached native plan, made again after a change of kernel variant (the native module
    holds which variant runs; a repacked weight runs on its own only)."""
    if w._native is None or w._native_variant != cpu_native.variant():
        w._native = _native_plan(w)
    return w._native


def _linear_native_fast(x: torch.Tensor, w: QWeight, plan: tuple) -> torch.Tensor:
    """The decode hot path (~60 calls a token): a few microseconds of Python, no more."""
    n_out, k = w.shape
    x2 = x if (x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous()) else \
        x.reshape(-1, k).to(torch.float32).contiguous()
    n = x2.shape[0]
    y = torch.empty(n, n_out, dtype=torch.float32)
    if n:
        cpu_native._cpu.matmul(plan[0], plan[1], plan[2], n_out, k, x2.data_ptr(), k * 4, n, y.data_ptr(), n_out)
    if x.dim() != 2:
        y = y.reshape(*x.shape[:-1], n_out)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def cuda_kernel_for(n_rows: int, dtype: torch.dtype) -> str:
    """Which CUDA path multiplies n_rows activation rows of `dtype` by a quantized weight:
    "decode" (one row; float32 / float16 up to DECODE_MAX_ROWS), "rows" (the tensor-core
    kernel: bf16 up to FUSED_MAX_ROWS) or "dense" (dequantize to scratch + cuBLAS). fp16 is
    the engine's dtype only before sm_80 (mistral3.text.default_dtype), where Triton's tl.dot
    has no tensor-core instructions (qmatmul._ROWS_TILES); float32 must not be rounded."""
    tensor_cores = dtype == torch.bfloat16
    if n_rows <= 1 or (not tensor_cores and n_rows <= DECODE_MAX_ROWS):
        return "decode"
    return "rows" if tensor_cores and n_rows <= FUSED_MAX_ROWS else "dense"


def linear(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """x (..., in) -> (..., out) in x.dtype; weight stays quantized."""
    plan = _plan(w)
    if plan and x.is_cpu and not is_cpu_exact() and x.shape[-1] == w.shape[1]:
        return _linear_native_fast(x, w, plan)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x has {x.shape[-1]} features, weight {w!r} expects {w.shape[1]}")
    if x.device != w.data.device:
        raise ValueError(f"linear: x is on {x.device}, weight on {w.data.device}")
    if not w.is_quantized:
        return _linear_float(x, w)
    if x.device.type == "cuda" and HAVE_TRITON:
        from .qmatmul import linear_decode, linear_prefill, linear_rows

        kernel = cuda_kernel_for(x.numel() // x.shape[-1], x.dtype)
        if kernel == "decode":
            return linear_decode(x, w)
        return linear_rows(x, w) if kernel == "rows" else linear_prefill(x, w, PREFILL_CHUNK_BYTES)
    if x.device.type == "cpu":
        if native_cpu(w):
            return _linear_native(x, w)
        if not cpu_native.AVAILABLE and not is_cpu_exact():
            _warn_no_native()
    return linear_reference(x, w)


def native_plans(weights, x: torch.Tensor) -> list[tuple] | None:
    """(ggml_type, data pointer, row bytes, out_features) of each weight when the CPU kernels
    can multiply x (2-D contiguous float32 on the CPU) by all of them in one call, else None."""
    k = x.shape[-1]
    if is_cpu_exact() or not x.is_cpu or x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() \
            or len(weights) > 8:
        return None
    plans = []
    for w in weights:
        plan = _plan(w)
        if not plan or w.shape[1] != k:
            return None
        plans.append(plan)
    return plans


def linears(x: torch.Tensor, weights) -> list[torch.Tensor]:
    """`linear(x, w)` for each weight of one input (a layer's q, k, v; gate and up): on the CPU
    kernels one native call for all of them (decode: fewer Python round trips a token)."""
    plans = native_plans(weights, x)
    if plans is None:
        return [linear(x, w) for w in weights]
    return cpu_native.matmuls(x, plans)


def linear_add(x: torch.Tensor, w: QWeight, residual: torch.Tensor) -> torch.Tensor:
    """residual + linear(x, w) (a residual connection); on the CPU kernels the sum is made in the
    matmul's call, bit for bit the same."""
    plans = native_plans((w,), x)
    if plans is None or residual.dtype != torch.float32 or residual.shape != (x.shape[0], w.shape[0]) \
            or not residual.is_contiguous():
        return residual + linear(x, w)
    return cpu_native.matmul_add(x, plans[0], residual)


def native_decode_layers(layers, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, v_head_dim: int,
                         eps: float, block_size: int | None = None):
    """One native call per decode step for a run of layers (cpu_native.DecodeLayers), or None
    where it does not apply (torch path, is_cpu_exact(), a weight the kernels do not run, a fused
    QKV / gate-up, a KV cache that is neither float32 nor float16): then the per-op path runs, which gives the
    same row bit for bit. `layers`: (attn_norm, ffn_norm, (wq, wk, wv, wo, w_gate, w_up,
    w_down), k_cache, v_cache) each; block_size: the caches are paged pools (n_blocks, kv_heads,
    block_size, d) read through a block table at each run."""
    if is_cpu_exact() or not cpu_native.AVAILABLE:
        return None
    rows = []
    for attn_norm, ffn_norm, weights, k_cache, v_cache in layers:
        if k_cache.dtype not in cpu_native.KV_ELEM_SIZES or v_cache.dtype != k_cache.dtype or not k_cache.is_cpu:
            return None
        plans = []
        for w in weights:
            plan = _plan(w) if w is not None else False
            if not plan:
                return None
            plans.append((*plan, w.shape[1]))
        rows.append((attn_norm, ffn_norm, plans, k_cache, v_cache))
    return cpu_native.DecodeLayers(rows, hidden, n_heads, n_kv_heads, head_dim, v_head_dim, eps, block_size=block_size)
