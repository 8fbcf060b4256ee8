"""The native CPU kernels (tramontane.kernels._cpu) against gguf.quants + float64.

Every type, every kernel variant this CPU can run (avx512vnni / avx2 / generic), odd shapes
(weight rows not a multiple of the 16-row unit, activation rows not a multiple of the 4 or 8-row tile, K = one block and
many blocks), 1 and many activation rows, 1 and several threads. Two checks per product:

* model: the kernels quantize each activation block to int8 (d = amax / 127, round half to
  even, float32) - the same quantization in numpy, times the gguf.quants-dequantized weight in
  float64, must match within 1e-5 of sum |w| |x_q| per output (float32 rounding only; one wrong
  weight in a row of K is an error of about 1/K of that sum, far above it);
* exact: against the unquantized float64 product, the error is at most the quantization bound
  sum_e |w_e| d_e / 2 (plus the same 1e-5 rounding term).
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from tramontane.kernels import cpu_native, linear as linear_mod
from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import QWeight, linear, linear_reference

from support.cpu_reference import act_block, make_weight, quantize_rows

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE,
                                 reason=f"native CPU kernels not built: {cpu_native.IMPORT_ERROR}"),
              pytest.mark.usefixtures("restore_cpu_kernel_settings")]

ALL_TYPES = [gt.Q8_0, gt.Q4_K, gt.Q6_K, gt.Q5_K, gt.Q2_K, gt.Q3_K, gt.Q4_0, gt.Q4_1, gt.Q5_0,
             gt.Q5_1, gt.IQ4_NL, gt.IQ4_XS, gt.F16, gt.BF16, gt.F32]
RTOL = 1e-5  # of sum |w| |x| per output: float32 accumulation only


def _shapes(ggml_type):
    """(weight rows, K, activation rows)"""
    blk = gt.type_info(ggml_type).block_size
    one = blk if blk > 1 else 40  # float types: K with a tail after the 16-wide SIMD loop
    many = 2048 if blk > 1 else 1000
    shapes = [(37, one, 1), (1, many, 1), (19, many, 6), (53, one, 9), (16, 4 * max(blk, 64), 4), (21, one, 19)]
    if blk > 1:  # K in several chunks of the prefill tiles' L1 blocking (23 x 256: chunks 8, 8, 7)
        shapes.append((11, 23 * 256, 9))
    else:  # float prefill blocks: K in chunks of 1024 with a tail, weight and activation rows left over
        shapes.append((7, 2500, 7))
    return shapes


def _check(ggml_type, raw, deq, x, y):
    w64 = deq.astype(np.float64)
    blk = act_block(ggml_type)
    if blk:
        q, d = quantize_rows(x, blk)
        xm = q * d
    else:
        xm, d = x.astype(np.float64), np.zeros_like(x, dtype=np.float64)
    model = xm @ w64.T
    scale = np.abs(xm) @ np.abs(w64).T + 1e-30
    err = np.abs(y.astype(np.float64) - model)
    worst = float((err / scale).max())
    assert worst <= RTOL, f"{gt.type_name(ggml_type)}: relative error {worst:.3g} against the quantized-activation model"
    exact = x.astype(np.float64) @ w64.T
    bound = (d / 2) @ np.abs(w64).T * (1 + 1e-6) + RTOL * (np.abs(x.astype(np.float64)) @ np.abs(w64).T)
    over = np.abs(y.astype(np.float64) - exact) - bound
    assert float(over.max()) <= 0, f"{gt.type_name(ggml_type)}: beyond the activation quantization bound by {over.max():.3g}"
    return worst


@pytest.mark.parametrize("variant", cpu_native.variants())
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=gt.type_name)
def test_matmul_matches_gguf_reference(variant, ggml_type):
    cpu_native.use_variant(variant)
    rng = np.random.default_rng(ggml_type * 101 + len(variant))
    for threads in (1, 3):
        cpu_native.set_threads(threads)
        for rows, k, n in _shapes(ggml_type):
            raw, deq = make_weight(ggml_type, rows, k, rng)
            x = rng.standard_normal((n, k)).astype(np.float32) * np.float32(rng.uniform(0.01, 10))
            data = torch.from_numpy(raw)
            if ggml_type in (gt.F32, gt.F16, gt.BF16):
                data = data.view({gt.F32: torch.float32, gt.F16: torch.float16, gt.BF16: torch.bfloat16}[ggml_type])
            y = cpu_native.matmul(torch.from_numpy(x), ggml_type, data, rows, k).numpy()
            assert y.shape == (n, rows)
            _check(ggml_type, raw, deq, x, y)


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=gt.type_name)
def test_dequantize_is_bit_exact(ggml_type):
    rng = np.random.default_rng(7 + ggml_type)
    raw, deq = make_weight(ggml_type, 45, 2 * max(gt.type_info(ggml_type).block_size, 128), rng)
    for variant in cpu_native.variants():
        cpu_native.use_variant(variant)
        out = cpu_native.dequantize(ggml_type, torch.from_numpy(raw), *deq.shape).numpy()
        np.testing.assert_array_equal(out.view(np.uint32), deq.view(np.uint32), err_msg=variant)


@pytest.mark.parametrize("n_x", [2, 8], ids=["decode-tile", "prefill-tile"])
@pytest.mark.parametrize("ggml_type", [gt.Q2_K, gt.Q3_K, gt.Q4_K, gt.Q5_K, gt.Q6_K, gt.Q8_0, gt.IQ4_XS],
                         ids=gt.type_name)
def test_a_wrong_weight_is_caught(ggml_type, n_x):
    """The tolerance is tight enough to see one flipped nibble in a 2048-wide row, on the decode
    tiles and on the prefill tiles (8 rows: the transposed layout where a variant has one)."""
    rng = np.random.default_rng(3)
    raw, deq = make_weight(ggml_type, 8, 2048, rng)
    x = rng.standard_normal((n_x, 2048)).astype(np.float32)
    bad = raw.copy()
    bad[5, 16 + 40] ^= 0x0F  # a quant byte's low nibble in row 5 (in every type here)
    y = cpu_native.matmul(torch.from_numpy(x), ggml_type, torch.from_numpy(bad), 8, 2048).numpy()
    _check(ggml_type, raw, deq, x, cpu_native.matmul(torch.from_numpy(x), ggml_type, torch.from_numpy(raw), 8, 2048).numpy())
    with pytest.raises(AssertionError):
        _check(ggml_type, raw, deq, x, y)


def test_zero_and_constant_rows():
    rng = np.random.default_rng(5)
    raw, deq = make_weight(gt.Q6_K, 10, 512, rng)
    x = np.zeros((3, 512), dtype=np.float32)
    x[1] = 1.0
    y = cpu_native.matmul(torch.from_numpy(x), gt.Q6_K, torch.from_numpy(raw), 10, 512).numpy()
    assert not y[0].any() and not y[2].any()
    np.testing.assert_allclose(y[1], deq.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K, gt.Q8_0, gt.F16], ids=gt.type_name)
def test_linear_uses_native_on_cpu_views_and_dtypes(ggml_type):
    """kernels.linear on a CPU QWeight (also a row view of it, and bf16 activations)."""
    rng = np.random.default_rng(11)
    raw, deq = make_weight(ggml_type, 70, 512, rng)
    w = QWeight.from_raw(raw, ggml_type, (70, 512))
    assert linear_mod.native_cpu(w)
    x = torch.from_numpy(rng.standard_normal((2, 3, 512)).astype(np.float32))
    y = linear(x, w)
    assert y.shape == (2, 3, 70) and y.dtype == torch.float32
    _check(ggml_type, raw, deq, x.reshape(6, 512).numpy(), y.reshape(6, 70).numpy())
    part = w.rows(17, 50)
    yp = linear(x, part)
    torch.testing.assert_close(yp, y[..., 17:50], rtol=0, atol=0)
    yb = linear(x.to(torch.bfloat16), w)
    assert yb.dtype == torch.bfloat16


def test_threads_setting(monkeypatch):
    assert cpu_native.physical_cores() >= 1
    monkeypatch.setenv("TRAMONTANE_THREADS", "3")
    assert cpu_native.default_threads() == 3
    assert cpu_native.set_threads() == 3 and cpu_native.threads() == 3
    monkeypatch.setenv("TRAMONTANE_THREADS", "zero")
    with pytest.raises(ValueError, match="TRAMONTANE_THREADS"):
        cpu_native.default_threads()
    monkeypatch.delenv("TRAMONTANE_THREADS")
    assert cpu_native.default_threads() == cpu_native.physical_cores()
    assert cpu_native.set_threads(1) == 1
    with pytest.raises(ValueError):
        cpu_native.set_threads(0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="not supported"):
        cpu_native.matmul(torch.zeros(1, 64), 99, torch.zeros(1, 64, dtype=torch.uint8), 1, 64)
    with pytest.raises(ValueError, match="multiple"):
        cpu_native.matmul(torch.zeros(1, 100), gt.Q8_0, torch.zeros(1, 200, dtype=torch.uint8), 1, 100)


def test_falls_back_to_torch_and_warns_once(monkeypatch):
    rng = np.random.default_rng(13)
    raw, deq = make_weight(gt.Q4_K, 12, 256, rng)
    w = QWeight.from_raw(raw, gt.Q4_K, (12, 256))
    x = torch.from_numpy(rng.standard_normal((2, 256)).astype(np.float32))
    monkeypatch.setattr(cpu_native, "_cpu", None)
    monkeypatch.setattr(cpu_native, "AVAILABLE", False)
    linear_mod._warn_no_native.cache_clear()  # as if not yet warned in this process
    with pytest.warns(RuntimeWarning, match="native CPU kernels are not built"):
        y = linear(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear(x, w)  # once only
    torch.testing.assert_close(y, linear_reference(x, w))
    np.testing.assert_allclose(y.numpy(), x.numpy().astype(np.float64) @ deq.astype(np.float64).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", cpu_native.variants())
def test_attend_decode_matches_sdpa(variant):
    cpu_native.use_variant(variant)
    g = torch.Generator().manual_seed(1)
    for n_heads, n_kv, d, cap, n in [(32, 8, 128, 300, 1), (32, 8, 128, 300, 257), (8, 8, 40, 20, 13), (6, 2, 24, 9, 9)]:
        q = torch.randn(n_heads, d, generator=g)
        keys = torch.randn(n_kv, cap, d, generator=g) * 2
        values = torch.randn(n_kv, cap, d, generator=g)
        out = cpu_native.attend_decode(q, keys, values, n)
        rep = n_heads // n_kv
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double().reshape(1, n_kv, rep, d), keys[:, :n].double()[None], values[:, :n].double()[None])
        torch.testing.assert_close(out.double(), want.reshape(n_heads, d), rtol=1e-5, atol=1e-5)


def test_rms_norm_matches_hf_formula():
    g = torch.Generator().manual_seed(2)
    for shape in [(1, 2048), (7, 3, 64), (5, 40)]:
        x = torch.randn(*shape, generator=g) * 3
        w = torch.rand(shape[-1], generator=g) + 0.5
        want = w.double() * (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5))
        got = cpu_native.rms_norm(x, w, 1e-5)
        assert got.shape == x.shape
        torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6)


def test_rope_pairs_is_bit_exact():
    g = torch.Generator().manual_seed(3)
    for T, H, d in [(1, 32, 128), (5, 3, 8)]:
        x = torch.randn(T, H, d, generator=g)
        cos, sin = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)
        swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        want = x * cos[:, None, :] + swapped * sin[:, None, :]
        assert torch.equal(cpu_native.rope_pairs(x, cos, sin), want)
        assert torch.equal(cpu_native.rope_pairs(x[:, :, :], cos, sin), want)
    xs = torch.randn(4, 6, 16, generator=g)[:, ::2]  # a strided (non-contiguous) input
    cos, sin = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    want = xs * cos[:, None] + xs.unflatten(-1, (-1, 2)).flip(-1).flatten(-2) * sin[:, None]
    assert torch.equal(cpu_native.rope_pairs(xs, cos, sin), want)


REPACKING = cpu_native.repacking_variants()
REPACKED = {gt.Q4_K: cpu_native.Q4_K_REPACKED, gt.Q6_K: cpu_native.Q6_K_REPACKED}
NEEDS_REPACKING = pytest.mark.skipif(not REPACKING, reason="no kernel variant here runs repacked weights (needs AVX-512 VNNI)")


@NEEDS_REPACKING
@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K], ids=gt.type_name)
@pytest.mark.parametrize("k", [2048, 23 * 256, 65 * 256])  # 65 * 256 > 16384: decode's tiles of 8 / 4 weight rows
def test_repacked_weights_give_the_file_layouts_products(ggml_type, k):
    """A Q4_K or Q6_K weight planned on a repacking variant runs on its repacked copy (one row or
    many): the products hold the same bounds against gguf.quants. Q4_K's repacked prefill tile is
    the file layout's minus the in-register shuffles, so above NARROW_MAX_ROWS rows it is bit for
    bit the same; Q6_K's sums each sub-block in its own lane (another float order, the same bounds)."""
    cpu_native.use_variant(REPACKING[0])
    rng = np.random.default_rng(k + ggml_type)
    raw, deq = make_weight(ggml_type, 37, k, rng)
    w = QWeight.from_raw(raw, ggml_type, (37, k))
    for threads in (1, 3):
        cpu_native.set_threads(threads)
        for n in (1, 2, 3, 8, cpu_native.NARROW_MAX_ROWS + 7):
            x = rng.standard_normal((n, k)).astype(np.float32) * np.float32(rng.uniform(0.01, 10))
            y = linear(torch.from_numpy(x), w)
            assert w._native[0] == REPACKED[ggml_type] and w._repacked is not None
            assert not np.array_equal(w._repacked.numpy(), raw)  # really another order
            _check(ggml_type, raw, deq, x, y.numpy())
            if n > cpu_native.NARROW_MAX_ROWS and ggml_type == gt.Q4_K:
                assert torch.equal(y, cpu_native.matmul(torch.from_numpy(x), gt.Q4_K, torch.from_numpy(raw), 37, k))


@NEEDS_REPACKING
def test_repacked_q6k_prefill_rows_do_not_depend_on_their_neighbours():
    """The Q6_K repacked prefill path unpacks blocks of 16 weight rows per K chunk (of at most 10
    blocks) and runs tiles of 8, 4, then 1-3 activation rows: every product is computed by the same
    steps wherever it lands, so a row's outputs are bit for bit the same in a 13- to 15-row call
    (the fewest past NARROW_MAX_ROWS: the decode tiles take fewer) as inside a 29-row one, and a
    weight row's are the same when the rows before it (which shift the groups of 16) are left out;
    the gguf.quants bounds hold too."""
    cpu_native.use_variant(REPACKING[0])
    cpu_native.set_threads(1)
    rng = np.random.default_rng(6)
    k, n_w = 23 * 256, 45  # K chunks of 8, 8 and 7 blocks; weight groups of 16, 16 and 13
    raw, deq = make_weight(gt.Q6_K, n_w, k, rng)
    packed = cpu_native.repack(gt.Q6_K, torch.from_numpy(raw))
    x = torch.from_numpy(rng.standard_normal((29, k)).astype(np.float32))
    full = cpu_native.matmul(x, cpu_native.Q6_K_REPACKED, packed, n_w, k)  # tiles of 8, 8, 8, 4, 1
    _check(gt.Q6_K, raw, deq, x.numpy(), full.numpy())
    assert cpu_native.NARROW_MAX_ROWS < 13
    # tiles of 8, 4, then 1, 2 or 3 rows, at other positions than in the full call
    for rows in (list(range(13)), list(range(5, 19)), list(range(16, 29)) + [0, 1]):
        part = cpu_native.matmul(x[rows].contiguous(), cpu_native.Q6_K_REPACKED, packed, n_w, k)
        assert torch.equal(part, full[rows])
    for first in (1, 7, 29):  # the rows after `first` in other groups of 16
        tail = cpu_native.matmul(x, cpu_native.Q6_K_REPACKED, packed[first:].contiguous(), n_w - first, k)
        assert torch.equal(tail, full[:, first:])


@NEEDS_REPACKING
@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K], ids=gt.type_name)
def test_repacked_decode_rows_do_not_depend_on_their_neighbours(ggml_type):
    """With K > 16384 decode reads 8 weight rows a tile for one activation row (4 for two) and a
    tail of fewer one at a time: each weight row's output is computed by the same steps wherever
    it lands, so it is bit for bit the same inside a tile, in the tail, and (the units of rows
    handed to threads start elsewhere) with 1 or 3 threads; the gguf.quants bounds hold too."""
    cpu_native.use_variant(REPACKING[0])
    rng = np.random.default_rng(60 + ggml_type)
    k, n_w = 65 * 256, 29  # tiles of 8, 8, 8, then a tail of 5 (two rows: 7 tiles of 4, then 1)
    raw, deq = make_weight(ggml_type, n_w, k, rng)
    packed = cpu_native.repack(ggml_type, torch.from_numpy(raw))
    for n in (1, 2):
        x = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
        cpu_native.set_threads(1)
        full = cpu_native.matmul(x, REPACKED[ggml_type], packed, n_w, k)
        _check(ggml_type, raw, deq, x.numpy(), full.numpy())
        for first in (1, 5, 20):  # the rows after `first` in other tiles, or in the tail
            tail = cpu_native.matmul(x, REPACKED[ggml_type], packed[first:].contiguous(), n_w - first, k)
            assert torch.equal(tail, full[:, first:])
        cpu_native.set_threads(3)
        assert torch.equal(cpu_native.matmul(x, REPACKED[ggml_type], packed, n_w, k), full)
        if n == 2:  # each activation row as in a call of its own (one row: tiles of 8, not 4)
            for j in range(2):
                assert torch.equal(cpu_native.matmul(x[j:j + 1].contiguous(), REPACKED[ggml_type], packed, n_w, k),
                                   full[j:j + 1])


@NEEDS_REPACKING
@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K], ids=gt.type_name)
@pytest.mark.parametrize("k", [2048, 23 * 256, 65 * 256])
def test_repacked_few_rows_are_each_row_alone(ggml_type, k):
    """Up to NARROW_MAX_ROWS activation rows (a batch's decode rows, k drafted tokens verified
    in one pass) run on the decode tiles, one weight pass per 8 rows: every row's outputs are bit
    for bit what that row gives in a call of its own, so a verified token's logits are the plain
    decode's. Row counts 3..NARROW_MAX_ROWS (a group of 8, then the rest), 1 and 3 threads, the
    gguf.quants bounds; one row past the limit (the prefill tiles) still holds the bounds."""
    cpu_native.use_variant(REPACKING[0])
    rng = np.random.default_rng(90 + ggml_type + k)
    n_w, most = 29, cpu_native.NARROW_MAX_ROWS
    assert most >= 9  # k = 8 drafted tokens and the pending one
    raw, deq = make_weight(ggml_type, n_w, k, rng)
    packed = cpu_native.repack(ggml_type, torch.from_numpy(raw))
    x = torch.from_numpy(rng.standard_normal((most + 1, k)).astype(np.float32) * np.float32(rng.uniform(0.01, 10)))
    cpu_native.set_threads(1)
    alone = torch.cat([cpu_native.matmul(x[j:j + 1].contiguous(), REPACKED[ggml_type], packed, n_w, k)
                       for j in range(most + 1)])
    _check(ggml_type, raw, deq, x.numpy(), alone.numpy())
    for threads in (1, 3):
        cpu_native.set_threads(threads)
        for n in range(3, most + 1):
            got = cpu_native.matmul(x[:n].contiguous(), REPACKED[ggml_type], packed, n_w, k)
            assert torch.equal(got, alone[:n]), f"{n} rows"
        past = cpu_native.matmul(x, REPACKED[ggml_type], packed, n_w, k)
        _check(ggml_type, raw, deq, x.numpy(), past.numpy())


@pytest.mark.parametrize("variant", ["avx2", "avxvnni"])
@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q5_K, gt.Q6_K, gt.Q8_0], ids=gt.type_name)
def test_avx2_decode_rows_do_not_depend_on_their_neighbours(variant, ggml_type):
    """The AVX2 / AVX-VNNI builds decode long Q4_K, Q5_K, Q6_K and Q8_0 rows (quantized
    activations over 16 KiB, 24 on AVX-VNNI: K = 65 x 256 on both) on tiles of 8 weight rows for
    one or two activation rows, and a tail of fewer one at a time. Each weight row's output is the
    one-row tile's steps wherever it lands: bit for bit the same inside a tile, in the tail, alone,
    with 1 or 3 threads, and as a row of a 3-activation-row call (the prefill side's tile, which
    the decode tiles do not run); the gguf.quants bounds hold too. At K = 48 x 256 rows are read
    one at a time (and at 56 x 256 on AVX-VNNI; Q8_0 rows of K not a multiple of 256 too), the
    same checks hold."""
    if variant not in cpu_native.variants():
        pytest.skip(f"this CPU does not run the {variant} variant")
    cpu_native.use_variant(variant)
    rng = np.random.default_rng(70 + ggml_type)
    # 29 rows at 1 thread: units of 8 rows (tiles of 8) and one of 5 (one at a time); 3 threads,
    # 28, 24 or 9 rows: units of 4 or a tail, one row at a time
    n_w = 29
    for k in (48 * 256, 56 * 256, 65 * 256) + ((65 * 256 + 32,) if ggml_type == gt.Q8_0 else ()):
        raw, deq = make_weight(ggml_type, n_w, k, rng)
        w = torch.from_numpy(raw)
        x3 = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32) * np.float32(rng.uniform(0.01, 10)))
        three = cpu_native.matmul(x3, ggml_type, w, n_w, k)
        for n in (1, 2):
            x = x3[:n].contiguous()
            cpu_native.set_threads(1)
            full = cpu_native.matmul(x, ggml_type, w, n_w, k)
            _check(ggml_type, raw, deq, x.numpy(), full.numpy())
            assert torch.equal(full, three[:n])
            for first in (1, 5, 20):
                tail = cpu_native.matmul(x, ggml_type, w[first:].contiguous(), n_w - first, k)
                assert torch.equal(tail, full[:, first:])
            for r in (0, 7, 12, 28):
                assert torch.equal(cpu_native.matmul(x, ggml_type, w[r:r + 1].contiguous(), 1, k), full[:, r:r + 1])
            cpu_native.set_threads(3)
            assert torch.equal(cpu_native.matmul(x, ggml_type, w, n_w, k), full)


@NEEDS_REPACKING
@pytest.mark.parametrize("ggml_type,byte", [(gt.Q4_K, 16 + 40), (gt.Q6_K, 100), (gt.Q6_K, 128 + 33)],
                         ids=["Q4_K-quants", "Q6_K-low-bits", "Q6_K-high-bits"])
def test_a_wrong_weight_is_caught_after_repacking(ggml_type, byte):
    cpu_native.use_variant(REPACKING[0])
    rng = np.random.default_rng(5)
    raw, deq = make_weight(ggml_type, 8, 2048, rng)
    bad = raw.copy()
    bad[5, byte] ^= 0x0F if ggml_type == gt.Q4_K or byte < 128 else 0x30
    for n in (1, 8):
        x = rng.standard_normal((n, 2048)).astype(np.float32)
        w = QWeight.from_raw(bad, ggml_type, (8, 2048))
        y = linear(torch.from_numpy(x), w)
        assert w._native[0] == REPACKED[ggml_type]
        with pytest.raises(AssertionError):
            _check(ggml_type, raw, deq, x, y.numpy())


@pytest.mark.skipif(not REPACKING or "avx2" not in cpu_native.variants(), reason="needs a repacking variant and avx2")
@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K], ids=gt.type_name)
def test_a_variant_change_replans_a_repacked_weight(ggml_type):
    """Repacked rows run on their variant only: after use_variant the weight is planned again
    (on the file's bytes), and the kernels refuse repacked rows on a variant without them (and
    refuse to dequantize them anywhere)."""
    cpu_native.use_variant(REPACKING[0])
    rng = np.random.default_rng(6)
    raw, deq = make_weight(ggml_type, 16, 512, rng)
    w = QWeight.from_raw(raw, ggml_type, (16, 512))
    x = rng.standard_normal((2, 512)).astype(np.float32)
    linear(torch.from_numpy(x), w)
    assert w._native[0] == REPACKED[ggml_type]
    with pytest.raises(ValueError, match="repacked"):
        cpu_native.dequantize(REPACKED[ggml_type], w._repacked, 16, 512)
    cpu_native.use_variant("avx2")
    _check(ggml_type, raw, deq, x, linear(torch.from_numpy(x), w).numpy())
    assert w._native[0] == ggml_type
    y = torch.empty(2, 16)
    with pytest.raises(ValueError, match="repacked"):
        cpu_native._cpu.matmul(REPACKED[ggml_type], w._repacked.data_ptr(), w._repacked.stride(0), 16, 512,
                               torch.from_numpy(x).data_ptr(), 512 * 4, 2, y.data_ptr(), 16)
    with pytest.raises(ValueError, match="repacked"):
        cpu_native.repack(ggml_type, torch.from_numpy(raw))


def test_drop_pages_gives_back_a_file_mappings_pages_and_keeps_its_bytes(tmp_path):
    import mmap
    import sys

    path = tmp_path / "blob.bin"
    payload = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
    path.write_bytes(payload.tobytes())
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(mm, dtype=torch.uint8)
    assert int(data.sum()) == int(payload.sum())  # touched: resident
    dropped = cpu_native.drop_pages(data[100:])  # any start: only whole pages inside go
    assert dropped == sys.platform.startswith(("linux", "darwin"))
    assert np.array_equal(data.numpy(), payload)  # read again from the file
    del data
    mm.close()


@pytest.mark.skipif(not (os.path.exists("/proc/self/pagemap") and cpu_native.variant() in cpu_native.repacking_variants()),
                    reason="needs Linux's pagemap and a variant that repacks")
def test_repack_gives_back_a_mapped_weights_pages_chunk_by_chunk(tmp_path, monkeypatch):
    """A file-mapped Q6_K weight repacked with give_back: the same rows as from memory, and the
    file's pages leave while it is copied, chunk by chunk, and none is left after: the load's peak is one chunk of the file beside the copies, not a whole matrix."""
    import mmap

    from support.rss import pages_present

    rows, cols = 96, 2048
    row_bytes = cols // 256 * gt.type_info(gt.Q6_K).type_size
    raw, _ = make_weight(gt.Q6_K, rows, cols, np.random.default_rng(11))
    want = cpu_native.repack(gt.Q6_K, torch.from_numpy(raw))
    path = tmp_path / "weight.bin"
    path.write_bytes(raw.tobytes())
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(mm, dtype=torch.uint8).reshape(rows, row_bytes)
    view = data.numpy()
    assert int(data.sum()) == int(raw.astype(np.int64).sum()) and all(pages_present(view))
    chunk_rows = 8
    monkeypatch.setattr(cpu_native, "GIVE_BACK_CHUNK", chunk_rows * row_bytes)
    present_at_chunk = []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def repack(self, *args):
            present_at_chunk.append(sum(pages_present(view)))
            return real.repack(*args)

    real = cpu_native._cpu
    monkeypatch.setattr(cpu_native, "_cpu", Recording())
    got = cpu_native.repack(gt.Q6_K, data, give_back=True)
    monkeypatch.setattr(cpu_native, "_cpu", real)
    assert torch.equal(got, want)
    assert len(present_at_chunk) == rows // chunk_rows
    total = len(pages_present(view))
    assert present_at_chunk[0] == total
    # each chunk's whole pages leave before the next chunk is read (those two chunks share stay)
    assert all(b < a for a, b in zip(present_at_chunk, present_at_chunk[1:])), present_at_chunk
    assert present_at_chunk[-1] <= total // 2, present_at_chunk
    assert not any(pages_present(view))
    assert np.array_equal(view, raw)  # read again from the file
    del data, view
    mm.close()
