"""CUDA graphs of the one-token decode step: captured for a capped set of key-length buckets
when a cache is made (load time), replayed per token; a bucket whose capture failed runs eagerly."""
from __future__ import annotations

import torch

from .memory import bucket_for, decode_buckets


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

    `capture_all` runs once, when the cache is made: every bucket of `decode_buckets(capacity)`
    (a capped set), so nothing is captured in the middle of a reply. A capture that fails is
    recorded in `failures` (bucket and reason, reported once by the caller) and that bucket
    alone runs `decode_static` eagerly; the other buckets keep their graphs.

    Inputs live in static buffers (each segment's input row and position, the token id on the
    embedding's device) written before a replay: the embedding row is gathered and dequantized
    on its device from that id (no host tensor per token). On a split model, CPU segments run
    eagerly between the GPU segments' replays; copying a row into the next segment's buffer is
    the boundary's one copy. Graphs of one GPU share one memory pool: they never run
    concurrently and the logits are cloned right after each replay, so the pool's reuse of
    intermediate memory is safe."""

    capture = staticmethod(capture_cuda_graph)

    @staticmethod
    def graphed(segment) -> bool:
        """Segments replayed from graphs: the GPU ones (CPU segments run eagerly between)."""
        return segment.device.type == "cuda"

    def __init__(self, model):
        self.model = model
        self.inputs = [(torch.zeros(1, model.cfg.hidden, dtype=seg.dtype, device=seg.device),
                        torch.zeros(1, dtype=torch.long, device=seg.device)) for seg in model.segments]
        self.token = torch.zeros(1, dtype=torch.long, device=model.embedding_device)
        self.graphs: dict[tuple[int, int], tuple] = {}  # (segment, bucket) -> (replay, out)
        self.failures: dict[tuple[int, int], str] = {}  # (segment, bucket) -> why it runs eagerly
        self.pools = {seg.device: torch.cuda.graph_pool_handle()
                      for seg in model.segments if seg.device.type == "cuda"}
        # Graphs read these tables' memory: hold every segment's, so a later rebuild for a
        # longer cache elsewhere frees nothing they read (the first positions are unchanged).
        self.ropes = [seg.rope for seg in model.segments]

    def _graphed(self) -> list[bool]:
        graphed = [self.graphed(seg) for seg in self.model.segments]
        if not any(graphed):  # a CPU-only model here is a test's stand-in: every segment "captured"
            graphed = [True] * len(graphed)
        return graphed

    def capture_all(self, cache) -> list[str]:
        """Capture every (graphed segment, bucket) for this cache; returns one message per
        failure, naming the segment's device, the bucket and the reason."""
        model = self.model
        self.ropes = [seg.rope for seg in model.segments]
        messages = []
        for bucket in decode_buckets(cache.capacity):
            for k, (seg, graphed) in enumerate(zip(model.segments, self._graphed())):
                if not graphed:
                    continue
                row, at = self.inputs[k]
                at.fill_(0)
                try:
                    self.graphs[(k, bucket)] = self.capture(
                        lambda k=k, row=row, at=at, bucket=bucket: model.decode_static(row, at, cache, bucket, k),
                        seg.device, self.pools.get(seg.device))
                except Exception as exc:  # noqa: BLE001 - that bucket runs eagerly, the rest keep graphs
                    messages.append(self._fail(k, bucket, exc, "capture"))
        return messages

    def _fail(self, k: int, bucket: int, exc: BaseException, what: str) -> str:
        seg = self.model.segments[k]
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        self.failures[(k, bucket)] = reason
        self.graphs.pop((k, bucket), None)
        return (f"CUDA graph {what} failed for decode bucket {bucket} (keys) of layers "
                f"{seg.layers.start}-{seg.layers.stop - 1} on {seg.name}: {reason}; that bucket decodes "
                f"without a graph (slower), the others keep theirs")

    def run(self, cache, token_id: int, pos: int) -> torch.Tensor:
        model = self.model
        bucket = bucket_for(pos + 1, cache.capacity)  # one of the buckets capture_all captured
        self.token.fill_(token_id)  # a scalar kernel argument, not a host-to-device copy
        x = model.embedding(self.token)
        last = len(model.segments) - 1
        replayed = False
        for k, (seg, graphed) in enumerate(zip(model.segments, self._graphed())):
            row, at = self.inputs[k]
            row.copy_(x)
            if not graphed:
                x = model.run_segment(seg, row, [(cache, pos, 1)])
                x = model.output_logits(x)[0] if k == last else x
                replayed = False
                continue
            at.fill_(pos)
            graph = self.graphs.get((k, bucket))
            if graph is None:  # its capture failed at load: this bucket runs eagerly
                x = model.decode_static(row, at, cache, bucket, k)
                replayed = False
                continue
            replay, out = graph
            replay()
            x = out
            replayed = True
        return x.clone() if replayed else x
