"""CPU threads for the layers that run on the CPU: the native kernels' pool, or torch's own
threads when the native kernels are not built. One setting for the CLI (--threads) and the app."""
from __future__ import annotations


def apply_threads(n: int | None) -> int:
    """Use `n` threads (None: one per physical core, or TRAMONTANE_THREADS); returns the count."""
    from ...kernels import cpu_native

    if cpu_native.AVAILABLE:
        return cpu_native.set_threads(n)
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()
