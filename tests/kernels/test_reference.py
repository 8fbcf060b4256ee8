"""Torch reference dequantizers vs gguf-py's (an independent implementation), bit for bit."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import QWeight, dequantize, linear
from support.quant_bytes import gguf_dequantized, random_quant_bytes


# float references at float32 tolerances: the CPU's float32 path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("float32_cpu_path")


ALL_TYPES = sorted(gt.TYPES)


def test_type_table_matches_gguf():
    from gguf.constants import GGML_QUANT_SIZES

    for t, info in gt.TYPES.items():
        assert GGMLQuantizationType(t).name == info.name
        assert GGML_QUANT_SIZES[GGMLQuantizationType(t)] == (info.block_size, info.type_size)


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: gt.type_name(t))
@pytest.mark.parametrize("scale", [None, 0.02], ids=["any-finite-f16", "small-scales"])
def test_reference_dequant_bit_exact(ggml_type, scale):
    rng = np.random.default_rng(ggml_type * 7 + (scale is None))
    info = gt.type_info(ggml_type)
    shape = (7, info.block_size * 3 if info.block_size > 1 else 96)  # odd rows, several blocks
    raw = random_quant_bytes(ggml_type, shape, rng, scale=scale)
    ours = dequantize(torch.from_numpy(raw), ggml_type, shape)
    theirs = gguf_dequantized(raw, ggml_type, shape)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == shape
    assert np.isfinite(theirs).all()
    np.testing.assert_array_equal(ours.numpy().view(np.uint32), theirs.view(np.uint32))


def test_qweight_rows_cat_and_errors():
    rng = np.random.default_rng(0)
    a_raw = random_quant_bytes(gt.Q4_K, (3, 256), rng)
    b_raw = random_quant_bytes(gt.Q4_K, (5, 256), rng)
    a = QWeight.from_raw(a_raw, gt.Q4_K, (3, 256), "cpu")
    b = QWeight.from_raw(b_raw, gt.Q4_K, (5, 256), "cpu")
    ab = QWeight.cat([a, b])
    assert ab.shape == (8, 256) and ab.nbytes == 8 * 144
    torch.testing.assert_close(ab.dequantize(), torch.cat([a.dequantize(), b.dequantize()]), rtol=0, atol=0)
    torch.testing.assert_close(ab.rows(2, 6).dequantize(), ab.dequantize()[2:6], rtol=0, atol=0)
    c = QWeight.from_raw(random_quant_bytes(gt.Q6_K, (2, 256), rng), gt.Q6_K, (2, 256), "cpu")
    with pytest.raises(ValueError, match="one type"):
        QWeight.cat([a, c])
    with pytest.raises(gt.QuantFormatError, match="blk.0.attn_q.weight.*Q4_K.*needs 432 bytes"):
        QWeight.from_raw(a_raw[:-1], gt.Q4_K, (3, 256), "cpu", name="blk.0.attn_q.weight")
    with pytest.raises(gt.QuantFormatError, match="multiple of 256"):
        QWeight.from_raw(a_raw, gt.Q4_K, (6, 128), "cpu")
    with pytest.raises(gt.QuantFormatError, match="not supported"):
        QWeight.from_raw(a_raw, 16, (3, 256), "cpu")


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: gt.type_name(t))
def test_cpu_linear_matches_dequant_matmul(ggml_type, monkeypatch):
    from tramontane.kernels import linear as linear_mod

    monkeypatch.setattr(linear_mod, "PREFILL_CHUNK_BYTES", 4096)  # force several row chunks
    monkeypatch.setattr(linear_mod, "CPU_DENSE_CACHE_BYTES", 0)  # (and no dense cache)
    rng = np.random.default_rng(100 + ggml_type)
    shape = (37, 512)
    raw = random_quant_bytes(ggml_type, shape, rng)
    w = QWeight.from_raw(raw, ggml_type, shape, "cpu")
    w_ref = torch.from_numpy(gguf_dequantized(raw, ggml_type, shape))
    for rows in (1, 2, 7, 64, 300):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows)).to(dtype)
            out = linear(x, w)
            ref = x.float() @ w_ref.t()
            assert out.dtype == dtype and out.shape == (rows, shape[0])
            err = (out.float() - ref).abs().max() / ref.abs().max()
            assert err <= (1e-5 if dtype == torch.float32 else 1e-2), (rows, dtype, err)
    x3 = torch.randn(2, 3, shape[1])
    assert linear(x3, w).shape == (2, 3, shape[0])


@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K, gt.Q8_0, gt.F16, gt.BF16, gt.F32], ids=gt.type_name)
def test_embedding_gathers_dequantized_rows(ggml_type):
    """The model's token embedding (the mapped table's rows, dequantized as looked up) equals
    gguf.quants' rows; an id past the table is an IndexError, not a read past it."""
    from tramontane.engine.mistral3.weights import TokenEmbedding

    rng = np.random.default_rng(3)
    shape = (50, 256)
    raw = random_quant_bytes(ggml_type, shape, rng)
    w = QWeight.from_raw(raw, ggml_type, shape, "cpu")
    full = torch.from_numpy(gguf_dequantized(raw, ggml_type, shape))
    ids = torch.tensor([3, 0, 49, 7, 7, 12])
    out = TokenEmbedding(w, torch.float32)(ids)
    assert out.shape == (6, 256)
    assert torch.equal(out, full[ids])
    with pytest.raises(IndexError):
        TokenEmbedding(w, torch.float32)(torch.tensor([50]))


def test_cpu_dense_cache_is_bounded_and_released(monkeypatch):
    import gc

    from tramontane.kernels import linear as linear_mod

    rng = np.random.default_rng(9)
    shape = (64, 256)  # 64 KiB dense float32
    monkeypatch.setattr(linear_mod, "CPU_DENSE_CACHE_BYTES", linear_mod.DENSE_CACHE.used + 100_000)
    used0 = linear_mod.DENSE_CACHE.used
    a = QWeight.from_raw(random_quant_bytes(gt.Q4_K, shape, rng), gt.Q4_K, shape, "cpu")
    b = QWeight.from_raw(random_quant_bytes(gt.Q6_K, shape, rng), gt.Q6_K, shape, "cpu")
    x = torch.randn(2, 256)
    ya, yb = linear(x, a), linear(x, b)
    assert a._dense is not None and b._dense is None  # the second one did not fit the budget
    assert linear_mod.DENSE_CACHE.used == used0 + 64 * 256 * 4
    torch.testing.assert_close(ya, x @ a.dequantize().t())  # cached path
    torch.testing.assert_close(yb, x @ b.dequantize().t())  # chunked path
    del a
    gc.collect()
    assert linear_mod.DENSE_CACHE.used == used0
