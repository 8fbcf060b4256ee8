"""CPU threads: the one place their counts are set. The CLI (--threads), Settings' "CPU
threads", a LocalEngine's load and the benchmarks all come here.

The rule:
- The layers on the CPU run on the native kernels' thread pool (kernels/cpu_native.py): `n`
  threads, by default one per physical core this process may use (`TRAMONTANE_THREADS=n`
  changes the default). The UI thread needs no core kept for it: the pool's idle workers sleep
  after ~0.5 ms, and the calling thread takes work units too.
- torch's intra-op threads: 1 while the native kernels are built (`TRAMONTANE_TORCH_THREADS=n`
  keeps n). The pool owns the cores; torch's OpenMP workers spinning beside it made RMSNorm and
  RoPE 20x slower on 2 cores, and nothing large is left on torch in a CPU pass. Without the
  native kernels torch does the CPU work and gets the `n` threads.
"""
from __future__ import annotations

from ...env import read_env


def torch_threads_beside_the_pool() -> int:
    """torch's intra-op threads while the native pool runs: 1, or TRAMONTANE_TORCH_THREADS."""
    return read_env().torch_threads or 1


def apply_threads(n: int | None = None) -> int:
    """Use `n` CPU threads (None: one per physical core, or TRAMONTANE_THREADS) by the rule
    above; returns the count the CPU work now runs on."""
    import torch

    from ...kernels import cpu_native

    if cpu_native.AVAILABLE:
        count = cpu_native.set_threads(n)
        torch.set_num_threads(torch_threads_beside_the_pool())
        return count
    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def settle_torch_threads() -> None:
    """torch's share by the rule, leaving the pool's count as configured: called when a model
    loads, so the first native call finds torch out of the pool's way."""
    import torch

    from ...kernels import cpu_native

    if cpu_native.AVAILABLE:
        torch.set_num_threads(torch_threads_beside_the_pool())
