"""The one memory accounting (what a model costs on a device, stage by stage), GPU memory
counted without creating CUDA contexts, and giving freed heap memory back to the OS.

The planner (device_map.py) adds these terms per device; the loader takes the plan's context
and allocates nothing the plan did not count. Terms, per device:
  resident   weights, KV for the chosen context, the tables and vision tower placed there,
             cuBLAS workspace and the CUDA graph pool (GPUs)
  load       the weights while loading, plus one fused copy in flight (QKV / gate+up)
  vision     one image batch through the tower (its rows, attention scratch O(patches x head))
  prefill    one prompt chunk (its rows, attention scratch O(rows x head_dim), the dequantized
             weight chunk of a multi-row matmul, one row of logits)
  decode     one row through the layers and the logits (inside the graph pool on a GPU)
A stage's peak is resident (without what is not there yet at load) plus its own term: stages
never overlap (an image is encoded before its prompt is prefilled).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

# The prompt rows of one forward pass are the model's (its forward runs a prompt in chunks of them)
from ..mistral3.config import CPU_PREFILL_CHUNK, PREFILL_CHUNK

MiB = 1 << 20
GiB = 1 << 30

DEFAULT_CONTEXT = 4096  # positions of KV the default plan budgets (mistral.rs's default)
# Left free on a GPU beyond every counted term: the CUDA context and kernel images of this
# process (free memory is read before our context exists, see gpu_free_memory), allocator
# rounding and fragmentation, the desktop's own use.
CUDA_HEADROOM_BYTES = 1 << 30
CPU_HEADROOM_BYTES = 2 * GiB  # the OS, this app (Python, Qt), other programs' growth
# torch's cuBLAS workspace: up to 32 MiB per (stream, handle) on Hopper and newer; the decode
# graphs are captured on a side stream, so two.
CUBLAS_WORKSPACE_BYTES = 64 * MiB
# The decode graphs of one GPU share one memory pool: one step's intermediates (a row per
# layer, the attention's scores over a bucket, split-K partial sums) rounded up to the caching
# allocator's 2 MiB segments, plus one logits row per bucket. A bound, checked on a GPU by
# scripts/device_check.sh (planned against measured).
GRAPH_POOL_BYTES = 96 * MiB
MIN_DECODE_BUCKET = 256
MAX_GRAPH_BUCKETS = 6  # decode buckets captured at load (256 .. 8192 keys; larger contexts
                       # start at a larger first bucket, see decode_buckets)


def decode_buckets(capacity: int) -> list[int]:
    """Key lengths the decode graphs are captured for: powers of two from MIN_DECODE_BUCKET,
    the last one the cache's capacity; at most MAX_GRAPH_BUCKETS (the smallest dropped)."""
    out, b = [], MIN_DECODE_BUCKET
    while b < capacity:
        out.append(b)
        b *= 2
    out.append(capacity)
    return out[-MAX_GRAPH_BUCKETS:]


def bucket_for(n_keys: int, capacity: int) -> int:
    """The smallest captured bucket holding n_keys keys (decode_buckets' set, never another)."""
    for b in decode_buckets(capacity):
        if b >= n_keys:
            return b
    return capacity


# The CPU KV cache's element types (LocalEngine(kv_type=...), --kv-type) and their bytes: float32 by
# default; float16 halves the KV memory and the bytes a long context's decode step reads (the
# attention math stays float32). GPU segments keep their own compute dtype.
KV_TYPE_BYTES = {"f32": 4, "f16": 2}


def kv_type_bytes(kv_type: str) -> int:
    """Bytes of one CPU KV element for a kv_type; ValueError naming the choices for another."""
    if kv_type not in KV_TYPE_BYTES:
        raise ValueError(f"KV type {kv_type!r} is not one of {', '.join(KV_TYPE_BYTES)}")
    return KV_TYPE_BYTES[kv_type]


def kv_bytes(tokens: int, kv_width: int, n_layers: int, value_bytes: int) -> int:
    """K and V of `tokens` positions over `n_layers` layers (kv_width = kv_heads x (k + v dims))."""
    return tokens * kv_width * n_layers * value_bytes


def prefill_rows(tokens: int, device_kind: str) -> int:
    return min(tokens, PREFILL_CHUNK if device_kind == "cuda" else CPU_PREFILL_CHUNK)


def prefill_activation_bytes(rows: int, row_width: int, value_bytes: int) -> int:
    return rows * row_width * value_bytes


def attention_scratch_bytes(rows: int, n_heads: int, head_dim: int) -> int:
    """Flash attention's float32 state per query row and head: the output accumulator and the
    running max / sum (no rows x keys scores are ever held)."""
    return rows * n_heads * (head_dim + 2) * 4


# Streaming multiprocessors assumed when a plan is made for a GPU not yet opened (the split
# attention's partials grow with them): above the largest data-centre parts of today (132-148).
GPU_SM_BOUND = 160


def gpu_attention_scratch_bytes(rows: int, n_heads: int, n_kv_heads: int, v_head_dim: int, value_bytes: int) -> int:
    """The CUDA flash attention's own bound for one prefill call (kernels.attention.scratch_bytes:
    its output, and float32 split partials bounded by the SM count; never rows x keys). Plain
    arithmetic: importable without Triton (triton_compat's stand-ins)."""
    from ...kernels.attention import scratch_bytes

    return scratch_bytes(rows, n_heads, n_kv_heads, v_head_dim, value_bytes, GPU_SM_BOUND)


def decode_scratch_bytes(n_heads: int, bucket: int, vocab: int, row_width: int, value_bytes: int) -> int:
    """One decode step: a layer's row, the scores of one bucket, the logits (f32)."""
    return row_width * value_bytes + n_heads * bucket * 4 + 2 * vocab * 4


def logits_bytes(vocab: int, rows: int = 1) -> int:
    return 2 * rows * vocab * 4  # the head's output and its float32 copy


def matmul_scratch_bytes() -> int:
    """The dequantized weight rows a multi-row quantized matmul may hold (kernels.linear)."""
    from ...kernels.linear import PREFILL_CHUNK_BYTES

    return PREFILL_CHUNK_BYTES


def vision_tower_bytes(file_bytes: int, float_values: int, float_file_bytes: int, value_bytes: int) -> int:
    """What the vision tower keeps on a device off the CPU: its file's tensors, except its float
    matrices (F32/F16/BF16: `float_values` values, `float_file_bytes` in the file), which the
    loader converts once to the tower's matmul dtype (`value_bytes` a value, vision.in_dtype)."""
    return file_bytes - float_file_bytes + float_values * value_bytes


def vision_stage_bytes(patches: int, row_width: int, n_heads: int, head_dim: int, value_bytes: int) -> int:
    """One image through the tower: its rows (float32 residual + compute-dtype matmuls) and
    the attention's per-row state."""
    return patches * row_width * value_bytes + attention_scratch_bytes(patches, n_heads, head_dim)


# ----------------------------------------------------------------------------- GPU memory

def gpu_free_memory() -> list[tuple[int, int, str, bool, str, tuple[int, int]]]:
    """(free, total, name, integrated, how, compute capability) of every CUDA device torch sees,
    in torch's order, without creating a CUDA context on any of them: free memory from NVML
    (nvidia-ml-py), matched to torch's devices by UUID; where NVML is missing,
    torch.cuda.mem_get_info only on devices this process already uses, and the total elsewhere
    (said in `how`). The capability decides the vision tower's dtype (host.cuda_has_bf16)."""
    import torch

    if not torch.cuda.is_available():
        return []
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    nvml = _nvml_free_by_uuid()
    out = []
    for i, p in enumerate(props):
        integrated = bool(getattr(p, "is_integrated", False))
        uuid = str(getattr(p, "uuid", "")).lower().removeprefix("gpu-")
        capability = (int(p.major), int(p.minor))
        if uuid and uuid in nvml:
            out.append((nvml[uuid], int(p.total_memory), p.name, integrated, "nvml", capability))
        elif torch.cuda.is_initialized() and torch.cuda.memory_reserved(i) > 0:
            free, total = torch.cuda.mem_get_info(i)  # a context exists there already
            out.append((int(free), int(total), p.name, integrated, "torch", capability))
        else:
            out.append((int(p.total_memory), int(p.total_memory), p.name, integrated, "total (free unknown)",
                        capability))
    return out


def _nvml_free_by_uuid() -> dict[str, int]:
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver library, no permission: fall back
        return {}
    out = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = (uuid.decode() if isinstance(uuid, bytes) else uuid).lower().removeprefix("gpu-")
            out[uuid] = int(pynvml.nvmlDeviceGetMemoryInfo(h).free)
    except Exception:  # noqa: BLE001
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


# ----------------------------------------------------------------------------- host heap
# (free RAM: engine/host.py, read by the loader below runtime too)

def release_freed_heap() -> bool:
    """malloc_trim(0) where the C library is glibc: the temporaries of building a tokenizer and
    loading a model (tens of MB, freed but held by malloc) stop counting as resident. A no-op
    elsewhere; True when it ran."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only (not musl)
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
