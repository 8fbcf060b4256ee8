"""The native CPU kernels over paged KV (kernels/cpu_native.py: paged_attend_causal,
paged_rope_kv_write, paged_rope_kv_attend, paged_attend_decode, paged_rope_kv_attend_decode, and
DecodeLayers with block_size).

Pools (n_blocks, Hkv, B, d) hold the rows of a contiguous cache scattered into shuffled blocks (the
other blocks hold noise, so a wrong block read shows). Each paged result must be torch.equal to
the contiguous call on the same rows: the contiguous cache is a pool of one block and both go
through one row loop (blocks in table order, rows in order), so the sums are the same sums. Against
float64 sdpa (support.cpu_reference.attention_reference) within 1e-5, the contiguous kernels'
tolerance in test_cpu_fused.py (float32 accumulation over at most ~100 keys here). Every variant
this CPU can force, one thread and the pool.
"""
from __future__ import annotations

import pytest
import torch

from tramontane.kernels import cpu_native

from support.cpu_reference import attention_reference

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE,
                                 reason=f"native CPU kernels not built: {cpu_native.IMPORT_ERROR}"),
              pytest.mark.usefixtures("restore_cpu_kernel_settings")]

KV_DTYPES = [torch.float32, torch.float16]
# (T, start) for B 16 and 32: one row at a block's first / last row, rows across one or more block
# edges, starts that are not a multiple of B, up to 70 rows
ROWS = [(1, 0), (1, 15), (1, 16), (1, 31), (1, 32), (2, 15), (7, 13), (17, 16), (33, 15), (40, 0), (70, 5),
        (64, 0), (3, 61)]


def _pools(g, n_blocks, hkv, B, d, dv, dtype):
    """Noise pools: any row a kernel reads that it should not changes its result."""
    return (torch.randn(n_blocks, hkv, B, d, generator=g).to(dtype),
            torch.randn(n_blocks, hkv, B, dv, generator=g).to(dtype))


def _table(g, n_blocks, n_used):
    """n_used distinct blocks of the pool in a shuffled order."""
    return torch.randperm(n_blocks, generator=g)[:n_used].to(torch.int32)


def _gather(pool, table, n):
    """The contiguous cache (Hkv, n, d) of a sequence's first n positions (a copy)."""
    B = pool.shape[2]
    rows = [pool[int(table[p // B]), :, p % B] for p in range(n)]
    return torch.stack(rows, 1).contiguous() if rows else pool.new_empty(pool.shape[1], 0, pool.shape[3])


def _rope_tables(g, T, d):
    return [torch.randn(T, d, generator=g) for _ in range(4)]


@pytest.mark.cpu_variants
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("B", [16, 32])
def test_paged_attend_causal_is_the_contiguous_result(cpu_variant, threads, dtype, B):
    cpu_native.set_threads(threads)
    g = torch.Generator().manual_seed(B * 7 + threads)
    for (T, start), (H, hkv, d, dv) in zip(ROWS, [(8, 2, 64, 64), (12, 3, 40, 24)] * len(ROWS)):
        n = start + T
        n_used = (n + B - 1) // B
        k_pool, v_pool = _pools(g, n_used + 3, hkv, B, d, dv, dtype)
        table = _table(g, n_used + 3, n_used + 1)  # one entry past the rows: never read
        q = torch.randn(T, H, d, generator=g)
        got = cpu_native.paged_attend_causal(q, k_pool, v_pool, table, start, B)
        kc, vc = _gather(k_pool, table, n), _gather(v_pool, table, n)
        want = cpu_native.attend_causal(q, kc, vc, start)
        assert got.shape == (T, H * dv)
        assert torch.equal(got, want), (T, start, float((got - want).abs().max()))
        torch.testing.assert_close(got.double(), attention_reference(q, kc, vc, start), rtol=1e-5, atol=1e-5)


def test_a_contiguous_cache_is_a_pool_of_one_block():
    """attend_causal's cache (Hkv, capacity, d) read as the pool (1, Hkv, capacity, d), table [0]."""
    g = torch.Generator().manual_seed(3)
    kc, vc = torch.randn(2, 50, 32, generator=g), torch.randn(2, 50, 32, generator=g)
    for T, start in [(1, 0), (1, 49), (9, 30), (50, 0)]:
        q = torch.randn(T, 8, 32, generator=g)
        got = cpu_native.paged_attend_causal(q, kc[None], vc[None], torch.zeros(1, dtype=torch.int32), start, 50)
        assert torch.equal(got, cpu_native.attend_causal(q, kc, vc, start))


@pytest.mark.cpu_variants
@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("B", [16, 32])
def test_paged_rope_kv_attend_writes_through_the_table(cpu_variant, dtype, B):
    """The fused RoPE + KV write + attention: the rows land in the table's blocks (nothing else in the
    pool changes), q is rotated as the contiguous call rotates it, the output is the contiguous one."""
    cpu_native.set_threads(2)
    g = torch.Generator().manual_seed(B + 11)
    H, hkv, d, dv = 8, 2, 32, 48
    for T, start in ROWS:
        n = start + T
        n_used = (n + B - 1) // B
        k_pool, v_pool = _pools(g, n_used + 2, hkv, B, d, dv, dtype)
        table = _table(g, n_used + 2, n_used)
        q = torch.randn(T, H, d, generator=g)
        k, v = torch.randn(T, hkv, d, generator=g), torch.randn(T, hkv, dv, generator=g)
        tables = _rope_tables(g, T, d)
        kc, vc = _gather(k_pool, table, n), _gather(v_pool, table, n)
        k_before, v_before = k_pool.clone(), v_pool.clone()
        q_contig = q.clone()
        want = cpu_native.rope_kv_attend(q_contig, k, v, *tables, kc, vc, start)
        got = cpu_native.paged_rope_kv_attend(q, k, v, *tables, k_pool, v_pool, table, start, B)
        assert torch.equal(q, q_contig)
        assert torch.equal(got, want), (T, start, float((got - want).abs().max()))
        assert torch.equal(_gather(k_pool, table, n), kc) and torch.equal(_gather(v_pool, table, n), vc)
        written = torch.zeros(k_pool.shape[0], B, dtype=torch.bool)
        for p in range(start, n):
            written[int(table[p // B]), p % B] = True
        untouched = ~written[:, None, :].expand(-1, hkv, -1)
        assert torch.equal(k_pool[untouched], k_before[untouched])
        assert torch.equal(v_pool[untouched], v_before[untouched])
        torch.testing.assert_close(got.double(), attention_reference(q, kc, vc, start), rtol=1e-5, atol=1e-5)

        # the write alone is rope_kv_write's
        k_pool2, v_pool2 = k_before.clone(), v_before.clone()
        kc2, vc2 = _gather(k_before, table, n), _gather(v_before, table, n)
        q2, q3 = q_contig.clone(), q_contig.clone()
        cpu_native.rope_kv_write(q2, k, v, *tables, kc2, vc2, start)
        cpu_native.paged_rope_kv_write(q3, k, v, *tables, k_pool2, v_pool2, table, start, B)
        assert torch.equal(q2, q3) and torch.equal(k_pool2, k_pool) and torch.equal(v_pool2, v_pool)


def _decode_batch(g, R, B, hkv, d, dv, dtype, shared):
    """R sequences of different lengths (positions), every third a padding row (-1), tables of M
    entries into one pool; `shared`: every sequence's first block is the same block (a shared prefix)."""
    lengths = [int(x) for x in torch.randint(1, 3 * B + 5, (R,), generator=g)]
    positions = torch.tensor([n - 1 if r % 3 != 2 else -1 for r, n in enumerate(lengths)], dtype=torch.int32)
    M = max((n + B - 1) // B for n in lengths) + 1
    n_blocks = R * M + 1
    k_pool, v_pool = _pools(g, n_blocks, hkv, B, d, dv, dtype)
    tables = torch.randperm(n_blocks, generator=g)[:R * M].to(torch.int32).reshape(R, M)
    if shared:
        tables[:, 0] = tables[0, 0]
    tables[positions < 0] = 10 ** 6  # a padding row's table is never read
    return positions, tables, k_pool, v_pool


@pytest.mark.cpu_variants
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("B", [16, 32])
def test_paged_attend_decode_is_each_row_alone(cpu_variant, threads, dtype, B):
    """R = 1..9 rows at their own positions over their own tables: each row is the contiguous decode of
    its sequence, bit for bit; padding rows are zeros."""
    cpu_native.set_threads(threads)
    g = torch.Generator().manual_seed(B * 3 + threads)
    for R, (H, hkv, d, dv), shared in [(1, (8, 2, 64, 64), False), (2, (8, 2, 64, 64), True),
                                       (5, (12, 3, 40, 24), False), (9, (8, 2, 64, 64), True)]:
        positions, tables, k_pool, v_pool = _decode_batch(g, R, B, hkv, d, dv, dtype, shared)
        q = torch.randn(R, H, d, generator=g)
        got = cpu_native.paged_attend_decode(q, k_pool, v_pool, tables, positions, B)
        assert got.shape == (R, H * dv)
        for r in range(R):
            p = int(positions[r])
            if p < 0:
                assert torch.equal(got[r], torch.zeros(H * dv))
                continue
            kc, vc = _gather(k_pool, tables[r], p + 1), _gather(v_pool, tables[r], p + 1)
            want = cpu_native.attend_decode(q[r], kc, vc, p + 1).reshape(-1)
            assert torch.equal(got[r], want), (R, r, p, float((got[r] - want).abs().max()))
            one = cpu_native.paged_attend_causal(q[r:r + 1], k_pool, v_pool, tables[r], p, B)
            assert torch.equal(got[r], one[0])
            torch.testing.assert_close(got[r].double(), attention_reference(q[r:r + 1], kc, vc, p)[0],
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.cpu_variants
@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_paged_rope_kv_attend_decode_is_each_row_alone(cpu_variant, dtype):
    """The batched decode step's fused call = each row's paged_rope_kv_attend (T = 1) in turn: the same
    rows written, the same q rotation, the same output; padding rows write nothing and give zeros."""
    cpu_native.set_threads(2)
    g = torch.Generator().manual_seed(21)
    B, H, hkv, d, dv = 16, 8, 2, 32, 32
    for R in (1, 4, 9):
        positions, tables, k_pool, v_pool = _decode_batch(g, R, B, hkv, d, dv, dtype, shared=False)
        q = torch.randn(R, H, d, generator=g)
        k, v = torch.randn(R, hkv, d, generator=g), torch.randn(R, hkv, dv, generator=g)
        tabs = _rope_tables(g, R, d)
        k_one, v_one, q_one = k_pool.clone(), v_pool.clone(), q.clone()
        got = cpu_native.paged_rope_kv_attend_decode(q, k, v, *tabs, k_pool, v_pool, tables, positions, B)
        for r in range(R):
            p = int(positions[r])
            if p < 0:
                assert torch.equal(got[r], torch.zeros(H * dv))
                continue
            row = slice(r, r + 1)
            want = cpu_native.paged_rope_kv_attend(q_one[row], k[row], v[row], *[t[row] for t in tabs], k_one,
                                                   v_one, tables[r], p, B)
            assert torch.equal(got[r], want[0])
        assert torch.equal(q[positions >= 0], q_one[positions >= 0])
        assert torch.equal(k_pool, k_one) and torch.equal(v_pool, v_one)


def test_paged_calls_refuse_what_does_not_fit():
    g = torch.Generator().manual_seed(5)
    k_pool, v_pool = _pools(g, 4, 2, 16, 32, 32, torch.float32)
    q = torch.randn(3, 8, 32, generator=g)
    ok = torch.tensor([2, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match="not a block of the pool"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool, torch.tensor([1, 4], dtype=torch.int32), 14, 16)
    with pytest.raises(ValueError, match="not a block of the pool"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool, torch.tensor([-1], dtype=torch.int32), 0, 16)
    with pytest.raises(ValueError, match="past a block table"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool, ok, 30, 16)  # rows 30..32 of a 32-row table
    with pytest.raises(ValueError, match="pools must be"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool, ok, 0, 32)  # blocks of 16, not 32
    with pytest.raises(ValueError, match="pools must be"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool[:3], ok, 0, 16)
    with pytest.raises(ValueError, match="float32 or both float16"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool.half(), ok, 0, 16)
    with pytest.raises(ValueError, match="block table"):
        cpu_native.paged_attend_causal(q, k_pool, v_pool, ok.float(), 0, 16)
    rows = torch.randn(2, 8, 32, generator=g)
    with pytest.raises(ValueError, match="past a block table"):
        cpu_native.paged_attend_decode(rows, k_pool, v_pool, torch.zeros(2, 1, dtype=torch.int32),
                                       torch.tensor([3, 16], dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="positions"):
        cpu_native.paged_attend_decode(rows, k_pool, v_pool, torch.zeros(2, 1, dtype=torch.int32),
                                       torch.tensor([3], dtype=torch.int32), 16)
    k, v = torch.randn(3, 2, 32, generator=g), torch.randn(3, 2, 32, generator=g)
    with pytest.raises(ValueError, match="not a block of the pool"):
        cpu_native.paged_rope_kv_write(q, k, v, *_rope_tables(g, 3, 32), k_pool, v_pool,
                                       torch.tensor([0, 9], dtype=torch.int32), 15, 16)


def _f32_plan(g, out_features, in_features, keep):
    """A float32 weight as DecodeLayers takes it: (ggml type, pointer, row bytes, out, in)."""
    from tramontane.kernels import ggml_types as gt

    w = torch.randn(out_features, in_features, generator=g) * in_features ** -0.5
    keep.append(w)
    return (gt.F32, w.data_ptr(), in_features * 4, out_features, in_features)


@pytest.mark.cpu_variants
@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_paged_decode_layers_are_the_contiguous_steps(cpu_variant, dtype):
    """The whole-step decode over pools and a block table: every step's hidden row and every written
    K/V row bit for bit the contiguous DecodeLayers', across block edges (B = 16, positions 0..40)."""
    cpu_native.set_threads(2)
    g = torch.Generator().manual_seed(8)
    hidden, H, hkv, d, ffn, B, n_pos = 64, 8, 2, 16, 96, 16, 41
    keep = []
    shapes = [(H * d, hidden), (hkv * d, hidden), (hkv * d, hidden), (hidden, H * d), (ffn, hidden), (ffn, hidden),
              (hidden, ffn)]
    n_blocks = (n_pos + B - 1) // B + 2
    table = _table(g, n_blocks, n_blocks - 1)
    contig, paged, pools = [], [], []
    for _ in range(2):
        plans = [_f32_plan(g, o, i, keep) for o, i in shapes]
        norms = (1 + 0.1 * torch.randn(hidden, generator=g), 1 + 0.1 * torch.randn(hidden, generator=g))
        caches = [torch.zeros(hkv, n_pos, d, dtype=dtype) for _ in range(2)]
        layer_pools = list(_pools(g, n_blocks, hkv, B, d, d, dtype))
        contig.append((*norms, plans, *caches))
        paged.append((*norms, plans, *layer_pools))
        pools.append((caches, layer_pools))
    step_c = cpu_native.DecodeLayers(contig, hidden, H, hkv, d, d, 1e-5)
    step_p = cpu_native.DecodeLayers(paged, hidden, H, hkv, d, d, 1e-5, block_size=B)
    tabs = [torch.randn(n_pos, d, generator=g) for _ in range(4)]
    for pos in range(n_pos):
        x = torch.randn(1, hidden, generator=g)
        want = step_c.run(x, pos, *tabs)
        got = step_p.run(x, pos, *tabs, block_table=table)
        assert torch.equal(got, want), (pos, float((got - want).abs().max()))
    for caches, layer_pools in pools:
        for cache, pool in zip(caches, layer_pools):
            assert torch.equal(_gather(pool, table, n_pos), cache)
    with pytest.raises(ValueError, match="block table"):
        step_p.run(x, 3, *tabs)
    with pytest.raises(ValueError, match="not a block of the pool"):
        step_p.run(x, 3, *tabs, block_table=torch.full((4,), n_blocks, dtype=torch.int32))
