"""What this machine can give us now: free RAM (and the RAM only this process holds), whether
its CPU has bf16 dot products, and which CUDA GPUs have bf16. Read by the model's loader
(mistral3: whether float32 weight copies fit, which path and dtype the vision tower takes), the
planner and the KV cache's check (runtime), so it sits below both."""
from __future__ import annotations

import functools
import os


def available_ram() -> int:
    """Bytes the system could give us now; 0 when unknown. MemAvailable counts reclaimable page
    cache, which matters: the memory-mapped model file itself fills the page cache."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: unknown
        return 0


def private_ram() -> int:
    """Bytes of RAM only this process holds (its anonymous and shared-memory pages), which an
    exit or an unload gives back; 0 when unknown. Not its RSS: a memory-mapped model file's
    resident pages are page cache, which `available_ram` counts as available already (adding
    them back counted a mapped 24B twice)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in fh)
                   if k in ("RssAnon", "RssShmem")}
        return sum(kib.values()) * 1024
    except (OSError, ValueError, IndexError):
        return 0


@functools.cache
def cpu_has_bf16_dot() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512_BF16 or AMX tiles), where torch's
    oneDNN bf16 matmul runs at about twice float32's rate (elsewhere it emulates bf16, slower).
    The one probe for the vision tower's CPU path (mistral3.vision) and the planner's count of
    what that tower keeps (runtime.device_map); asked once, the answer cannot change."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:
        return any(probe is not None and probe() for probe in probes)
    except Exception:  # a torch without the probes: keep float32
        return False


CUDA_BF16_CAPABILITY = (8, 0)  # Ampere: the first CUDA GPUs with bf16 units


def cuda_has_bf16(capability: tuple[int, int]) -> bool:
    """Whether a CUDA GPU of this compute capability (major, minor) has bf16 units. Older ones
    (T4 7.5, V100 7.0) run the vision tower in float32. The one rule for the tower's dtype
    (mistral3.vision.tower_dtype) and the planner's count of that tower (runtime.device_map,
    DeviceInfo.capability)."""
    return tuple(capability) >= CUDA_BF16_CAPABILITY
