"""CUDA graphs of the decode step: captured for a capped set of (rows, key length) buckets when a
KV pool is made (load time), replayed for every step whose rows are all decode rows, the lone
reply's and the batched streams'; a bucket whose capture failed runs eagerly."""
from __future__ import annotations

import torch

from .memory import bucket_for, decode_buckets

# Rows a decode graph is captured for (a step of R sequences replays the smallest bucket >= R).
ROW_BUCKETS = (1, 2, 4, 8, 16)


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
    """CUDA graphs of `decode_static`, one per (GPU segment, row bucket, key bucket), for one KV
    pool (stored on it; they bind its tensors' addresses, and go when the pool goes).

    A decode step of R sequences (R rows, each at its own position through its own block table)
    replays the graph of the smallest row bucket >= R (`ROW_BUCKETS`, capped at `max_rows`; the
    extra rows are padding at position -1) and the smallest key bucket holding the longest row:
    the lone reply and the batched streams replay the same graphs. `capture_all` runs once, when
    the pool is made, so nothing is captured in the middle of a reply. A capture that fails is
    recorded in `failures` (reported once by the caller) and that graph alone runs
    `decode_static` eagerly; the others keep theirs.

    Inputs live in static buffers (each segment's input rows, positions and block tables; the
    token ids on the embedding's device) written before a replay. On a split model, CPU segments
    run eagerly between the GPU segments' replays. Graphs of one GPU share one memory pool: they
    never run concurrently and the logits are cloned right after each replay."""

    capture = staticmethod(capture_cuda_graph)

    @staticmethod
    def graphed(segment) -> bool:
        """Segments replayed from graphs: the GPU ones (CPU segments run eagerly between)."""
        return segment.device.type == "cuda"

    def __init__(self, model, capacity: int, block: int, max_rows: int = ROW_BUCKETS[-1]):
        self.model = model
        self.capacity = capacity  # the longest sequence's positions (key buckets up to it)
        self.block = block
        self.width = -(-capacity // block)  # block-table entries of the longest sequence
        self.row_buckets = [r for r in ROW_BUCKETS if r <= max_rows] or [1]
        self.inputs = {(k, r): (torch.zeros(r, model.cfg.hidden, dtype=seg.dtype, device=seg.device),
                                torch.full((r,), -1, dtype=torch.long, device=seg.device),
                                torch.zeros(r, self.width, dtype=torch.int32, device=seg.device))
                       for k, seg in enumerate(model.segments) for r in self.row_buckets}
        self.tokens = {r: torch.zeros(r, dtype=torch.long, device=model.embedding_device) for r in self.row_buckets}
        self.graphs: dict[tuple[int, int, int], tuple] = {}  # (segment, rows, keys) -> (replay, out)
        self.failures: dict[tuple[int, int, int], str] = {}  # (segment, rows, keys) -> why it runs eagerly
        self.pools = {seg.device: torch.cuda.graph_pool_handle()
                      for seg in model.segments if seg.device.type == "cuda"}
        # Graphs read these tables' memory: hold every segment's, so a later rebuild for a
        # longer context elsewhere frees nothing they read (the first positions are unchanged).
        self.ropes = [seg.rope for seg in model.segments]

    def _graphed(self) -> list[bool]:
        graphed = [self.graphed(seg) for seg in self.model.segments]
        if not any(graphed):  # a CPU-only model here is a test's stand-in: every segment "captured"
            graphed = [True] * len(graphed)
        return graphed

    def capture_all(self, cache) -> list[str]:
        """Capture every (graphed segment, row bucket, key bucket) over `cache`'s pool; returns one
        message per failure, naming the segment's device, the buckets and the reason."""
        model = self.model
        self.ropes = [seg.rope for seg in model.segments]
        messages = []
        for rows in self.row_buckets:
            for bucket in decode_buckets(self.capacity):
                for k, (seg, graphed) in enumerate(zip(model.segments, self._graphed())):
                    if not graphed:
                        continue
                    x, at, tables = self.inputs[(k, rows)]
                    at.fill_(-1)
                    try:
                        self.graphs[(k, rows, bucket)] = self.capture(
                            lambda k=k, x=x, at=at, tables=tables, bucket=bucket:
                            model.decode_static(x, at, tables, cache, bucket, k),
                            seg.device, self.pools.get(seg.device))
                    except Exception as exc:  # noqa: BLE001 - that graph runs eagerly, the rest keep theirs
                        messages.append(self._fail(k, rows, bucket, exc, "capture"))
        return messages

    def _fail(self, k: int, rows: int, bucket: int, exc: BaseException, what: str) -> str:
        seg = self.model.segments[k]
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        self.failures[(k, rows, bucket)] = reason
        self.graphs.pop((k, rows, bucket), None)
        return (f"CUDA graph {what} failed for decode bucket {bucket} (keys) x {rows} rows of layers "
                f"{seg.layers.start}-{seg.layers.stop - 1} on {seg.name}: {reason}; that bucket decodes "
                f"without a graph (slower), the others keep theirs")

    def fits(self, n_rows: int) -> bool:
        return n_rows <= self.row_buckets[-1]

    def run(self, caches, token_ids) -> torch.Tensor:
        """One decode row for each sequence (its KV at its length, blocks reserved by the caller):
        float32 logits (R, vocab). Lengths are left to the caller."""
        model = self.model
        R = len(caches)
        rows = next(r for r in self.row_buckets if r >= R)
        bucket = bucket_for(max(c.length for c in caches) + 1, self.capacity)
        # Inputs written on the devices: fills with scalars, and each sequence's table copied from
        # its device copy (made once per new block): no host tensor per token.
        tokens = self.tokens[rows]
        for r in range(rows):
            tokens[r].fill_(int(token_ids[r]) if r < R else 0)
        x = model.embedding(tokens)
        last = len(model.segments) - 1
        replayed = False
        for k, (seg, graphed) in enumerate(zip(model.segments, self._graphed())):
            buf, at, tables = self.inputs[(k, rows)]
            buf.copy_(x)
            for r in range(rows):
                at[r].fill_(caches[r].length if r < R else -1)
            for r, c in enumerate(caches):
                tables[r, :len(c.blocks)].copy_(c.table(seg.device))
            if not graphed:
                x = model.run_segment(seg, buf[:R], [(c, c.length, 1) for c in caches])
                if R < rows:
                    x = torch.cat([x, x.new_zeros(rows - R, x.shape[1])])
                x = model.output_logits(x) if k == last else x
                replayed = False
                continue
            graph = self.graphs.get((k, rows, bucket))
            if graph is None:  # its capture failed at load: this bucket runs eagerly
                x = model.decode_static(buf, at, tables, caches[0], bucket, k)
                replayed = False
                continue
            replay, out = graph
            replay()
            x = out
            replayed = True
        return x[:R].clone() if replayed else x[:R]
