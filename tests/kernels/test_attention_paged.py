"""The paged forms of the Triton attention kernel (kernels/attention.py: paged_attention,
paged_decode_attention) under the interpreter, against float64 attention over the positions
gathered through the block table here, and equal to the contiguous kernel over a cache holding
the same positions. Blocks shuffled and shared between sequences, positions across block edges,
block sizes 16 and 32 (the key tile, 64, spans blocks), R = 1, 3, 8 rows at different positions,
unused pool blocks and table entries filled with junk."""
from __future__ import annotations

import pytest
import torch

from tramontane.kernels import attention as attn
from tramontane.kernels.triton_compat import triton_usable

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# as tests/kernels/test_attention.py: max |kernel - float64| over max |float64 output|
TOL = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3, torch.float32: 2e-6}
JUNK = 1e4  # in every pool row no table entry of a test points at


def expected(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """float64 over contiguous (kv, S, d) keys: row t is position start + t and sees positions
    0..start + t; head h uses KV head h // n_rep."""
    T, n_heads, d = q.shape
    n_rep = n_heads // keys.shape[0]
    pos = torch.arange(start, start + T)[:, None]
    key_pos = torch.arange(start + T)[None, :]
    out = torch.empty(T, n_heads, values.shape[-1], dtype=torch.float64)
    for h in range(n_heads):
        k = keys[h // n_rep, :start + T].cpu().double()
        v = values[h // n_rep, :start + T].cpu().double()
        s = (q[:, h].cpu().double() @ k.T / d ** 0.5).masked_fill(key_pos > pos, float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.cpu().double() - ref).abs().max() / ref.abs().max())

pytestmark = pytest.mark.skipif(not triton_usable(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter on CPU: TRITON_INTERPRET=1, see conftest)")


def _pools(n_blocks: int, n_kv: int, block: int, d: int, dtype, seed: int):
    """Pools of junk: only the blocks a test writes through a table hold keys."""
    g = torch.Generator().manual_seed(seed)
    k = torch.full((n_blocks, n_kv, block, d), JUNK)
    v = torch.full((n_blocks, n_kv, block, d), -JUNK)
    return k, v, g


def _sequence(k_pool, v_pool, table: list[int], n_pos: int, g: torch.Generator):
    """Writes n_pos random positions through `table`; returns the contiguous (kv, n_pos, d) K/V."""
    n_kv, block, d = k_pool.shape[1:]
    keys = torch.randn(n_kv, n_pos, d, generator=g)
    values = torch.randn(n_kv, n_pos, d, generator=g)
    for p in range(n_pos):
        k_pool[table[p // block], :, p % block] = keys[:, p]
        v_pool[table[p // block], :, p % block] = values[:, p]
    return keys, values


def _queries(T: int, n_heads: int, d: int, g: torch.Generator) -> torch.Tensor:
    return 1.5 * torch.randn(T, n_heads, d, generator=g)


@pytest.mark.parametrize("block,T,start,dtype", [(16, 7, 0, torch.float32), (16, 9, 23, torch.float32),
                                                 (32, 40, 90, torch.bfloat16), (32, 1, 127, torch.float16)])
def test_paged_prefill_matches_float64_and_the_contiguous_kernel(block, T, start, dtype):
    n_kv, n_rep, d = 2, 3, 64
    n_pos = start + T
    n_table = -(-n_pos // block)
    k_pool, v_pool, g = _pools(n_table + 5, n_kv, block, d, dtype, seed=T + start)
    table = torch.randperm(n_table + 5, generator=g)[:n_table].tolist()  # shuffled, some blocks unused
    keys, values = _sequence(k_pool, v_pool, table, n_pos, g)
    q = _queries(T, n_kv * n_rep, d, g).to(DEV, dtype)
    kp, vp = k_pool.to(DEV, dtype), v_pool.to(DEV, dtype)
    keys, values = keys.to(DEV, dtype), values.to(DEV, dtype)
    tab = torch.tensor(table + [0, 0], dtype=torch.int32, device=DEV)  # spare entries past the rows
    out = attn.paged_attention(q, kp, vp, tab, start, block)
    assert out.shape == (T, n_kv * n_rep, d) and out.dtype == dtype
    err = rel_err(out, expected(q, keys, values, start))
    assert err <= TOL[dtype], f"relative error {err:.2e}"
    contiguous = attn.attention(q, keys, values, start)
    if dtype == torch.float32:
        assert (out - contiguous).abs().max().item() <= 1e-6
    else:
        assert rel_err(out, contiguous.double().cpu()) <= TOL[dtype]


@pytest.mark.parametrize("n_splits", [1, 3])
def test_paged_prefill_split_over_keys(n_splits):
    n_kv, n_rep, d, block, T, start = 1, 2, 32, 16, 5, 200
    n_pos = start + T
    n_table = -(-n_pos // block)
    k_pool, v_pool, g = _pools(n_table, n_kv, block, d, torch.float32, seed=n_splits)
    table = torch.randperm(n_table, generator=g).tolist()
    keys, values = _sequence(k_pool, v_pool, table, n_pos, g)
    q = _queries(T, n_kv * n_rep, d, g)
    out = attn.paged_attention(q.to(DEV), k_pool.to(DEV), v_pool.to(DEV),
                               torch.tensor(table, dtype=torch.int32, device=DEV), start, block, n_splits=n_splits)
    assert rel_err(out, expected(q, keys, values, start)) <= TOL[torch.float32]


@pytest.mark.parametrize("R,block,dtype,pos_dtype", [(1, 16, torch.float32, torch.int64),
                                                     (3, 32, torch.float16, torch.int32),
                                                     (8, 16, torch.float32, torch.int32),
                                                     (3, 16, torch.bfloat16, torch.int64)])
def test_paged_decode_rows_at_their_own_positions(R, block, dtype, pos_dtype):
    """R rows, each its own table (shuffled blocks; rows 0 and 1 share their first block, a
    shared prefix written once), at positions on, before and after block edges; max_keys fixed above them."""
    n_kv, n_rep, d, M = 2, 4, 32, 8
    max_keys = M * block - 3
    positions = [0, block - 1, block, 2 * block + 5, 5, max_keys - 1, 3 * block - 1, 4 * block][:R]
    n_blocks = R * M + 4
    k_pool, v_pool, g = _pools(n_blocks, n_kv, block, d, dtype, seed=R)
    order = torch.randperm(n_blocks, generator=g).tolist()
    tables = [order[r * M:(r + 1) * M] for r in range(R)]
    shared_prefix = R > 1 and positions[1] < block
    if shared_prefix:
        tables[0][0] = tables[1][0]  # row 0 (position 0) reads the first key of row 1's first block
    refs = {}
    for r in [1, 0, *range(2, R)] if shared_prefix else range(R):
        if shared_prefix and r == 0:  # written once, by row 1
            refs[0] = (refs[1][0][:, :positions[0] + 1], refs[1][1][:, :positions[0] + 1])
        else:
            refs[r] = _sequence(k_pool, v_pool, tables[r], positions[r] + 1, g)
    q = _queries(R, n_kv * n_rep, d, g).to(DEV, dtype)
    out = attn.paged_decode_attention(q, k_pool.to(DEV, dtype), v_pool.to(DEV, dtype),
                                      torch.tensor(tables, dtype=torch.int32, device=DEV),
                                      torch.tensor(positions, dtype=pos_dtype, device=DEV), block, max_keys)
    assert out.shape == (R, n_kv * n_rep, d) and out.dtype == dtype
    for r in range(R):
        keys, values = (t.to(DEV, dtype) for t in refs[r])
        err = rel_err(out[r:r + 1], expected(q[r:r + 1], keys, values, positions[r]))
        assert err <= TOL[dtype], f"row {r} at {positions[r]}: relative error {err:.2e}"
        if dtype == torch.float32:  # the contiguous kernel on the same keys
            one = attn.decode_attention(q[r:r + 1], keys, values, torch.tensor([positions[r]], device=DEV),
                                        keys.shape[1])
            assert (out[r] - one[0]).abs().max().item() <= 1e-6


@pytest.mark.parametrize("n_splits", [1, 4])
def test_paged_decode_negative_position_is_zeros_and_others_unchanged(n_splits):
    """A padding row (position -1) reads nothing and yields zeros, with or without split keys."""
    n_kv, n_rep, d, block, M = 1, 2, 32, 16, 4
    k_pool, v_pool, g = _pools(M, n_kv, block, d, torch.float32, seed=7)
    table = torch.randperm(M, generator=g).tolist()
    keys, values = _sequence(k_pool, v_pool, table, 50, g)
    q = _queries(2, n_kv * n_rep, d, g)
    out = attn.paged_decode_attention(q, k_pool, v_pool, torch.tensor([table, table], dtype=torch.int32),
                                      torch.tensor([49, -1], dtype=torch.int32), block, M * block,
                                      n_splits=n_splits)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert rel_err(out[:1], expected(q[:1], keys, values, 49)) <= TOL[torch.float32]


def test_bad_tables_raise_value_error():
    pool = torch.zeros(4, 2, 16, 32)
    q = torch.zeros(3, 4, 32)
    table = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="int32"):
        attn.paged_attention(q, pool, pool, table.long(), 0, 16)
    with pytest.raises(ValueError, match="block_size 32"):
        attn.paged_attention(q, pool, pool, table, 0, 32)
    with pytest.raises(ValueError, match="outside a block table of 4 blocks"):
        attn.paged_attention(q, pool, pool, table, 62, 16)
    tables = torch.zeros(3, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="max_keys 65"):
        attn.paged_decode_attention(q, pool, pool, tables, torch.zeros(3, dtype=torch.int32), 16, 65)
    with pytest.raises(ValueError, match="positions"):
        attn.paged_decode_attention(q, pool, pool, tables, torch.zeros(2, dtype=torch.int32), 16, 64)
