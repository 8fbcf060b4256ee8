"""CUDA graph capture stood in for on the CPU: everything around the capture runs, and a
"replay" re-runs the captured function into the captured output."""
from __future__ import annotations


def eager_graph_capture(monkeypatch) -> list:
    """Make DecodeGraphs capture with the stand-in; returns the outputs captured so far."""
    from tramontane.engine.runtime.cuda_graphs import DecodeGraphs

    captured = []

    def eager_capture(fn, device, pool):
        out = fn()
        captured.append(out)
        return (lambda: out.copy_(fn())), out

    monkeypatch.setattr(DecodeGraphs, "capture", staticmethod(eager_capture))
    return captured
