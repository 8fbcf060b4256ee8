import os

import torch

# The Triton interpreter is read when kernels are decorated, so it must be set before any
# kernels module is imported. With a GPU the real compiler runs instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from support import FIXTURES  # noqa: E402,F401  (kept importable from conftest)


import pytest  # noqa: E402


@pytest.fixture
def float32_cpu_path():
    """For tests that compare against float references at float32 tolerances: the CPU runs the
    float32 torch path. The native kernels (int8 activations, llama.cpp's method) are tested
    against gguf.quants + float64 in tests/kernels/test_cpu_native.py and end to end in
    tests/engine/mistral3/test_text_cpu_native.py."""
    from tramontane.kernels.linear import cpu_exact

    with cpu_exact():
        yield
