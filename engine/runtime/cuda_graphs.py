"""CUDA graphs of the one-token decode step: capture per key-length bucket, replay per token."""
from __future__ import annotations

import torch


def capture_cuda_graph(fn, device: torch.device, pool):
    """Warm fn up on a side stream (Triton compiles / autotunes there, outside the capture),
    then capture one call into a CUDA graph. Returns (replay, output tensor)."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph.replay, out


class DecodeGraphs:
    """CUDA graphs of `decode_static`, one per key bucket, for one cache (stored on it; they
    bind its tensors' addresses, and go when the cache goes — no reference back to it).

    Inputs live in static buffers (the input row and the position) read at replay; the
    embedding lookup runs eagerly before replay (row dequantization builds small host
    tensors). Graphs share one memory pool: they never run concurrently and the logits are
    cloned right after each replay, so the pool's reuse of intermediate memory is safe."""

    capture = staticmethod(capture_cuda_graph)

    def __init__(self, model):
        self.model = model
        dev = model.device
        self.x = torch.zeros(1, model.cfg.hidden, dtype=model.dtype, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple] = {}  # bucket -> (replay, out)
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self.rope = model.rope  # graphs read these tables' memory: keep them alive, notice a rebuild

    def run(self, cache, token_id: int, pos: int) -> torch.Tensor:
        model = self.model
        self.x.copy_(model.embed([token_id]))
        self.pos.fill_(pos)
        bucket = model.decode_bucket(pos + 1, cache.capacity)
        if self.rope is not model.rope:  # tables rebuilt for a longer cache: recapture
            self.graphs.clear()
            self.rope = model.rope
        if bucket not in self.graphs:
            self.graphs[bucket] = self.capture(
                lambda: model.decode_static(self.x, self.pos, cache, bucket), model.device, self.pool)
        replay, out = self.graphs[bucket]
        replay()
        return out.clone()
