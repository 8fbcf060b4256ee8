"""The native CPU kernels (`tramontane.kernels._cpu`, built from kernels/cpu/ by pip install).

Matmuls run straight on a weight's GGUF blocks (the memory-mapped file, no float copy): each
activation row is quantized per block (Q8_K-style for K-quants and IQ4_XS, Q8_0-style for the
32-element types), products are integer SIMD dot products, scaled in float32. F16/BF16/F32
weights are multiplied in float32. See docs/DESIGN.md, "CPU kernels".

Threads: `TRAMONTANE_THREADS` (tramontane/env.py) or `set_threads(n)`; the default is the number of physical cores
this process may run on. `AVAILABLE` is False when the module was not built; callers then keep
the torch path (kernels.linear warns once).
"""
from __future__ import annotations

import os

import torch

from ..env import read_env
from .ggml_types import (BF16, F16, F32, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0,
                         Q5_1, Q5_K, Q6_K, Q8_0, type_info)

try:
    from . import _cpu
except ImportError as exc:  # not built (e.g. a source tree without `pip install -e .`)
    _cpu = None
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

AVAILABLE = _cpu is not None
# What a user does when AVAILABLE is False (the self-test and the window both say it).
NO_KERNELS_FIX = ("install a C compiler (Debian/Ubuntu: sudo apt install build-essential), then "
                  "TRAMONTANE_REINSTALL=1 ./scripts/run.sh")
TYPES = frozenset({F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
                   IQ4_NL, IQ4_XS})


def physical_cores() -> int:
    """Physical cores among the CPUs this process may use (SMT siblings counted once)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "core_id") as f:
                core = f.read().strip()
            with open(base + "physical_package_id") as f:
                pkg = f.read().strip()
        except OSError:
            return max(1, len(cpus))
        cores.add((pkg, core))
    return max(1, len(cores))


def default_threads() -> int:
    """TRAMONTANE_THREADS, else one per physical core this process may run on."""
    return read_env().threads or physical_cores()


def set_threads(n: int | None = None) -> int:
    """Threads for the native kernels (None: the default); returns the count in use."""
    if _cpu is None:
        return 1
    _cpu.set_threads(int(n) if n is not None else default_threads())
    return _cpu.threads()


def threads() -> int:
    return _cpu.threads() if _cpu is not None else 1


def variant() -> str | None:
    """The kernel variant in use: 'avx512vnni', 'avx2', 'neondot', 'neon' or 'generic' (None when
    not built)."""
    return _cpu.variant() if _cpu is not None else None


def variants() -> list[str]:
    """The variants this CPU can run, best first."""
    return list(_cpu.variants()) if _cpu is not None else []


def use_variant(name: str) -> None:
    """Run the kernels of variant `name` from now on (tests, benchmarks); the module holds the
    choice, and a weight planned for another variant is planned again (kernels.linear._plan)."""
    _cpu.use_variant(name)


def _start_on_the_asked_variant() -> None:
    """TRAMONTANE_CPU_VARIANT where this CPU runs it (the module starts on the best one it runs;
    a name it does not run leaves that, as before)."""
    asked = read_env().cpu_variant
    if asked and asked in variants():
        _cpu.use_variant(asked)


_start_on_the_asked_variant()


# Not ggml types: Q4_K and Q6_K rows repacked (repack) for the VNNI kernels; the same bytes a row.
Q4_K_REPACKED = 31
Q6_K_REPACKED = 32
_REPACKED = {Q4_K: Q4_K_REPACKED, Q6_K: Q6_K_REPACKED}
# activation rows up to which a repacked matmul runs each row as it runs alone (the narrow tiles,
# the weights read once per 8 rows): a batch's decode rows, drafted tokens verified at once
NARROW_MAX_ROWS = _cpu.NARROW_MAX_ROWS if _cpu is not None else 0


def repacking_variants() -> list[str]:
    """The variants this CPU can run that have kernels for Q4_K_REPACKED and Q6_K_REPACKED."""
    return list(_cpu.repacking_variants()) if _cpu is not None else []


def repacked_type(ggml_type: int) -> int | None:
    """The repacked type that weights of `ggml_type` run faster as on the variant in use (its
    kernels then read their vectors straight from memory instead of shuffling every block into
    place), or None."""
    t = _REPACKED.get(int(ggml_type))
    return t if t is not None and variant() in repacking_variants() else None


# bytes of a file-mapped weight repacked between two give-backs of its pages (repack)
GIVE_BACK_CHUNK = 16 << 20


def repack(ggml_type: int, data: torch.Tensor, give_back: bool = False) -> torch.Tensor:
    """A Q4_K or Q6_K weight's rows (uint8 (rows, row bytes)) in its repacked order (Q4_K_REPACKED,
    Q6_K_REPACKED) for the variant in use: a new tensor, multithreaded, once per weight.
    give_back: `data` views a read-only file mapping whose pages nothing reads again; they are
    given back (drop_pages) every GIVE_BACK_CHUNK bytes, so a load holds one chunk of the file
    beside the copies, not the whole matrix (a 131072-row Q6_K output head is 220 MB at 1.1 B
    parameters, 551 MB at 24 B: it was the load's peak)."""
    t = _REPACKED.get(int(ggml_type))
    if t is None:
        raise ValueError(f"ggml type {ggml_type} has no repacked order (Q4_K and Q6_K do)")
    rows, cols = data.shape[0], data.shape[1] // type_info(ggml_type).type_size * 256
    src, stride = _weight_rows(data)
    out = torch.empty(rows, data.shape[1], dtype=torch.uint8)
    step = max(1, GIVE_BACK_CHUNK // stride) if give_back else max(rows, 1)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        _cpu.repack(t, src + r0 * stride, stride, n, cols, out.data_ptr() + r0 * out.stride(0), out.stride(0))
        if give_back:
            _cpu.drop_pages(src + r0 * stride, n * stride)
    if give_back:
        _cpu.drop_pages(src, rows * stride)  # the pages two chunks shared
    return out


def drop_pages(data: torch.Tensor) -> bool:
    """Give back the resident pages of a tensor that views a read-only file mapping (they are
    read from the file again if touched). Only for file-backed tensors: anonymous memory
    would lose its contents."""
    return bool(_cpu.drop_pages(data.data_ptr(), data.numel() * data.element_size()))


if _cpu is not None:
    set_threads()


def supports(ggml_type: int) -> bool:
    return _cpu is not None and int(ggml_type) in TYPES


def _weight_rows(data: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes between rows) of a 2-D weight whose rows are contiguous."""
    if data.dim() != 2 or data.stride(1) != 1:
        raise ValueError("native matmul needs a 2-D weight with contiguous rows")
    return data.data_ptr(), data.stride(0) * data.element_size()


def matmul(x: torch.Tensor, ggml_type: int, data: torch.Tensor, out_features: int,
           in_features: int) -> torch.Tensor:
    """x (n, in) float32 -> (n, out) float32 with the weight `data` in its GGUF form
    (uint8 (out, row_bytes) blocks, or an (out, in) float tensor for F32/F16/BF16)."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
        x = x.reshape(-1, in_features).to(torch.float32).contiguous()
    n = x.shape[0]
    y = torch.empty(n, out_features, dtype=torch.float32)
    if n == 0:
        return y
    w_ptr, w_stride = _weight_rows(data)
    _cpu.matmul(int(ggml_type), w_ptr, w_stride, out_features, in_features, x.data_ptr(),
                x.stride(0) * 4, n, y.data_ptr(), out_features)
    return y


def dequantize(ggml_type: int, data: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """float32 (rows, cols) of a weight's GGUF rows (multithreaded)."""
    out = torch.empty(rows, cols, dtype=torch.float32)
    if rows:
        w_ptr, w_stride = _weight_rows(data)
        _cpu.dequantize(int(ggml_type), w_ptr, w_stride, rows, cols, out.data_ptr())
    return out


# The KV cache's element types the kernels read and write: float32, or float16 (written rounded to
# nearest even, converted back to float32 as loaded; the attention math is float32 either way).
KV_ELEM_SIZES = {torch.float32: 4, torch.float16: 2}


def _kv_elem_size(k_cache: torch.Tensor, v_cache: torch.Tensor, name: str) -> int:
    """The caches' element size for the kernel (4 or 2); both caches of one supported dtype."""
    size = KV_ELEM_SIZES.get(k_cache.dtype)
    if size is None or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"{name}: KV caches must both be float32 or both float16, got {k_cache.dtype} and "
                         f"{v_cache.dtype}")
    return size


def attend_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, n_keys: int,
                  scale: float | None = None) -> torch.Tensor:
    """Attention of one query row over the first n_keys cached positions, float32 math:
    q (n_heads, d) -> (n_heads, dv). keys (float32 or float16) (n_kv_heads, capacity, d) and values
    (n_kv_heads, capacity, dv) as the KV cache holds them (rows contiguous; any head/row
    strides); query head h reads KV head h // (n_heads // n_kv_heads). KV groups run on the pool:
    the decode step of attend_causal (the one decode-attention kernel), as the query at
    position n_keys - 1."""
    n_heads, d = q.shape
    n_kv, dv = keys.shape[0], values.shape[-1]
    elem = _kv_elem_size(keys, values, "attend_decode")
    if (q.dtype != torch.float32 or keys.stride(-1) != 1 or values.stride(-1) != 1 or not 0 < n_keys <= keys.shape[1]
            or n_keys > values.shape[1] or n_heads % n_kv or keys.shape[-1] != d):
        raise ValueError("attend_decode needs float32 q (H, d), keys/values (Hkv, S, d) with contiguous rows "
                         "and 1..S keys")
    q = q.contiguous()
    out = torch.empty(n_heads, dv, dtype=torch.float32)
    _cpu.attend_causal(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), 1, n_heads, n_kv, d, dv,
                       n_keys - 1, n_heads * d, n_heads * dv, keys.stride(0), keys.stride(1), values.stride(0),
                       values.stride(1), float(scale if scale is not None else d ** -0.5), elem)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 RMSNorm over the last dimension, as HF MistralRMSNorm computes it in float32:
    weight * (x * rsqrt(mean(x^2) + eps)) - one call instead of ~9 small torch ops."""
    n = x.shape[-1]
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.numel() != n:
        raise ValueError("rms_norm needs float32 x (..., n) and weight (n,)")
    xc = x.contiguous()
    w = weight.contiguous()
    out = torch.empty_like(xc)
    _cpu.rms_norm(xc.data_ptr(), w.data_ptr(), out.data_ptr(), xc.numel() // n, n, float(eps))
    return out


def rope_pairs(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on adjacent pairs, float32: x (T, H, d), tables (T, d);
    x * cos + swap_pairs(x) * sin_signed (the engine's apply_rope_pairs, bit for bit)."""
    T, H, d = x.shape
    if (x.dtype != torch.float32 or cos.dtype != torch.float32 or sin_signed.dtype != torch.float32
            or cos.shape != (T, d) or sin_signed.shape != (T, d) or d % 2):
        raise ValueError("rope_pairs needs float32 x (T, H, d) and tables (T, d), d even")
    xc, c, s = x.contiguous(), cos.contiguous(), sin_signed.contiguous()
    out = torch.empty_like(xc)
    _cpu.rope_pairs(xc.data_ptr(), c.data_ptr(), s.data_ptr(), out.data_ptr(), T, H, d)
    return out


# ---------------------------------------------------------------------------- fused forward-pass ops
# The non-matmul steps of a CPU forward pass, one native call each (torch references:
# engine/mistral3/text.py's fallbacks; tests/kernels/test_cpu_fused.py compares them).

def _rows(t: torch.Tensor, heads: int, d: int) -> int:
    """Row stride (floats) of a float32 (T, heads, d) tensor whose rows hold contiguous heads."""
    s = t.stride()
    if t.dtype != torch.float32 or t.shape[1:] != (heads, d) or s[2] != 1 or (heads > 1 and s[1] != d):
        raise ValueError(f"expected float32 (T, {heads}, {d}) with contiguous heads, got "
                         f"{t.dtype} {tuple(t.shape)} strides {s}")
    return s[0]


def _rope_rows(q, k, v, cos_q, sin_q, cos_k, sin_k) -> tuple[list, list, tuple]:
    """rope_kv's rows and tables checked: (their pointers, [T, Hq, Hkv, d, dv] and the rows' strides
    [q_row, k_row, v_row]); the kernel trusts them."""
    T, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    q_row, k_row, v_row = _rows(q, hq, d), _rows(k, hkv, d), _rows(v, hkv, dv)
    f32 = torch.float32
    if (cos_q.dtype != f32 or sin_q.dtype != f32 or cos_k.dtype != f32 or sin_k.dtype != f32
            or not cos_q.shape == sin_q.shape == cos_k.shape == sin_k.shape == (T, d)
            or not (cos_q.is_contiguous() and sin_q.is_contiguous() and cos_k.is_contiguous()
                    and sin_k.is_contiguous())):
        raise ValueError(f"rope tables must be contiguous float32 ({T}, {d})")
    if k.shape[0] != T or v.shape[0] != T:
        raise ValueError(f"rope_kv: {T} query rows but {k.shape[0]} key and {v.shape[0]} value rows")
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), cos_q.data_ptr(), sin_q.data_ptr(), cos_k.data_ptr(),
            sin_k.data_ptr()]
    return ptrs, [T, hq, hkv, d, dv], (q_row, k_row, v_row)


def _rope_kv_args(q, k, v, cos_q, sin_q, cos_k, sin_k, k_cache, v_cache, start: int) -> list:
    """rope_kv's arguments, every shape and stride checked (the kernel trusts them)."""
    ptrs, (T, hq, hkv, d, dv), row_strides = _rope_rows(q, k, v, cos_q, sin_q, cos_k, sin_k)
    ks, vs = k_cache.stride(), v_cache.stride()
    elem = _kv_elem_size(k_cache, v_cache, "rope_kv")
    if (k_cache.device.type != "cpu" or v_cache.device.type != "cpu" or k_cache.shape[0] != hkv
            or v_cache.shape[0] != hkv or k_cache.shape[2] != d or v_cache.shape[2] != dv or ks[2] != 1 or vs[2] != 1
            or not 0 <= start <= min(k_cache.shape[1], v_cache.shape[1]) - T):
        raise ValueError("rope_kv: caches must be (Hkv, capacity, d) with room for the rows")
    return [*ptrs, k_cache.data_ptr(), v_cache.data_ptr(), T, hq, hkv, d, dv, start, *row_strides,
            ks[0], ks[1], vs[0], vs[1], elem]


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                  cos_k: torch.Tensor, sin_k: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  start: int) -> None:
    """One call for RoPE and the KV-cache write of T rows, float32: q (T, Hq, d) is rotated in
    place, k (T, Hkv, d) rotated into k_cache[:, start:start + T] and v (T, Hkv, dv) copied into
    v_cache[:, start:start + T] (caches (Hkv, capacity, d), rows contiguous). Tables (T, d) as
    for rope_pairs; bit-exact with rope_pairs and a slice assignment (float16 caches: of its
    float32 result rounded as Tensor.half() rounds)."""
    _cpu.rope_kv(*_rope_kv_args(q, k, v, cos_q, sin_q, cos_k, sin_k, k_cache, v_cache, start))


def rope_kv_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                   cos_k: torch.Tensor, sin_k: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   start: int, scale: float | None = None) -> torch.Tensor:
    """rope_kv_write then attend_causal(q, k_cache, v_cache, start) in one call: a layer's
    attention before its output projection, (T, Hq * dv). q is rotated in place."""
    *args, elem = _rope_kv_args(q, k, v, cos_q, sin_q, cos_k, sin_k, k_cache, v_cache, start)
    T, hq, d = q.shape
    if hq % k.shape[1]:
        raise ValueError("rope_kv_attend: query heads must be a multiple of the KV heads")
    out = torch.empty(T, hq * v.shape[2], dtype=torch.float32)
    if T:
        _cpu.rope_kv_attend(*args, out.data_ptr(), float(scale if scale is not None else d ** -0.5), elem)
    return out


def attend_causal(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                  scale: float | None = None) -> torch.Tensor:
    """Causal attention, float32 math: q (T, H, d) at positions start..start+T-1 over the cached
    keys and values (Hkv, capacity, d / dv; float32 or float16), row t seeing positions
    [0, start + t]; query head h reads KV head h // (H // Hkv). Returns (T, H * dv). (T, KV head) pairs run on the pool: prefill
    attention uses every thread, and a decode step (T = 1) is attend_decode."""
    T, H, d = q.shape
    hkv, dv = k_cache.shape[0], v_cache.shape[2]
    q_row = _rows(q, H, d)
    elem = _kv_elem_size(k_cache, v_cache, "attend_causal")
    if (k_cache.device.type != "cpu" or v_cache.device.type != "cpu" or k_cache.shape[2] != d
            or v_cache.shape[0] != hkv or k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or H % hkv
            or start < 0 or start + T > min(k_cache.shape[1], v_cache.shape[1])):
        raise ValueError("attend_causal: caches must be (Hkv, capacity, d) holding the rows")
    out = torch.empty(T, H * dv, dtype=torch.float32)
    if T:
        _cpu.attend_causal(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), T, H, hkv, d, dv,
                           start, q_row, H * dv, k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
                           v_cache.stride(1), float(scale if scale is not None else d ** -0.5), elem)
    return out


# ---------------------------------------------------------------------------- paged KV
# K/V in pools of fixed-size blocks, one pool pair per layer: k_pool (n_blocks, Hkv, B, d), v_pool
# (n_blocks, Hkv, B, dv), float32 or float16 (KV_ELEM_SIZES); a sequence's position p is row p % B of
# block table[p // B] (an int32 block table; int64 is converted). The kernels are those of the
# contiguous calls above, which read their cache as a pool of one block (B = capacity, table [0]) through
# the same row loop: a paged result is bit for bit the contiguous one over the same rows.

def _pool_args(k_pool: torch.Tensor, v_pool: torch.Tensor, d: int, block_size: int, name: str) -> tuple:
    """(Hkv, dv, [k_head, k_row, v_head, v_row] strides, [k_block, v_block, n_blocks], element size) of two
    pools, checked (the kernels trust them)."""
    elem = _kv_elem_size(k_pool, v_pool, name)
    if (k_pool.dim() != 4 or v_pool.dim() != 4 or block_size < 1 or k_pool.device.type != "cpu"
            or v_pool.device.type != "cpu" or k_pool.shape[1:3] != v_pool.shape[1:3]
            or k_pool.shape[0] != v_pool.shape[0] or k_pool.shape[2] != block_size or k_pool.shape[3] != d
            or k_pool.shape[0] < 1 or k_pool.stride(3) != 1 or v_pool.stride(3) != 1):
        raise ValueError(f"{name}: pools must be (n_blocks, Hkv, {block_size}, {d}) and (n_blocks, Hkv, "
                         f"{block_size}, dv) with contiguous rows, got {tuple(k_pool.shape)} and "
                         f"{tuple(v_pool.shape)}")
    ks, vs = k_pool.stride(), v_pool.stride()
    return (k_pool.shape[1], v_pool.shape[3], [ks[1], ks[2], vs[1], vs[2]], [ks[0], vs[0], k_pool.shape[0]],
            elem)


def _block_table(table: torch.Tensor, dims: int, name: str) -> torch.Tensor:
    """A CPU block table (1-D for a sequence, 2-D (R, M) for R rows) as contiguous int32."""
    if (table.dim() != dims or table.device.type != "cpu" or table.dtype not in (torch.int32, torch.int64)
            or table.shape[-1] == 0):
        raise ValueError(f"{name}: the block table must be a non-empty {dims}-D int32 CPU tensor, got "
                         f"{table.dtype} {tuple(table.shape)} on {table.device}")
    return table.to(torch.int32).contiguous()


def _paged_tail(table: torch.Tensor, block_size: int, blocks: list) -> list:
    """The kernels' paged arguments: table, its length per sequence, B, block strides, blocks in the pool."""
    return [table.data_ptr(), table.shape[-1], block_size, blocks[0], blocks[1], blocks[2]]


def paged_attend_causal(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
                        start: int, block_size: int, scale: float | None = None) -> torch.Tensor:
    """attend_causal over pools: one sequence's rows q (T, H, d) at positions [start, start + T), row t
    seeing its positions [0, start + t] through block_table. Returns (T, H * dv)."""
    T, H, d = q.shape
    q_row = _rows(q, H, d)
    hkv, dv, strides, blocks, elem = _pool_args(k_pool, v_pool, d, block_size, "paged_attend_causal")
    table = _block_table(block_table, 1, "paged_attend_causal")
    if H % hkv or start < 0:
        raise ValueError(f"paged_attend_causal: {H} heads over {hkv} KV heads, start {start}")
    out = torch.empty(T, H * dv, dtype=torch.float32)
    if T:
        _cpu.attend_causal(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), out.data_ptr(), T, H, hkv, d, dv,
                           start, q_row, H * dv, *strides, float(scale if scale is not None else d ** -0.5), elem,
                           *_paged_tail(table, block_size, blocks))
    return out


def _paged_rope_args(q, k, v, cos_q, sin_q, cos_k, sin_k, k_pool, v_pool, block_size: int, name: str) -> tuple:
    ptrs, dims, row_strides = _rope_rows(q, k, v, cos_q, sin_q, cos_k, sin_k)
    hkv, dv, strides, blocks, elem = _pool_args(k_pool, v_pool, dims[3], block_size, name)
    if (hkv, dv) != (dims[2], dims[4]) or dims[1] % hkv:
        raise ValueError(f"{name}: k {tuple(k.shape)} and v {tuple(v.shape)} do not fit pools of {hkv} KV heads "
                         f"of {dv} values, or {dims[1]} query heads do not share them evenly")
    return ptrs, dims, row_strides, strides, blocks, elem


def paged_rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                        cos_k: torch.Tensor, sin_k: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                        block_table: torch.Tensor, start: int, block_size: int) -> None:
    """rope_kv_write into pools: q rotated in place, the rows' K/V written at positions [start, start + T)
    through block_table."""
    ptrs, dims, rows, strides, blocks, elem = _paged_rope_args(q, k, v, cos_q, sin_q, cos_k, sin_k, k_pool, v_pool,
                                                               block_size, "paged_rope_kv_write")
    table = _block_table(block_table, 1, "paged_rope_kv_write")
    if start < 0:
        raise ValueError(f"paged_rope_kv_write: start {start} < 0")
    _cpu.rope_kv(*ptrs, k_pool.data_ptr(), v_pool.data_ptr(), *dims, start, *rows, *strides, elem,
                 *_paged_tail(table, block_size, blocks))


def paged_rope_kv_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                         cos_k: torch.Tensor, sin_k: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                         block_table: torch.Tensor, start: int, block_size: int,
                         scale: float | None = None) -> torch.Tensor:
    """rope_kv_attend over pools (one sequence): paged_rope_kv_write then paged_attend_causal in one call,
    (T, Hq * dv). q is rotated in place."""
    ptrs, dims, rows, strides, blocks, elem = _paged_rope_args(q, k, v, cos_q, sin_q, cos_k, sin_k, k_pool, v_pool,
                                                               block_size, "paged_rope_kv_attend")
    table = _block_table(block_table, 1, "paged_rope_kv_attend")
    if start < 0:
        raise ValueError(f"paged_rope_kv_attend: start {start} < 0")
    T, hq, _, d, dv = dims
    out = torch.empty(T, hq * dv, dtype=torch.float32)
    if T:
        _cpu.rope_kv_attend(*ptrs, k_pool.data_ptr(), v_pool.data_ptr(), *dims, start, *rows, *strides,
                            out.data_ptr(), float(scale if scale is not None else d ** -0.5), elem,
                            *_paged_tail(table, block_size, blocks))
    return out


def _decode_rows(q, block_tables, positions, name: str) -> tuple:
    R, H, d = q.shape
    tables = _block_table(block_tables, 2, name)
    if (tables.shape[0] != R or positions.shape != (R,) or positions.device.type != "cpu"
            or positions.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"{name}: {R} rows want block tables (R, M) and int32 positions (R,), got "
                         f"{tuple(block_tables.shape)} and {positions.dtype} {tuple(positions.shape)}")
    return tables, positions.to(torch.int32).contiguous()


def paged_attend_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                        positions: torch.Tensor, block_size: int, scale: float | None = None) -> torch.Tensor:
    """Decode attention of R independent sequences in one call: q (R, H, d), row r at positions[r] attends
    to its positions [0, positions[r]] through block_tables[r] ((R, M) int32); a negative position is a
    padding row (zeros, nothing read). (row, KV head) pairs run on the pool. Returns (R, H * dv)."""
    R, H, d = q.shape
    q_row = _rows(q, H, d)
    hkv, dv, strides, blocks, elem = _pool_args(k_pool, v_pool, d, block_size, "paged_attend_decode")
    tables, pos = _decode_rows(q, block_tables, positions, "paged_attend_decode")
    if H % hkv:
        raise ValueError(f"paged_attend_decode: {H} heads over {hkv} KV heads")
    out = torch.empty(R, H * dv, dtype=torch.float32)
    if R:
        _cpu.attend_rows(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), out.data_ptr(), R, H, hkv, d, dv, q_row,
                         H * dv, *strides, float(scale if scale is not None else d ** -0.5), elem,
                         *_paged_tail(tables, block_size, blocks), pos.data_ptr())
    return out


def paged_rope_kv_attend_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_q: torch.Tensor,
                                sin_q: torch.Tensor, cos_k: torch.Tensor, sin_k: torch.Tensor, k_pool: torch.Tensor,
                                v_pool: torch.Tensor, block_tables: torch.Tensor, positions: torch.Tensor,
                                block_size: int, scale: float | None = None) -> torch.Tensor:
    """A batched decode step's attention in one call: each of the R rows (q (R, Hq, d), k, v, RoPE tables
    (R, d) of each row's own position) rotated, its K/V written at positions[r] through block_tables[r],
    then paged_attend_decode. A negative position: nothing written, zeros out. q is rotated in place.
    Returns (R, Hq * dv)."""
    ptrs, (R, hq, hkv, d, dv), (q_row, k_row, v_row), strides, blocks, elem = _paged_rope_args(
        q, k, v, cos_q, sin_q, cos_k, sin_k, k_pool, v_pool, block_size, "paged_rope_kv_attend_decode")
    tables, pos = _decode_rows(q, block_tables, positions, "paged_rope_kv_attend_decode")
    out = torch.empty(R, hq * dv, dtype=torch.float32)
    if R:
        _cpu.attend_rows(ptrs[0], k_pool.data_ptr(), v_pool.data_ptr(), out.data_ptr(), R, hq, hkv, d, dv, q_row,
                         hq * dv, *strides, float(scale if scale is not None else d ** -0.5), elem,
                         *_paged_tail(tables, block_size, blocks), pos.data_ptr(), *ptrs[1:], k_row, v_row)
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, float32 (rows, n) (any row strides, e.g. the halves of a fused gate_up
    output); silu(a) = a / (1 + exp(-a)) with a vectorized exp (~1 ulp)."""
    if (gate.dtype != torch.float32 or up.dtype != torch.float32 or gate.dim() != 2 or gate.shape != up.shape
            or gate.stride(1) != 1 or up.stride(1) != 1):
        raise ValueError("swiglu needs float32 gate and up of one (rows, n) shape with contiguous rows")
    rows, n = gate.shape
    out = torch.empty(rows, n, dtype=torch.float32)
    _cpu.swiglu(gate.data_ptr(), up.data_ptr(), out.data_ptr(), rows, n, gate.stride(0), up.stride(0), n)
    return out


def dequantize_rows(ggml_type: int, data: torch.Tensor, ids: torch.Tensor, cols: int) -> torch.Tensor:
    """float32 (len(ids), cols): the rows `ids` of a weight in its GGUF form (an embedding
    lookup straight from the mapped table, no gathered copy). Bad ids raise IndexError."""
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), cols, dtype=torch.float32)
    if ids.numel():
        w_ptr, w_stride = _weight_rows(data)
        _cpu.dequantize_rows(int(ggml_type), w_ptr, w_stride, data.shape[0], cols, ids.data_ptr(), ids.numel(),
                             out.data_ptr())
    return out


def argmax(x: torch.Tensor) -> tuple[int, bool]:
    """(first index of the largest value, whether any value is NaN) of a float32 vector: greedy
    sampling's one pass over the logits."""
    if x.dtype != torch.float32 or x.dim() != 1 or x.numel() == 0:
        raise ValueError("argmax needs a non-empty float32 vector")
    x = x.contiguous()
    return _cpu.argmax(x.data_ptr(), x.numel())


def _outputs(n: int, plans: list[tuple]) -> tuple[list[torch.Tensor], list]:
    """An (n, out) float32 output per plan, and the kernels' per-weight arguments for them."""
    ys = [torch.empty(n, p[3], dtype=torch.float32) for p in plans]
    return ys, [a for p, y in zip(plans, ys) for a in (p[0], p[1], p[2], p[3], y.data_ptr(), p[3])]


def matmuls(x: torch.Tensor, plans: list[tuple]) -> list[torch.Tensor]:
    """x (n, k) contiguous float32 times each weight of `plans` ((ggml_type, data pointer, row
    bytes, out_features), from kernels.linear.native_plans), in one call: [(n, out) ...]."""
    n, k = x.shape
    ys, args = _outputs(n, plans)
    _cpu.matmuls(x.data_ptr(), k * 4, n, k, *args)
    return ys


def norm_matmuls(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, plans: list[tuple]) -> list[torch.Tensor]:
    """matmuls(rms_norm(x, norm_weight, eps), plans) in one call (x contiguous float32 (n, k));
    the normalised rows stay inside the kernels."""
    n, k = x.shape
    if norm_weight.dtype != torch.float32 or norm_weight.shape != (k,) or not norm_weight.is_contiguous():
        raise ValueError(f"norm_matmuls needs a contiguous float32 ({k},) norm weight")
    ys, args = _outputs(n, plans)
    _cpu.norm_matmuls(x.data_ptr(), n, k, norm_weight.data_ptr(), float(eps), *args)
    return ys


def matmul_add(x: torch.Tensor, plan: tuple, residual: torch.Tensor) -> torch.Tensor:
    """residual + x @ W.T in one call: x (n, k) contiguous float32, residual (n, out) contiguous."""
    n, k = x.shape
    if residual.dtype != torch.float32 or residual.shape != (n, plan[3]) or not residual.is_contiguous():
        raise ValueError(f"matmul_add needs a contiguous float32 ({n}, {plan[3]}) residual")
    y = torch.empty(n, plan[3], dtype=torch.float32)
    _cpu.matmul_add(x.data_ptr(), k * 4, n, k, residual.data_ptr(), plan[3], plan[0], plan[1], plan[2], plan[3],
                    y.data_ptr(), plan[3])
    return y


def norm_swiglu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, gate_plan: tuple,
                up_plan: tuple) -> torch.Tensor:
    """swiglu(*norm_matmuls(x, norm_weight, eps, [gate_plan, up_plan])) in one call: an MLP up
    to its down projection's input, (n, gate out_features); the gate and up outputs stay inside."""
    n, k = x.shape
    if norm_weight.dtype != torch.float32 or norm_weight.shape != (k,) or not norm_weight.is_contiguous():
        raise ValueError(f"norm_swiglu needs a contiguous float32 ({k},) norm weight")
    out = torch.empty(n, gate_plan[3], dtype=torch.float32)
    _cpu.norm_swiglu(x.data_ptr(), n, k, norm_weight.data_ptr(), float(eps), out.data_ptr(), *gate_plan, *up_plan)
    return out


class DecodeLayers:
    """A run of pre-norm decoder layers for one token at a time, one native call per step
    (`_cpu.decode_layers`): per layer rms_norm -> q, k, v; RoPE, the KV write and attention;
    + W_o; rms_norm -> silu(gate) * up; + W_down - the same kernels in the same order as the
    one-call-per-op path (norm_matmuls, rope_kv_attend, matmul_add, norm_swiglu, matmul_add), so
    the same hidden row bit for bit, without ~5 Python round trips a layer.

    Every pointer and size is checked here, once, and kept in an int64 table that the kernel
    trusts; the tensors are held so that the pointers stay valid. `layers`: per layer
    (attn_norm, ffn_norm, plans, k_cache, v_cache) with `plans` the 7 (ggml_type, pointer, row
    bytes, out_features, in_features) of q, k, v, o, gate, up, down, caches (n_kv_heads,
    capacity, d / dv) with contiguous rows, every layer's float32 or every layer's float16.
    block_size: the caches are pools (n_blocks, n_kv_heads, block_size, d / dv) instead (paged KV,
    every layer's of n_blocks blocks), and each run reads and writes them through a block table."""

    def __init__(self, layers, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, v_head_dim: int,
                 eps: float, scale: float | None = None, keep=(), block_size: int | None = None):
        if not layers or n_heads % n_kv_heads or head_dim % 2:
            raise ValueError("DecodeLayers: no layers, or heads not a multiple of the KV heads, or odd head_dim")
        ffn = layers[0][2][4][3]
        want = [(n_heads * head_dim, hidden), (n_kv_heads * head_dim, hidden), (n_kv_heads * v_head_dim, hidden),
                (hidden, n_heads * v_head_dim), (ffn, hidden), (ffn, hidden), (hidden, ffn)]
        fields = _cpu.decode_layer_fields()
        table = torch.zeros(len(layers), fields, dtype=torch.int64)
        capacity, kv_dtype = None, layers[0][3].dtype
        for i, (attn_norm, ffn_norm, plans, k_cache, v_cache) in enumerate(layers):
            for norm in (attn_norm, ffn_norm):
                if norm.dtype != torch.float32 or norm.shape != (hidden,) or not norm.is_contiguous():
                    raise ValueError(f"DecodeLayers: layer {i}'s norm weights must be contiguous float32 ({hidden},)")
            if len(plans) != 7 or [(p[3], p[4]) for p in plans] != want:
                raise ValueError(f"DecodeLayers: layer {i}'s weights are {[(p[3], p[4]) for p in plans]}, "
                                 f"expected (out, in) {want}")
            paged = block_size is not None  # a pool's dims: (n_blocks, heads, B, d); a cache's: (heads, capacity, d)
            for cache, dd in ((k_cache, head_dim), (v_cache, v_head_dim)):
                head, rows = cache.shape[paged:2 + paged] if cache.dim() == 3 + paged else (None, None)
                if (cache.dtype != kv_dtype or kv_dtype not in KV_ELEM_SIZES or cache.dim() != 3 + paged
                        or head != n_kv_heads or cache.shape[-1] != dd or cache.stride(-1) != 1
                        or cache.device.type != "cpu" or (paged and (rows != block_size
                                                                     or cache.shape[0] != layers[0][3].shape[0]))):
                    shape = f"(n_blocks, {n_kv_heads}, {block_size}, {dd})" if paged else f"({n_kv_heads}, capacity, {dd})"
                    raise ValueError(f"DecodeLayers: layer {i}'s KV cache must be {kv_dtype} (float32 or float16) "
                                     f"{shape} with contiguous rows, like layer 0's")
            cap = min(k_cache.shape[1], v_cache.shape[1]) if not paged else k_cache.shape[0] * block_size
            capacity = cap if capacity is None else min(capacity, cap)
            row = [attn_norm.data_ptr(), ffn_norm.data_ptr()]
            for p in plans:
                row += [p[0], p[1], p[2], p[3]]
            ks, vs = k_cache.stride(), v_cache.stride()
            row += [k_cache.data_ptr(), v_cache.data_ptr(), *ks[paged:2 + paged], *vs[paged:2 + paged],
                    ks[0] if paged else 0, vs[0] if paged else 0]
            table[i] = torch.tensor(row, dtype=torch.int64)
        self.table, self.n_layers, self.capacity, self.hidden = table, len(layers), capacity, hidden
        self.block_size, self.n_blocks = block_size, (layers[0][3].shape[0] if block_size is not None else None)
        self._dims = (hidden, n_heads, n_kv_heads, head_dim, v_head_dim, ffn, float(eps),
                      float(scale if scale is not None else head_dim ** -0.5), KV_ELEM_SIZES[kv_dtype])
        self._keep = (layers, keep)  # the norms, caches and weights the table points into

    def run(self, x: torch.Tensor, pos: int, cos_q: torch.Tensor, sin_q: torch.Tensor, cos_k: torch.Tensor,
            sin_k: torch.Tensor, block_table: torch.Tensor | None = None) -> torch.Tensor:
        """x (1, hidden) float32 at position pos (its K/V written there) -> the row after the layers
        (a new tensor). RoPE tables (positions, head_dim) contiguous float32; row pos is used.
        block_table: the sequence's blocks in the pools (int32 (M,)), when made with block_size."""
        d = self._dims[3]
        if (block_table is None) != (self.block_size is None):
            raise ValueError("DecodeLayers: a block table goes with pools (block_size), and only with them")
        paged = []
        if block_table is not None:
            table = _block_table(block_table, 1, "DecodeLayers")
            paged = [table.data_ptr(), table.numel(), self.block_size, self.n_blocks]
        if not 0 <= pos < self.capacity:
            raise ValueError(f"DecodeLayers: position {pos} outside the KV cache's {self.capacity}")
        for t in (cos_q, sin_q, cos_k, sin_k):
            if t.dtype != torch.float32 or t.dim() != 2 or t.shape[1] != d or pos >= t.shape[0] or not t.is_contiguous():
                raise ValueError(f"DecodeLayers: RoPE tables must be contiguous float32 (positions > {pos}, {d})")
        if x.dtype != torch.float32 or x.shape != (1, self.hidden):
            raise ValueError(f"DecodeLayers: x must be float32 (1, {self.hidden})")
        x = x.contiguous().clone()
        off = pos * d * 4
        _cpu.decode_layers(self.table.data_ptr(), self.n_layers, x.data_ptr(), pos, cos_q.data_ptr() + off,
                           sin_q.data_ptr() + off, cos_k.data_ptr() + off, sin_k.data_ptr() + off, *self._dims, *paged)
        return x
