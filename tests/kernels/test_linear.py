"""kernels/linear.py's own decisions, on every CPU variant and on the exact path: which path a
weight takes, the float32 switch and its restore, `linear` against a float64 matmul of gguf.quants'
dequantization (the reference nobody here wrote), `linears` and `linear_add` the same numbers as
`linear`, the CUDA kernel choice by rows and dtype, and one-sentence errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.quant_bytes import gguf_dequantized, random_quant_bytes
from tramontane.kernels import cpu_native, ggml_types as gt
from tramontane.kernels import linear as lin
from tramontane.kernels.linear import QWeight, linear, linear_add, linears
from support.cpu_kernels import cpu_exact

TYPES = [gt.Q4_0, gt.Q8_0, gt.Q4_K, gt.Q6_K, gt.F16]
PATHS = [*(f"native-{v}" for v in (cpu_native.variants() if cpu_native.AVAILABLE else [])), "exact"]


@pytest.fixture
def cpu_path(request, restore_cpu_kernel_settings):
    path = request.param
    if path == "exact":
        with cpu_exact():
            yield path
        return
    cpu_native.use_variant(path.removeprefix("native-"))
    with cpu_exact(False):
        yield path


def weight(ggml_type: int, shape: tuple[int, int], seed: int) -> tuple[QWeight, torch.Tensor]:
    """A random valid weight and its gguf.quants dequantization in float64."""
    rng = np.random.default_rng(seed)
    if ggml_type == gt.F16:
        raw = (rng.standard_normal(shape) * 0.05).astype(np.float16).view(np.uint8).reshape(shape[0], -1)
    else:
        raw = random_quant_bytes(ggml_type, shape, rng)
    ref = torch.from_numpy(gguf_dequantized(raw, ggml_type, shape)).double()
    return QWeight.from_raw(torch.from_numpy(raw), ggml_type, shape), ref


def test_the_exact_switch_is_restored_and_decides_the_path():
    w, _ = weight(gt.Q8_0, (32, 64), 0)
    before = lin.is_cpu_exact()
    with cpu_exact():
        assert lin.is_cpu_exact() and not lin.native_cpu(w)
        with cpu_exact(False):
            assert not lin.is_cpu_exact()
            assert lin.native_cpu(w) == (cpu_native.AVAILABLE and cpu_native.supports(gt.Q8_0))
        assert lin.is_cpu_exact()
    assert lin.is_cpu_exact() == before
    f32 = QWeight(gt.F32, (4, 8), torch.zeros(4, 8))
    with cpu_exact(False):
        assert not lin.native_cpu(f32)  # float32 weights always go to torch


@pytest.mark.skipif(not cpu_native.AVAILABLE, reason="the native CPU kernels are not built here")
def test_the_kernel_variant_is_held_by_the_native_module_alone(restore_cpu_kernel_settings):
    """Choosing a variant and planning a weight for it rebinds no global of kernels.linear or
    kernels.cpu_native: a weight's plan names the variant it was made for, and is made again on
    another one only."""
    w, _ = weight(gt.Q4_K, (32, 256), 1)
    x = torch.randn(1, 256)
    globals_before = {m.__name__: dict(vars(m)) for m in (lin, cpu_native)}
    with cpu_exact(False):
        for name in cpu_native.variants():
            cpu_native.use_variant(name)
            linear(x, w)
            assert w._native_variant == name
            plan = w._native
            cpu_native.use_variant(name)
            linear(x, w)
            assert w._native is plan  # the same variant again: the same plan
    globals_after = {m.__name__: dict(vars(m)) for m in (lin, cpu_native)}
    assert {m: set(g) for m, g in globals_after.items()} == {m: set(g) for m, g in globals_before.items()}
    assert [(m, n) for m, g in globals_after.items() for n, v in g.items() if v is not globals_before[m][n]] == []


@pytest.mark.parametrize("cpu_path", PATHS, indirect=True)
@pytest.mark.parametrize("ggml_type", TYPES, ids=gt.type_name)
@pytest.mark.parametrize("rows", [1, 5])
def test_linear_is_a_matmul_of_the_files_values(ggml_type, rows, cpu_path):
    w, ref = weight(ggml_type, (48, 512), ggml_type)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows), dtype=torch.float64)
    want = x @ ref.T
    got = linear(x.float(), w).double()
    # exact: float32 rounding only (6e-8 of the norms measured). Native: activations quantized
    # to int8 per block as llama.cpp does (1.05e-3 of the norms measured, avx2 and generic).
    bound = 1e-6 if cpu_path == "exact" else 3e-3
    scale = x.norm(dim=1, keepdim=True) * ref.norm(dim=1)[None, :]
    assert ((got - want).abs() / scale).max().item() < bound
    assert got.shape == (rows, 48)


@pytest.mark.parametrize("cpu_path", PATHS, indirect=True)
def test_linears_and_linear_add_are_linear_bit_for_bit(cpu_path):
    ws = [weight(t, (32, 256), i)[0] for i, t in enumerate((gt.Q4_K, gt.Q6_K, gt.Q8_0))]
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    for got, w in zip(linears(x, ws), ws):
        assert torch.equal(got, linear(x, w))
    residual = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(linear_add(x, ws[0], residual), residual + linear(x, ws[0]))


def test_cuda_kernel_choice_by_rows_and_dtype():
    assert lin.cuda_kernel_for(1, torch.bfloat16) == "decode"
    assert lin.cuda_kernel_for(2, torch.bfloat16) == "rows"
    assert lin.cuda_kernel_for(lin.FUSED_MAX_ROWS, torch.bfloat16) == "rows"
    assert lin.cuda_kernel_for(lin.FUSED_MAX_ROWS + 1, torch.bfloat16) == "dense"
    for dtype in (torch.float16, torch.float32):  # no tensor-core tiles: decode, then dense
        assert lin.cuda_kernel_for(lin.DECODE_MAX_ROWS, dtype) == "decode"
        assert lin.cuda_kernel_for(lin.DECODE_MAX_ROWS + 1, dtype) == "dense"


def test_a_mismatched_input_is_named():
    w, _ = weight(gt.Q8_0, (32, 64), 3)
    with pytest.raises(ValueError, match=r"x has 63 features, weight .* expects 64"):
        linear(torch.zeros(2, 63), w)
