"""Real llama.cpp-quantized tensors (tests/fixtures/*-llamacpp-*.gguf, read with gguf-py's own
GGUFReader): our torch reference and Triton dequantizers equal gguf.quants bit for bit."""
import glob
import os

import numpy as np
import pytest
import torch

from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import QWeight, dequantize, linear, native_cpu
from support.cpu_kernels import cpu_exact

from support import FIXTURES
from support.cpu_reference import act_block, quantize_rows
LLAMACPP_FILES = sorted(glob.glob(os.path.join(FIXTURES, "*-llamacpp-*.gguf")))
# quantized model fixtures written by other generators (random valid blocks via gguf-py)
OTHER_FILES = sorted(set(glob.glob(os.path.join(FIXTURES, "*[-_][Qq][0-9]*.gguf"))) - set(LLAMACPP_FILES))


def _tensors(path):
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize

    for t in GGUFReader(path).tensors:
        if int(t.tensor_type) not in gt.TYPES:
            continue
        shape = tuple(int(s) for s in reversed(list(t.shape)))
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        ref = gguf_dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        yield t.name, int(t.tensor_type), shape, raw, ref


def _check_file(path, triton_rows: int):
    seen = set()
    for name, ggml_type, shape, raw, ref in _tensors(path):
        seen.add(gt.type_name(ggml_type))
        ours = dequantize(raw, ggml_type, shape).numpy()
        np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32), err_msg=name)
        if len(shape) != 2:
            continue
        w = QWeight.from_raw(raw, ggml_type, shape, "cpu", name=name)
        x = torch.randn(3, shape[1], generator=torch.Generator().manual_seed(0))
        expect = x @ torch.from_numpy(ref).t()
        with cpu_exact():  # the float32 torch path
            err = float((linear(x, w) - expect).abs().max() / expect.abs().max())
        assert err <= 1e-5, (name, err)
        if native_cpu(w):  # the native kernels: int8 activations, checked against their model
            blk = act_block(ggml_type)
            q, d = quantize_rows(x.numpy(), blk)
            model = (q * d) @ ref.astype(np.float64).T
            scale = np.abs(q * d) @ np.abs(ref.astype(np.float64)).T + 1e-30
            rel = float((np.abs(linear(x, w).numpy() - model) / scale).max())
            assert rel <= 1e-5, (name, rel)
        if triton_rows and w.is_quantized and (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()):
            from tramontane.kernels.qmatmul import dequantize_triton, linear_decode

            dev = "cuda" if torch.cuda.is_available() else "cpu"
            part = w.rows(0, min(triton_rows, shape[0])).to(dev)
            got = dequantize_triton(part).cpu().numpy()
            np.testing.assert_array_equal(got.view(np.uint32), ref[: part.shape[0]].view(np.uint32), err_msg=name)
            out = linear_decode(x[:1].to(dev), part).cpu()
            exp1 = expect[:1, : part.shape[0]]
            assert float((out - exp1).abs().max() / exp1.abs().max()) <= 1e-4, name
    return seen


@pytest.mark.skipif(not LLAMACPP_FILES, reason="no tests/fixtures/*-llamacpp-*.gguf (llama.cpp-quantized fixtures not generated)")
@pytest.mark.parametrize("path", LLAMACPP_FILES, ids=os.path.basename)
def test_llamacpp_quantized_files_dequantize_like_gguf(path):
    seen = _check_file(path, triton_rows=8)
    assert seen & {"Q4_K", "Q6_K", "Q5_K", "Q8_0"}, f"{path}: no quantized tensors found ({seen})"


@pytest.mark.skipif(not OTHER_FILES, reason="no other .gguf fixtures")
def test_other_fixture_files_dequantize_like_gguf():
    for path in OTHER_FILES:
        _check_file(path, triton_rows=0)


@pytest.mark.skipif(not LLAMACPP_FILES, reason="no tests/fixtures/*-llamacpp-*.gguf (llama.cpp-quantized fixtures not generated)")
def test_qweight_from_gguf_file():
    from tramontane.engine.gguf import open_gguf

    path = LLAMACPP_FILES[0]
    refs = {name: (t, shape, ref) for name, t, shape, _, ref in _tensors(path)}
    gf = open_gguf(path)
    checked = 0
    for name, (ggml_type, shape, ref) in refs.items():
        if len(shape) != 2:
            continue
        w = QWeight.from_gguf(gf, name, "cpu")
        assert (w.ggml_type, w.shape) == (ggml_type, shape)
        np.testing.assert_array_equal(w.dequantize().numpy().view(np.uint32), ref.view(np.uint32))
        checked += 1
    assert checked >= 5
    with pytest.raises(gt.QuantFormatError, match="no tensor 'nope'"):
        QWeight.from_gguf(gf, "nope")
