import os

import torch

# The Triton interpreter is read when kernels are decorated, so it must be set before any
# kernels module is imported. With a GPU the real compiler runs instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# Tests run the kernels without a LocalEngine: torch's threads as the engine sets them beside the
# native pool (runtime/threads.py), so timings and the ops' thread counts are the engine's.
from tramontane.engine.runtime.threads import settle_torch_threads  # noqa: E402

settle_torch_threads()

from support import FIXTURES  # noqa: E402,F401  (kept importable from conftest)


import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_variants: run once per native CPU kernel variant this CPU can force "
        "(avx512vnni, avx2, generic, neon...), so a variant-specific failure shows on any machine")


def pytest_generate_tests(metafunc):
    """Tests marked cpu_variants take a `cpu_variant` parameter: every variant cpu_native.variants()
    lists here (one run, "default", where the native module is not built)."""
    if metafunc.definition.get_closest_marker("cpu_variants") is None:
        return
    from tramontane.kernels import cpu_native

    if "cpu_variant" not in metafunc.fixturenames:
        metafunc.fixturenames.append("cpu_variant")
    metafunc.parametrize("cpu_variant", cpu_native.variants() or ["default"], indirect=True)


@pytest.fixture
def cpu_variant(request):
    """The forced variant for this test (the one in use before is restored after)."""
    from tramontane.kernels import cpu_native

    name = request.param
    if name == "default":
        yield name
        return
    before = cpu_native.variant()
    cpu_native.use_variant(name)
    try:
        yield name
    finally:
        cpu_native.use_variant(before)


@pytest.fixture
def float32_cpu_path():
    """For tests that compare against float references at float32 tolerances: the CPU runs the
    float32 torch path. The native kernels (int8 activations, llama.cpp's method) are tested
    against gguf.quants + float64 in tests/kernels/test_cpu_native.py and end to end in
    tests/engine/mistral3/test_text_cpu_native.py."""
    from tramontane.kernels.linear import cpu_exact

    with cpu_exact():
        yield
