"""Decoding a model token by token: its KV cache made for the planned context (the decode graphs
of its buckets captured then, never in the middle of a reply), and one token decoded at the
cache's length, replayed from those graphs where they were captured, eager otherwise."""
from __future__ import annotations

import logging

import torch

from ...env import read_env
from ...kernels import cpu_native
from .. import host
from ..api import EngineError
from .cuda_graphs import DecodeGraphs
from .kv_cache import KVCache
from .memory import DEFAULT_CONTEXT, kv_type_bytes

log = logging.getLogger(__name__)


def default_context_length(model) -> int:
    """The context the device plan budgeted (its KV was counted there, with everything else
    the model needs); without a plan DEFAULT_CONTEXT. Never more than the file's. Nothing
    here fills "what is left": a larger context is the caller's choice, planned first
    (LocalEngine(context_length=...))."""
    return min(model.planned_context or DEFAULT_CONTEXT, model.cfg.context_length)


def graphs_enabled(model) -> bool:
    """Capture decode graphs for a model with a GPU segment, unless they were turned off
    (TRAMONTANE_CUDA_GRAPHS=0)."""
    return read_env().cuda_graphs and model.on_gpu


def cpu_kv_dtype(kv_type: str) -> torch.dtype:
    """The CPU segments' KV dtype for a kv_type ("f32" / "f16"); EngineError for another, and
    for f16 where the native CPU kernels (the only path that reads a float16 cache) are missing."""
    try:
        size = kv_type_bytes(kv_type)
    except ValueError as exc:
        raise EngineError(str(exc)) from None
    if size == 4:
        return torch.float32
    if not cpu_native.AVAILABLE:
        raise EngineError("a float16 KV cache needs the native CPU kernels, which are not built here: "
                          "use kv_type f32")
    return torch.float16


def new_cache(model, context_length: int | None = None, capture_graphs: bool = True,
              kv_type: str = "f32") -> KVCache:
    """A KV cache for `model` (the planned context by default, capped by the file's); on a model
    with GPU segments the decode graphs of its buckets are captured now, a failed bucket
    reported once per model (`model.graph_failures`) and decoded eagerly. kv_type: the CPU
    segments' KV elements, "f32" or "f16" (GPU segments keep the model's dtype either way)."""
    cfg = model.cfg
    f16 = cpu_kv_dtype(kv_type) == torch.float16  # f32: each segment's own dtype, as before
    n = default_context_length(model) if context_length is None else int(context_length)
    if n <= 0:
        raise EngineError(f"context length must be positive, got {n}")
    n = min(n, cfg.context_length)
    cpu = torch.device("cpu")
    if any(seg.device == cpu for seg in model.segments):
        need = n * model.kv_bytes_per_token(dtype=torch.float16 if f16 else None, device=cpu)
        free = host.available_ram()
        if free and need > free:
            raise EngineError(f"a KV cache of {n} tokens needs {need / 2**30:.1f} GiB, more than the "
                              f"{free / 2**30:.1f} GiB of free memory: lower the context length")
    model.ensure_rope(n)
    parts = [(len(seg.layers), torch.float16 if f16 and seg.device == cpu else seg.dtype, seg.device)
             for seg in model.segments]
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.v_head_dim, n, model.dtype, model.device, parts)
    if capture_graphs and graphs_enabled(model):
        cache.decode_graphs = DecodeGraphs(model)
        for failure in cache.decode_graphs.capture_all(cache):
            if failure not in model.graph_failures:
                model.graph_failures.append(failure)
                log.warning("%s", failure)
    return cache


@torch.inference_mode()
def decode(model, token_id: int, cache: KVCache) -> torch.Tensor:
    """Feed one token at position cache.length; float32 logits (vocab,). Through the cache's
    decode graphs when new_cache captured them (drop `cache.decode_graphs` to decode eagerly)."""
    pos = cache.length
    if pos >= cache.capacity:
        raise EngineError(f"context full: the context length is {cache.capacity} tokens")
    if cache.decode_graphs is not None:
        logits = cache.decode_graphs.run(cache, token_id, pos)
        cache.length = pos + 1
        return logits
    # the id written on the table's device (a fill, not a host tensor copied over)
    token = torch.full((1,), int(token_id), dtype=torch.long, device=model.embedding_device)
    return model.forward(model.embed(token), pos, cache)
