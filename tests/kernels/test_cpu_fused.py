"""The native CPU forward-pass ops (kernels/cpu_native.py: rope_kv_write, attend_causal, swiglu,
dequantize_rows, argmax) against their torch references, every kernel variant this CPU can run,
one thread and the pool.

Tolerances: RoPE + cache write, the embedding gather and argmax are exact (bit for bit; the same
float32 operations as the torch formula). Attention within 1e-5 of sdpa in float64 (float32
accumulation over at most ~1500 keys); shapes cover the prefill kernel's four-head groups and the
heads left over (n_rep 1..5), head sizes that are not a multiple of the vector width, and score
rows too long for its stack buffer. SwiGLU within 1e-6 relative of float64 (its exp
is ~1 ulp, a division and two products add ~3 ulp = 2e-7), and bit-identical across variants.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tramontane.kernels import cpu_native
from tramontane.kernels import ggml_types as gt

from support.cpu_reference import attention_reference, make_weight, rope_reference

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE,
                                 reason=f"native CPU kernels not built: {cpu_native.IMPORT_ERROR}"),
              pytest.mark.usefixtures("restore_cpu_kernel_settings")]

VARIANT_THREADS = [(v, n) for v in cpu_native.variants() for n in (1, 2)]


def _use(variant, threads):
    cpu_native.use_variant(variant)
    cpu_native.set_threads(threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_rope_kv_write_is_bit_exact(threads):
    cpu_native.set_threads(threads)
    g = torch.Generator().manual_seed(5)
    for T, hq, hkv, d, dv, cap, start, fused in [(1, 32, 8, 128, 128, 40, 17, False), (70, 32, 8, 128, 128, 80, 3, False),
                                                 (5, 6, 2, 8, 12, 9, 4, True), (3, 4, 4, 16, 16, 3, 0, False)]:
        q_w, k_w, v_w = hq * d, hkv * d, hkv * dv
        qkv = torch.randn(T, q_w + k_w + v_w, generator=g)
        if fused:  # views of one fused matmul output: rows strided
            q, k, v = (t.reshape(T, -1, n) for t, n in zip(qkv.split([q_w, k_w, v_w], -1), (d, d, dv)))
        else:
            q, k, v = (t.reshape(T, -1, n).clone() for t, n in zip(qkv.split([q_w, k_w, v_w], -1), (d, d, dv)))
        cq, sq, ck, sk = (torch.randn(T, d, generator=g) for _ in range(4))
        k_cache, v_cache = torch.randn(hkv, cap, d, generator=g), torch.randn(hkv, cap, dv, generator=g)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want_k[:, start:start + T] = rope_reference(k, ck, sk).transpose(0, 1)
        want_v[:, start:start + T] = v.transpose(0, 1)
        want_q = rope_reference(q, cq, sq)
        cpu_native.rope_kv_write(q, k, v, cq, sq, ck, sk, k_cache, v_cache, start)
        assert torch.equal(q, want_q)  # rotated in place
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # and nothing else written


def test_rope_kv_write_refuses_what_does_not_fit():
    q, k, v = torch.zeros(2, 4, 8), torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)
    tables = [torch.zeros(2, 8)] * 4
    cache = torch.zeros(2, 5, 8)
    with pytest.raises(ValueError, match="room"):
        cpu_native.rope_kv_write(q, k, v, *tables, cache, cache.clone(), 4)  # rows 4, 5 of 5
    with pytest.raises(ValueError, match="float32"):
        cpu_native.rope_kv_write(q.double(), k, v, *tables, cache, cache.clone(), 0)
    with pytest.raises(ValueError, match="tables"):
        cpu_native.rope_kv_write(q, k, v, torch.zeros(1, 8), *tables[1:], cache, cache.clone(), 0)


@pytest.mark.parametrize("variant,threads", VARIANT_THREADS)
def test_attend_causal_matches_sdpa(variant, threads):
    _use(variant, threads)
    g = torch.Generator().manual_seed(6)
    for T, H, hkv, d, dv, cap, start in [(1, 32, 8, 128, 128, 300, 0), (1, 32, 8, 128, 128, 300, 256),
                                         (33, 32, 8, 128, 128, 300, 0), (20, 8, 8, 40, 40, 64, 11),
                                         (9, 6, 2, 24, 16, 9, 0), (1100, 2, 1, 8, 8, 1200, 5),
                                         (6, 10, 2, 32, 48, 20, 3), (3, 8, 2, 16, 16, 1500, 1400),
                                         (1, 10, 2, 36, 20, 1500, 1300), (1, 3, 3, 16, 16, 40, 39)]:
        q = torch.randn(T, H, d, generator=g)
        keys = torch.randn(hkv, cap, d, generator=g) * 2
        values = torch.randn(hkv, cap, dv, generator=g)
        out = cpu_native.attend_causal(q, keys, values, start)
        assert out.shape == (T, H * dv)
        torch.testing.assert_close(out.double(), attention_reference(q, keys, values, start), rtol=1e-5, atol=1e-5)
        if T == 1:  # the four-heads-a-load decode kernel agrees with the head-at-a-time one
            torch.testing.assert_close(out.reshape(H, dv), cpu_native.attend_decode(q[0], keys, values, start + 1),
                                       rtol=1e-5, atol=1e-6)


def test_attend_causal_refuses_rows_past_the_cache():
    with pytest.raises(ValueError, match="holding the rows"):
        cpu_native.attend_causal(torch.zeros(3, 4, 8), torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), 2)
    with pytest.raises(ValueError, match="contiguous heads"):
        cpu_native.attend_causal(torch.zeros(3, 8, 4).transpose(1, 2), torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), 0)


@pytest.mark.parametrize("variant,threads", VARIANT_THREADS)
def test_swiglu_matches_float64(variant, threads):
    _use(variant, threads)
    g = torch.Generator().manual_seed(7)
    for rows, n in [(1, 8192), (37, 1000), (3, 7)]:
        gate = torch.randn(rows, n, generator=g) * 8
        gate[0, :4] = torch.tensor([0.0, -100.0, 90.0, -87.5])  # zero, and past the exp clamps
        up = torch.randn(rows, n, generator=g)
        want = F.silu(gate.double()) * up.double()
        got = cpu_native.swiglu(gate, up)
        err = (got.double() - want).abs() - 1e-6 * want.abs()
        assert float(err.max()) <= 1e-35, float(err.max())
    fused = torch.randn(5, 2 * 96, generator=g) * 4  # the two halves of a fused gate_up output
    gate, up = fused.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_native.swiglu(gate, up).double(), F.silu(gate.double()) * up.double(),
                               rtol=1e-6, atol=1e-30)
    nan_gate = torch.tensor([[float("nan"), 1.0]])
    assert torch.isnan(cpu_native.swiglu(nan_gate, torch.ones(1, 2))[0, 0])


def test_swiglu_is_the_same_on_every_variant():
    g = torch.Generator().manual_seed(8)
    gate, up = torch.randn(4, 4099, generator=g) * 10, torch.randn(4, 4099, generator=g)
    outs = []
    for variant in cpu_native.variants():
        cpu_native.use_variant(variant)
        outs.append(cpu_native.swiglu(gate, up))
    assert all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.parametrize("ggml_type", [gt.Q4_K, gt.Q6_K, gt.Q8_0, gt.F16])
def test_dequantize_rows_is_the_reference_row(ggml_type):
    rng = np.random.default_rng(ggml_type)
    raw, deq = make_weight(ggml_type, 50, 512, rng)  # deq: gguf.quants' dequantization
    data = torch.from_numpy(raw)
    if ggml_type == gt.F16:
        data = data.view(torch.float16).reshape(50, 512)
    table = torch.from_numpy(deq)
    for ids in ([7], [0, 49, 7, 7], list(range(50)) * 3):
        got = cpu_native.dequantize_rows(ggml_type, data, torch.tensor(ids), 512)
        assert torch.equal(got, table[ids])
    with pytest.raises(IndexError, match="outside"):
        cpu_native.dequantize_rows(ggml_type, data, torch.tensor([3, 50]), 512)
    with pytest.raises(IndexError, match="outside"):
        cpu_native.dequantize_rows(ggml_type, data, torch.tensor([-1]), 512)


@pytest.mark.parametrize("variant", cpu_native.variants())
def test_argmax_is_torch_argmax(variant):
    cpu_native.use_variant(variant)
    g = torch.Generator().manual_seed(9)
    for n in (1, 15, 16, 17, 131072, 131075):
        x = torch.randn(n, generator=g)
        assert cpu_native.argmax(x) == (int(x.argmax()), False)
    x = torch.full((1000,), -float("inf"))
    x[[300, 77, 900]] = 2.5  # ties: the first index, as torch
    x[999] = 1.0
    assert cpu_native.argmax(x) == (77, False) == (int(x.argmax()), False)
    x[5] = float("nan")
    assert cpu_native.argmax(x)[1] is True
    tail = torch.randn(35, generator=g)
    tail[34] = float("nan")  # past the vector loop
    assert cpu_native.argmax(tail)[1] is True
    with pytest.raises(ValueError):
        cpu_native.argmax(torch.zeros(0))


@pytest.mark.parametrize("rows", [1, 5])
def test_linears_is_linear_per_weight(rows):
    """One native call for several weights of one input (q, k, v of mixed types): bit for bit
    what one `linear` per weight gives, on the native kernels and on the float32 torch path."""
    from tramontane.kernels.linear import QWeight, linear, linears
    from support.cpu_kernels import cpu_exact

    rng = np.random.default_rng(10)
    weights = [QWeight.from_raw(make_weight(t, n, 512, rng)[0], t, (n, 512))
               for t, n in [(gt.Q4_K, 64), (gt.Q4_K, 16), (gt.Q6_K, 16), (gt.Q8_0, 8)]]
    x = torch.from_numpy(rng.standard_normal((rows, 512)).astype(np.float32))
    for exact in (False, True):
        with cpu_exact(exact):
            got = linears(x, weights)
            want = [linear(x, w) for w in weights]
        assert [tuple(y.shape) for y in got] == [(rows, w.shape[0]) for w in weights]
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("rows", [1, 70])
def test_norm_and_residual_ride_in_the_matmul_call(rows):
    """norm_linears = linears(rms_norm(x)) and linear_add = residual + linear, bit for bit (the
    same float32 operations, only fewer calls); RMSNorm rows on the pool equal one thread."""
    from tramontane.engine.mistral3.text import norm_linears, rms_norm
    from tramontane.kernels.linear import QWeight, linear, linear_add, linears

    rng = np.random.default_rng(11)
    weights = [QWeight.from_raw(make_weight(t, n, 512, rng)[0], t, (n, 512)) for t, n in [(gt.Q4_K, 48), (gt.Q6_K, 16)]]
    x = torch.from_numpy(rng.standard_normal((rows, 512)).astype(np.float32)) * 3
    norm = torch.from_numpy(rng.uniform(0.5, 1.5, 512).astype(np.float32))
    got = norm_linears(x, norm, 1e-5, weights)
    want = linears(rms_norm(x, norm, 1e-5), weights)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    pooled = cpu_native.rms_norm(x, norm, 1e-5)
    cpu_native.set_threads(1)
    assert torch.equal(cpu_native.rms_norm(x, norm, 1e-5), pooled)
    cpu_native.set_threads(2)
    residual = torch.from_numpy(rng.standard_normal((rows, 48)).astype(np.float32))
    assert torch.equal(linear_add(x, weights[0], residual), residual + linear(x, weights[0]))
    with pytest.raises(ValueError, match="residual"):
        cpu_native.matmul_add(x, weights[0]._native + (48,), residual[:, :40])


@pytest.mark.parametrize("T,start", [(1, 30), (40, 0), (7, 12)])
def test_one_call_attention_and_mlp_are_their_steps(T, start):
    """rope_kv_attend = rope_kv_write then attend_causal, norm_swiglu = swiglu of norm_linears:
    bit for bit (the same kernels, one call)."""
    from tramontane.engine.mistral3.text import norm_linears, swiglu
    from tramontane.kernels.linear import QWeight, native_plans

    g = torch.Generator().manual_seed(12)
    hq, hkv, d = 8, 2, 64
    q, k, v = torch.randn(T, hq, d, generator=g), torch.randn(T, hkv, d, generator=g), torch.randn(T, hkv, d, generator=g)
    tables = [torch.randn(T, d, generator=g) for _ in range(4)]
    caches = [torch.randn(hkv, 64, d, generator=g) for _ in range(2)]
    want_caches = [c.clone() for c in caches]
    q2 = q.clone()
    cpu_native.rope_kv_write(q2, k, v, *tables, *want_caches, start)
    want = cpu_native.attend_causal(q2, *want_caches, start)
    got = cpu_native.rope_kv_attend(q, k, v, *tables, *caches, start)
    assert torch.equal(got, want) and torch.equal(q, q2)
    assert all(torch.equal(a, b) for a, b in zip(caches, want_caches))

    rng = np.random.default_rng(13)
    gate_w, up_w = (QWeight.from_raw(make_weight(gt.Q4_K, 96, 256, rng)[0], gt.Q4_K, (96, 256)) for _ in range(2))
    x = torch.from_numpy(rng.standard_normal((T, 256)).astype(np.float32))
    norm = torch.from_numpy(rng.uniform(0.5, 1.5, 256).astype(np.float32))
    got = cpu_native.norm_swiglu(x, norm, 1e-5, *native_plans((gate_w, up_w), x))
    assert torch.equal(got, swiglu(*norm_linears(x, norm, 1e-5, (gate_w, up_w))))


def test_prefill_sized_temporaries_are_released_and_right():
    """Past 4 MiB of normalised rows the kernels' temporary is freed after the call (RSS); the
    results are the same either side of that line."""
    from tramontane.engine.mistral3.text import norm_linears, rms_norm
    from tramontane.kernels.linear import QWeight, linears

    rng = np.random.default_rng(14)
    w = QWeight.from_raw(make_weight(gt.Q8_0, 16, 1024, rng)[0], gt.Q8_0, (16, 1024))
    norm = torch.from_numpy(rng.uniform(0.5, 1.5, 1024).astype(np.float32))
    for rows in (1100, 3, 1100):  # 4.5 MB, then small (kept), then large again
        x = torch.from_numpy(rng.standard_normal((rows, 1024)).astype(np.float32))
        assert torch.equal(norm_linears(x, norm, 1e-5, [w])[0], linears(rms_norm(x, norm, 1e-5), [w])[0])


# ------------------------------------------------------------------ a decode step's layers in one call
DECODE_FILES = ["mistral3_q256-Q4_K_M", "mistral3_q256-Q6_K", "mistral3_tiny-q8_0", "mistral3_tiny-f16"]


@pytest.mark.cpu_variants
@pytest.mark.parametrize("name", DECODE_FILES)
def test_decode_layers_are_the_per_op_path_bit_for_bit(name):
    """A decode step through the one-call DecodeLayers (what Mistral3Text.decode runs on the
    kernels) gives the per-op path's hidden row and KV entries bit for bit, token after token
    (the per-op path is what test_text_cpu_native holds against the float32 torch model)."""
    import os

    from support import FIXTURES
    from tramontane.engine.mistral3.text import Mistral3Text
    from tramontane.engine.runtime.decoder import new_cache
    from support.cpu_kernels import cpu_exact
    from tramontane.kernels import linear as linear_mod

    model = Mistral3Text.load(os.path.join(FIXTURES, f"{name}.gguf"), device="cpu")
    ids = list(range(100, 131))
    per_op, fused = new_cache(model, 64), new_cache(model, 64)
    for cache in (per_op, fused):
        model.forward(model.embed(ids), 0, cache)
    seg, cfg = model.segments[0], model.cfg
    step = model._native_decode(seg, fused)
    assert isinstance(step, cpu_native.DecodeLayers) and step.n_layers == len(seg.layers)
    rope = seg.rope
    for token in (5, 900, 77):
        x = model.embed([token]).float()
        pos = per_op.length
        per_op.reserve(1)  # the row's block, as forward_batch reserves before the layers
        fused.reserve(1)
        with cpu_exact(False):  # the per-op native path
            layers = [(model.layers[i], i) for i in seg.layers]
            want = x
            attend = model.rows_attention(seg, [(per_op, pos, 1)], want.device)
            for layer, i in layers:
                q, k, v = model._qkv(layer, want)
                want = linear_mod.linear_add(attend(i, q, k, v), layer.wo, want)
                want = linear_mod.linear_add(model._mlp_hidden(layer, want), layer.w_down, want)
        got = step.run(x, pos, rope.cos_q, rope.sin_q, rope.cos_k, rope.sin_k, fused.table(seg.device))
        assert torch.equal(got, want), float((got - want).abs().max())
        for i in seg.layers:
            fk, fv = fused.read_positions(i, pos + 1)
            pk, pv = per_op.read_positions(i, pos + 1)
            assert torch.equal(fk, pk) and torch.equal(fv, pv)
        per_op.length = fused.length = pos + 1
    assert cfg.hidden == got.shape[1]


def test_decode_layers_are_made_once_and_again_for_new_cache_tensors():
    import os

    from support import FIXTURES
    from tramontane.engine.mistral3.text import Mistral3Text
    from tramontane.engine.runtime.decoder import decode, new_cache

    model = Mistral3Text.load(os.path.join(FIXTURES, "mistral3_tiny-q8_0.gguf"), device="cpu")
    cache = new_cache(model, 32)
    model.forward(model.embed([1, 2, 3]), 0, cache)
    decode(model, 4, cache)
    step = model._native_decode(model.segments[0], cache)
    decode(model, 5, cache)
    assert model._native_decode(model.segments[0], cache) is step  # cached, not rebuilt per token
    other = new_cache(model, 32)
    assert model._native_decode(model.segments[0], other) is not step


def test_decode_layers_refuse_what_does_not_fit():
    hidden, d = 64, 16
    norm = torch.ones(hidden)
    cache = torch.zeros(2, 8, d)
    plans = [(gt.F32, 1, 4 * hidden, 4 * d, hidden), (gt.F32, 1, 1, 2 * d, hidden), (gt.F32, 1, 1, 2 * d, hidden),
             (gt.F32, 1, 1, hidden, 4 * d), (gt.F32, 1, 1, 128, hidden), (gt.F32, 1, 1, 128, hidden),
             (gt.F32, 1, 1, hidden, 128)]
    layer = (norm, norm, plans, cache, cache)
    step = cpu_native.DecodeLayers([layer], hidden, 4, 2, d, d, 1e-5)
    with pytest.raises(ValueError, match="position"):
        step.run(torch.zeros(1, hidden), 8, *(torch.zeros(16, d),) * 4)
    with pytest.raises(ValueError, match="RoPE"):
        step.run(torch.zeros(1, hidden), 3, *(torch.zeros(3, d),) * 4)
    bad = list(plans)
    bad[6] = (gt.F32, 1, 1, hidden, 100)  # down's input is not the gate's width
    with pytest.raises(ValueError, match="expected"):
        cpu_native.DecodeLayers([(norm, norm, bad, cache, cache)], hidden, 4, 2, d, d, 1e-5)
    with pytest.raises(ValueError, match="KV cache"):
        cpu_native.DecodeLayers([(norm, norm, plans, cache.half(), cache)], hidden, 4, 2, d, d, 1e-5)
