"""Decoding a model token by token: its KV pool made for the planned context (the decode graphs
of its buckets captured then, never in the middle of a reply), and one token per sequence decoded
at its length, replayed from those graphs where they were captured, eager otherwise."""
from __future__ import annotations

import logging

import torch

from ...env import read_env
from ...kernels import cpu_native
from .. import host
from ..api import EngineError
from .cuda_graphs import DecodeGraphs
from .kv_cache import BLOCK_TOKENS, KVCache, KVPool
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


def new_pool(model, positions: int, capture_graphs: bool = True, kv_type: str = "f32",
             context_length: int | None = None) -> KVPool:
    """The KV pool of `model`: blocks for `positions` positions in all (every sequence's,
    and the chats kept in it), on each segment's device; on a model with GPU segments the decode
    graphs of its (rows, keys) buckets are captured now for sequences of up to `context_length`
    positions (default: all of them), a failed bucket reported once per model
    (`model.graph_failures`) and decoded eagerly. kv_type: the CPU segments' KV elements, "f32"
    or "f16" (GPU segments keep the model's dtype either way)."""
    cfg = model.cfg
    f16 = cpu_kv_dtype(kv_type) == torch.float16  # f32: each segment's own dtype, as before
    n = int(positions)
    if n <= 0:
        raise EngineError(f"context length must be positive, got {n}")
    context = min(n, int(context_length or n), cfg.context_length)
    cpu = torch.device("cpu")
    if any(seg.device == cpu for seg in model.segments):
        need = n * model.kv_bytes_per_token(dtype=torch.float16 if f16 else None, device=cpu)
        free = host.available_ram()
        if free and need > free:
            raise EngineError(f"a KV cache of {n} tokens needs {need / 2**30:.1f} GiB, more than the "
                              f"{free / 2**30:.1f} GiB of free memory: lower the context length")
    model.ensure_rope(context)
    parts = [(len(seg.layers), torch.float16 if f16 and seg.device == cpu else seg.dtype, seg.device)
             for seg in model.segments]
    pool = KVPool(cfg.n_kv_heads, cfg.head_dim, cfg.v_head_dim, -(-n // BLOCK_TOKENS), parts)
    if capture_graphs and graphs_enabled(model):
        graphs = DecodeGraphs(model, context, pool.block)
        pool.decode_graphs = graphs
        for failure in graphs.capture_all(KVCache(pool, context)):
            if failure not in model.graph_failures:
                model.graph_failures.append(failure)
                log.warning("%s", failure)
    return pool


def new_cache(model, context_length: int | None = None, capture_graphs: bool = True,
              kv_type: str = "f32") -> KVCache:
    """One sequence's KV over a pool of its own of `context_length` positions (the planned
    context by default, capped by the file's): generate()'s, a benchmark's, a test's."""
    n = default_context_length(model) if context_length is None else int(context_length)
    if n <= 0:
        raise EngineError(f"context length must be positive, got {n}")
    n = min(n, model.cfg.context_length)
    return KVCache(new_pool(model, n, capture_graphs, kv_type), n)


@torch.inference_mode()
def decode(model, token_id: int, cache: KVCache) -> torch.Tensor:
    """Feed one token at position cache.length; float32 logits (vocab,). Through the pool's
    decode graphs when new_pool captured them (`cache.decode_graphs = None` decodes eagerly)."""
    return decode_rows(model, [token_id], [cache])[0]


@torch.inference_mode()
def decode_rows(model, token_ids, caches) -> torch.Tensor:
    """One token for each sequence at its length, in one step: float32 logits (R, vocab).
    Replayed from the pool's graphs when it has them (every row a decode row), eager otherwise."""
    for c in caches:
        if c.length >= c.capacity:
            raise EngineError(f"context full: the context length is {c.capacity} tokens")
    graphs = caches[0].decode_graphs
    if graphs is not None and graphs.fits(len(caches)) and all(c.decode_graphs is graphs for c in caches):
        for c in caches:
            c.reserve(1)
        logits = graphs.run(caches, token_ids)
        for c in caches:
            c.length += 1
        return logits
    # the ids written on the table's device (fills, not a host tensor copied over)
    tokens = torch.empty(len(caches), dtype=torch.long, device=model.embedding_device)
    for r, t in enumerate(token_ids):
        tokens[r].fill_(int(t))
    return model.forward_batch(model.embed(tokens), [(c, c.length, 1) for c in caches], list(range(len(caches))))
