"""The KV cache of one sequence: preallocated keys/values per layer (one pair of tensors per
segment of a split model) and truncation. KV outside it lives in the prefix cache's blocks
(runtime/prefix_cache.py)."""
from __future__ import annotations

import math
import mmap
from typing import Sequence

import torch

from ..api import EngineError


def _untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros; on the CPU from an anonymous mapping, whose pages the OS zero-fills on first write,
    so a KV cache becomes resident as positions are written (8192 tokens of the 1.1B bench
    model: 0.5 GB that torch.zeros would commit up front by writing every byte)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    if hasattr(mmap, "MAP_PRIVATE"):  # private: reading an unwritten page commits nothing either
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # Windows: pagefile-backed, committed page by page as it is touched
        buf = mmap.mmap(-1, nbytes)
    return torch.frombuffer(buf, dtype=dtype).view(shape)  # the tensor keeps the map


class KVCache:
    """Preallocated keys/values for one sequence: (layers, kv_heads, capacity, head_dim).

    A split model gives one such pair of tensors per segment (`parts`: (layers, dtype, device)
    in layer order); `layer_k[i]` / `layer_v[i]` are the per-layer views every step uses.
    Positions [0, length) are valid. Zero-initialised so masked-out slots are finite (a NaN
    there would leak through 0 * NaN in attention)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, v_head_dim: int,
                 capacity: int, dtype: torch.dtype, device: torch.device,
                 parts: Sequence[tuple[int, torch.dtype, torch.device]] | None = None):
        if capacity <= 0:
            raise EngineError(f"context length must be positive, got {capacity}")
        parts = parts or [(n_layers, dtype, device)]
        self.ks = [_untouched_zeros((n, n_kv_heads, capacity, head_dim), dt, dev) for n, dt, dev in parts]
        self.vs = [_untouched_zeros((n, n_kv_heads, capacity, v_head_dim), dt, dev) for n, dt, dev in parts]
        self.layer_k = [layer for k in self.ks for layer in k]
        self.layer_v = [layer for v in self.vs for layer in v]
        self.length = 0
        # the native whole-step decode over these tensors, per segment (made by the model on first use)
        self.native_steps: dict = {}
        self.decode_graphs = None  # CUDA graphs bound to these tensors (runtime.decoder.new_cache captures them)

    @property
    def k(self) -> torch.Tensor:
        """All layers' keys (a cache of one part)."""
        if len(self.ks) != 1:
            raise AttributeError("a split KV cache has one tensor per segment: use ks / layer_k")
        return self.ks[0]

    @property
    def v(self) -> torch.Tensor:
        if len(self.vs) != 1:
            raise AttributeError("a split KV cache has one tensor per segment: use vs / layer_v")
        return self.vs[0]

    @property
    def capacity(self) -> int:
        return self.ks[0].shape[2]

    @property
    def device(self) -> torch.device:
        return self.ks[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.ks[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.ks + self.vs)

    def truncate(self, n: int) -> None:
        """Forget every position from n on (n <= length)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a KV cache of length {self.length} to {n}")
        self.length = n

    def reset(self) -> None:
        self.length = 0
