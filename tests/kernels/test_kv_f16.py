"""The float16 KV cache of the native CPU kernels (rope_kv_write, attend_causal, attend_decode,
DecodeLayers with float16 caches), every kernel variant this CPU can force (cpu_variants), one
thread and the pool.

What is checked and the bounds:
- rope_kv_write into float16 caches writes exactly torch's `.half()` of the float32 rotation
  (round to nearest even; the float32 products and sums are the ones the float32 path makes bit
  for bit, tests/kernels/test_cpu_fused.py), values likewise; q and every other cache row as before.
- attention over float16 caches equals, bit for bit, the float32 kernel over the same values
  widened to float32 (binary16 -> binary32 is exact, and the float32 operations and their order
  are the same): the float16 cache adds no error beyond its rounding at the write.
- against sdpa in float64 over those same float16-rounded keys/values: rtol = atol = 1e-5, the
  float32 kernel's own bound (test_cpu_fused.py): scores are float32 dot products of d <= 128 terms
  (relative error <= d * 2^-24 ~ 8e-6 of sum |q_e k_e|, ~1e-6 for random data), softmax and the
  weighted sum of <= ~1500 values add a few ulp each; measured errors are ~1e-6.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from support.cpu_reference import attention_reference, rope_reference

from tramontane.kernels import cpu_native
from tramontane.kernels import ggml_types as gt

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE,
                                 reason=f"native CPU kernels not built: {cpu_native.IMPORT_ERROR}"),
              pytest.mark.usefixtures("restore_cpu_kernel_settings"),
              pytest.mark.cpu_variants]

# (T, H, Hkv, d, dv, capacity, start): decode at several depths and group sizes (n_rep 1..5 and
# the four-head blocks), prefill rows, head sizes not a multiple of any vector width, score rows
# longer than the kernels' stack buffers
SHAPES = [(1, 32, 8, 128, 128, 300, 0), (1, 32, 8, 128, 128, 2100, 2047), (1, 10, 2, 36, 20, 1500, 1300),
          (1, 3, 3, 16, 16, 40, 39), (1, 6, 2, 24, 40, 70, 64),
          (33, 32, 8, 128, 128, 300, 0), (20, 8, 8, 40, 40, 64, 11), (9, 6, 2, 24, 16, 9, 0),
          (6, 10, 2, 32, 48, 20, 3), (3, 8, 2, 16, 16, 1500, 1400), (300, 4, 1, 8, 8, 320, 17)]


@pytest.mark.parametrize("threads", [1, 2])
def test_rope_kv_write_f16_is_torch_half_of_the_f32_result(threads):
    cpu_native.set_threads(threads)
    g = torch.Generator().manual_seed(15)
    for T, hq, hkv, d, dv, cap, start, fused in [(1, 32, 8, 128, 128, 40, 17, False),
                                                 (70, 32, 8, 128, 128, 80, 3, False),
                                                 (5, 6, 2, 8, 12, 9, 4, True), (3, 4, 4, 16, 16, 3, 0, False)]:
        q_w, k_w, v_w = hq * d, hkv * d, hkv * dv
        qkv = torch.randn(T, q_w + k_w + v_w, generator=g) * 40
        edges = torch.tensor([1e-6, -3e-7, 6e-8, 2.98e-8, 1e-9, 65519.0, 65520.0, -7e4])  # subnormals, inf
        qkv[0, q_w:q_w + 8] = edges * 1e-3  # K: rotated, so scaled into the rotation's range
        qkv[0, q_w + k_w:q_w + k_w + 8] = edges  # V: copied as is
        if fused:
            q, k, v = (t.reshape(T, -1, n) for t, n in zip(qkv.split([q_w, k_w, v_w], -1), (d, d, dv)))
        else:
            q, k, v = (t.reshape(T, -1, n).clone() for t, n in zip(qkv.split([q_w, k_w, v_w], -1), (d, d, dv)))
        cq, sq, ck, sk = (torch.randn(T, d, generator=g) for _ in range(4))
        k_cache = torch.randn(hkv, cap, d, generator=g).half()
        v_cache = torch.randn(hkv, cap, dv, generator=g).half()
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want_k[:, start:start + T] = rope_reference(k, ck, sk).transpose(0, 1).half()
        want_v[:, start:start + T] = v.transpose(0, 1).half()
        want_q = rope_reference(q, cq, sq)
        cpu_native.rope_kv_write(q, k, v, cq, sq, ck, sk, k_cache, v_cache, start)
        assert torch.equal(q, want_q)  # rotated in place, float32 as before
        # bit patterns (inf and every rounding included), and nothing else written
        assert torch.equal(k_cache.view(torch.int16), want_k.view(torch.int16))
        assert torch.equal(v_cache.view(torch.int16), want_v.view(torch.int16))


def test_rope_kv_write_f16_rounds_every_binary16_case_as_torch():
    """Values (the V copy: no arithmetic) over the whole float32 range, random bit patterns
    included: round to nearest even, ties, subnormals, overflow to inf, NaN."""
    g = torch.Generator().manual_seed(16)
    n = 1 << 14
    bits = torch.randint(-(1 << 31), 1 << 31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    near = torch.randint(0x33000000 - 4, 0x47800000 + 4, (n,), generator=g, dtype=torch.int64)
    near = (near | (torch.randint(0, 2, (n,), generator=g) << 31)).to(torch.int64)
    near = torch.where(near >= 1 << 31, near - (1 << 32), near).to(torch.int32)
    ties = (torch.arange(0x38800000, 0x38800000 + (n << 13), 1 << 13, dtype=torch.int64) | 0x1000).to(torch.int32)
    vals = torch.cat([bits.view(torch.float32), near.view(torch.float32), ties.view(torch.float32)])
    T = vals.numel() // 16
    v = vals[:T * 16].reshape(T, 1, 16).contiguous()
    q, k = torch.zeros(T, 1, 2), torch.zeros(T, 1, 2)
    tables = [torch.zeros(T, 2)] * 4
    k_cache, v_cache = torch.zeros(1, T, 2, dtype=torch.float16), torch.zeros(1, T, 16, dtype=torch.float16)
    cpu_native.rope_kv_write(q, k, v, *tables, k_cache, v_cache, 0)
    want = v.transpose(0, 1).half()
    assert torch.equal(v_cache.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("threads", [1, 2])
def test_attend_f16_cache_is_the_f32_kernel_on_the_rounded_values(threads):
    cpu_native.set_threads(threads)
    g = torch.Generator().manual_seed(17)
    for T, H, hkv, d, dv, cap, start in SHAPES:
        q = torch.randn(T, H, d, generator=g)
        keys = (torch.randn(hkv, cap, d, generator=g) * 2).half()
        values = torch.randn(hkv, cap, dv, generator=g).half()
        out = cpu_native.attend_causal(q, keys, values, start)
        assert out.shape == (T, H * dv)
        assert torch.equal(out, cpu_native.attend_causal(q, keys.float(), values.float(), start))
        torch.testing.assert_close(out.double(), attention_reference(q, keys, values, start), rtol=1e-5, atol=1e-5)
        if T == 1:
            dec = cpu_native.attend_decode(q[0], keys, values, start + 1)
            assert torch.equal(dec, cpu_native.attend_decode(q[0], keys.float(), values.float(), start + 1))
            assert torch.equal(dec, out.reshape(H, dv))


def test_rope_kv_attend_f16_writes_then_reads_the_rounded_rows():
    g = torch.Generator().manual_seed(18)
    for T, H, hkv, d, dv, cap, start in [(1, 8, 2, 64, 64, 600, 512), (40, 8, 2, 64, 64, 80, 7)]:
        q, k = torch.randn(T, H, d, generator=g), torch.randn(T, hkv, d, generator=g)
        v = torch.randn(T, hkv, dv, generator=g)
        tables = [torch.randn(T, d, generator=g) for _ in range(4)]
        k16 = torch.randn(hkv, cap, d, generator=g).half()
        v16 = torch.randn(hkv, cap, dv, generator=g).half()
        k32, v32 = k16.float(), v16.float()
        q16, q32 = q.clone(), q.clone()
        out16 = cpu_native.rope_kv_attend(q16, k, v, *tables, k16, v16, start)
        cpu_native.rope_kv_write(q32, k, v, *tables, k32, v32, start)
        k32, v32 = k32.half().float(), v32.half().float()  # what the float16 cache holds
        assert torch.equal(k16.float(), k32) and torch.equal(v16.float(), v32)
        assert torch.equal(out16, cpu_native.attend_causal(q32, k32, v32, start))


def test_kv_f16_calls_refuse_mixed_or_other_dtypes():
    q, k, v = torch.zeros(2, 4, 8), torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)
    tables = [torch.zeros(2, 8)] * 4
    c16, c32 = torch.zeros(2, 5, 8, dtype=torch.float16), torch.zeros(2, 5, 8)
    with pytest.raises(ValueError, match="must both be float32 or both float16"):
        cpu_native.rope_kv_write(q, k, v, *tables, c16, c32, 0)
    with pytest.raises(ValueError, match="must both be float32 or both float16"):
        cpu_native.attend_causal(q, c16, c16.bfloat16(), 0)
    with pytest.raises(ValueError, match="must both be float32 or both float16"):
        cpu_native.attend_decode(q[0], c16.double(), c16.double(), 1)
    with pytest.raises(ValueError, match="element size"):  # the binding's own check
        cpu_native._cpu.attend_causal(q.data_ptr(), c16.data_ptr(), c16.data_ptr(), torch.empty(2, 32).data_ptr(),
                                      2, 4, 2, 8, 8, 0, 32, 32, 40, 8, 40, 8, 0.5, 8)


def test_decode_layers_f16_cache_is_the_per_op_path():
    """DecodeLayers over float16 caches against rope_kv_attend over float16 caches with torch's
    matmuls, RMSNorm and SwiGLU around it (float32 weights). The two sides' matmuls differ by
    float32 rounding (~1e-6 relative), so a K/V element may round to the neighbouring float16
    (one ulp, 2^-10 relative) and the rows agree within 1e-3; reading the float16 cache as float32
    (a missing element size) would be off by O(1). A table mixing float32 and float16 is refused."""
    g = torch.Generator().manual_seed(19)
    hidden, hq, hkv, d, ffn, cap = 64, 4, 2, 16, 96, 12
    shapes = [(hq * d, hidden), (hkv * d, hidden), (hkv * d, hidden), (hidden, hq * d), (ffn, hidden),
              (ffn, hidden), (hidden, ffn)]
    weights = [torch.randn(o, i, generator=g) * 0.2 for o, i in shapes]
    plans = [(gt.F32, w.data_ptr(), w.shape[1] * 4, w.shape[0], w.shape[1]) for w in weights]
    norms = (torch.rand(hidden, generator=g) + 0.5, torch.rand(hidden, generator=g) + 0.5)
    caches = [torch.randn(hkv, cap, d, generator=g).half() for _ in range(4)]
    ref = [c.clone() for c in caches]
    layers = [(*norms, plans, caches[0], caches[1]), (*norms, plans, caches[2], caches[3])]
    step = cpu_native.DecodeLayers(layers, hidden, hq, hkv, d, d, 1e-5, keep=weights)
    tabs = [torch.randn(cap, d, generator=g) for _ in range(4)]
    for pos in (0, 1, 2, 7):
        x = torch.randn(1, hidden, generator=g)
        got = step.run(x, pos, *tabs)
        want = x
        for l in range(2):
            h = cpu_native.rms_norm(want, norms[0], 1e-5)
            qv, kv, vv = (h @ w.T for w in weights[:3])
            sl = slice(pos, pos + 1)
            att = cpu_native.rope_kv_attend(qv.reshape(1, hq, d), kv.reshape(1, hkv, d), vv.reshape(1, hkv, d),
                                            *(t[sl] for t in tabs), ref[2 * l], ref[2 * l + 1], pos)
            want = want + att @ weights[3].T
            h = cpu_native.rms_norm(want, norms[1], 1e-5)
            gate, up = h @ weights[4].T, h @ weights[5].T
            want = want + (F.silu(gate) * up) @ weights[6].T
        for c, r in zip(caches, ref):
            c, r = c[:, :pos + 1].float(), r[:, :pos + 1].float()
            assert ((c - r).abs() <= r.abs() * 2 ** -10 + 2 ** -24).all()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="like layer 0's"):
        cpu_native.DecodeLayers([layers[0], (*norms, plans, caches[2].float(), caches[3].float())],
                                hidden, hq, hkv, d, d, 1e-5)
