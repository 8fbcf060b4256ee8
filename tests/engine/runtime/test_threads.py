"""runtime/threads.py is the one place CPU thread counts are set: the native pool gets the
threads, torch 1 beside it (TRAMONTANE_TORCH_THREADS keeps n), torch gets them without the pool."""
import pytest
import torch

from tramontane.engine.runtime import threads
from tramontane.kernels import cpu_native


@pytest.fixture
def restore_threads():
    pool, torch_n = cpu_native.threads() if cpu_native.AVAILABLE else None, torch.get_num_threads()
    yield
    if pool is not None:
        cpu_native.set_threads(pool)
    torch.set_num_threads(torch_n)


@pytest.mark.skipif(not cpu_native.AVAILABLE, reason="the native CPU kernels are not built")
def test_the_pool_gets_the_threads_and_torch_one(restore_threads, monkeypatch):
    monkeypatch.delenv("TRAMONTANE_TORCH_THREADS", raising=False)
    torch.set_num_threads(2)
    assert threads.apply_threads(3) == 3 == cpu_native.threads()
    assert torch.get_num_threads() == 1
    monkeypatch.setenv("TRAMONTANE_TORCH_THREADS", "2")
    cpu_native.set_threads(1)
    threads.settle_torch_threads()  # a model's load: torch's share only, the pool as configured
    assert torch.get_num_threads() == 2 and cpu_native.threads() == 1


def test_without_the_native_kernels_torch_gets_them(restore_threads, monkeypatch):
    monkeypatch.setattr(cpu_native, "AVAILABLE", False)
    assert threads.apply_threads(2) == 2 == torch.get_num_threads()
    torch.set_num_threads(2)
    threads.settle_torch_threads()
    assert torch.get_num_threads() == 2  # nothing to make room for
