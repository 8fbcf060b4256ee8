"""CUDA graphs of the one-token decode step: capture per key-length bucket, replay per token."""
from __future__ import annotations

import torch


def capture_cuda_graph(fn, device: torch.device, pool):
    """Warm fn up on a side stream (Triton compiles / autotunes there, outside the capture),
    then capture one call into a CUDA graph. Returns (replay, output tensor)."""
    with torch.cuda.device(device):  # a segment on a second GPU captures on that GPU
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
    """CUDA graphs of `decode_static`, one per (GPU segment, key bucket), for one cache (stored
    on it; they bind its tensors' addresses, and go when the cache goes — no reference back).

    Inputs live in static buffers (each segment's input row and position) read at replay; the
    embedding lookup runs eagerly before replay (row dequantization builds small host
    tensors). On a split model, CPU segments run eagerly between the GPU segments' replays;
    copying a row into the next segment's buffer is the boundary's one copy. Graphs of one GPU
    share one memory pool: they never run concurrently and the logits are cloned right after
    each replay, so the pool's reuse of intermediate memory is safe."""

    capture = staticmethod(capture_cuda_graph)

    @staticmethod
    def graphed(segment) -> bool:
        """Segments replayed from graphs: the GPU ones (CPU segments run eagerly between)."""
        return segment.device.type == "cuda"

    def __init__(self, model):
        self.model = model
        self.inputs = [(torch.zeros(1, model.cfg.hidden, dtype=seg.dtype, device=seg.device),
                        torch.zeros(1, dtype=torch.long, device=seg.device)) for seg in model.segments]
        self.graphs: dict[tuple[int, int], tuple] = {}  # (segment, bucket) -> (replay, out)
        self.pools = {seg.device: torch.cuda.graph_pool_handle()
                      for seg in model.segments if seg.device.type == "cuda"}
        self.rope = model.rope  # graphs read these tables' memory: keep them alive, notice a rebuild

    def run(self, cache, token_id: int, pos: int) -> torch.Tensor:
        model = self.model
        bucket = model.decode_bucket(pos + 1, cache.capacity)
        if self.rope is not model.rope:  # tables rebuilt for a longer cache: recapture
            self.graphs.clear()
            self.rope = model.rope
        x = model.embed([token_id])
        last = len(model.segments) - 1
        graphed = [self.graphed(seg) for seg in model.segments]
        if not any(graphed):  # a CPU-only model here is a test's stand-in: every segment "captured"
            graphed = [True] * len(graphed)
        for k, seg in enumerate(model.segments):
            row, at = self.inputs[k]
            row.copy_(x)
            if not graphed[k]:
                x = model.run_segment(seg, row, pos, cache)
                x = model._logits(x)[0] if k == last else x
                continue
            at.fill_(pos)
            if (k, bucket) not in self.graphs:
                self.graphs[(k, bucket)] = self.capture(
                    lambda k=k, row=row, at=at: model.decode_static(row, at, cache, bucket, k),
                    seg.device, self.pools.get(seg.device))
            replay, out = self.graphs[(k, bucket)]
            replay()
            x = out
        return x.clone() if (k, bucket) in self.graphs else x
