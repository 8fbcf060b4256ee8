"""Causal attention over the KV cache on the GPU: one Triton flash-attention kernel.

Paged: `paged_attention(q, k_pool, v_pool, block_table, start, block_size)` (one sequence's T
rows) and `paged_decode_attention(q, k_pool, v_pool, block_tables, positions, block_size,
max_keys)` (R rows, one per sequence, each at its device position; out (R, heads, d_v)) read
K/V from one layer's pools (n_blocks, kv_heads, block_size, d) through int32 block tables:
position p is row p % block_size of block table[p // block_size] (a key tile may span blocks).
The contiguous `attention` / `decode_attention` below are the same kernel over one block of
`capacity` rows (table [[0]]), thin wrappers until every caller is paged.

`attention(q, cache_k, cache_v, start)`: T new query rows at positions [start, start + T)
attend to the cache's first S = start + T keys, causal aligned to the bottom right (row t sees
keys <= S - T + t). `decode_attention(q, cache_k, cache_v, pos, bucket)`: one row at the device
position `pos` over a fixed key bucket, keys > pos hidden inside the kernel (no float mask, no
host sync: a CUDA graph body).

The kernel (FlashAttention-2's loop):
  * Grouped-query attention without expanding K/V: a program owns one KV head g and BLOCK_M
    "rows", each a (query row t, head in group r) pair (row m = t * n_rep + r, query head
    g * n_rep + r). Every key/value tile it loads serves all n_rep heads of the group, and one
    decode row is n_rep rows of a tile, not n_rep programs.
  * K/V read in place from the cache layout (kv_heads, capacity, head_dim) through its strides.
  * Online softmax in base 2 with float32 running max / sum and a float32 accumulator; QK^T and
    PV on tensor cores (tl.dot) in the input dtype, bf16 or fp16 (float32 inputs: IEEE float32
    products, not TF32). The decode step's loop stops at pos: the bucket's tail is never read.
  * Optional split over keys (flash-decoding): when rows x KV heads give too few programs to
    fill the GPU (decode, short turns over a long cache) each program takes one key range and
    writes float32 (acc, max, sum) partials; `_combine_kernel` merges them per row.
Scratch: the output (T, heads, d) and, when split, float32 partials bounded by the SM count
(scratch_bytes): O(T x head_dim), never O(T x S).

Tiles: BLOCK_M = 64 rows (prefill) / 16 (T * n_rep <= 16: decode; tl.dot's smallest M),
BLOCK_N = 64 keys, 4 warps, 2 stages. Offline compile of the paged kernel at head_dim 128, bf16
(ptxas, Triton 3.9): sm_90 64-row tile 204 registers (184 split), 16-row decode 115 (93 split),
no spills; decode spills nowhere from sm_80 (fp16 on sm_75: 832 B), the 64-row prefill tile
without split 56-80 B on sm_80-89 / 120; shared memory 81 KiB (sm_90/100) / 56 KiB (sm_80-89,
120) for prefill, 38-40 KiB for decode. The block stride must be a multiple of 16 elements for
the compiled claims (16-byte row loads). No GPU was lent while writing this: tile sizes, warps
and the gather's cost to be confirmed on one.

Interpreter caveat: Triton 3.9's interpreter multiplies bf16 tiles wrongly, so under it bf16
products go through float32 (DOT_F32, exact products as on a tensor core).
"""
from __future__ import annotations

import torch

from .triton_compat import HAVE_TRITON, interpreting, launch, tl, triton
from .triton_compat import sm_count as _sm_count  # tests patch it here

LOG2E = 1.4426950408889634
BLOCK_N = 64
PREFILL_BLOCK_M = 64
DECODE_BLOCK_M = 16
NUM_WARPS = 4
NUM_STAGES = 2
MAX_SPLITS = 64  # key ranges a row may be split into (partials: MAX_SPLITS x rows x d_v floats at most)
COMBINE_BLOCK_R = 16  # rows a combine program merges


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr):
    # Float32 products: for float32 inputs on a GPU (not TF32's 10-bit mantissas), and under the
    # interpreter for bf16 (Triton 3.9 multiplies bf16 tiles wrongly there; the products of bf16
    # values are exact in float32, as on a tensor core, and the sum is float32 either way).
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, part_ptr, stat_ptr, pos_ptr, table_ptr,
                      T, S, n_rep, n_rows, keys_per_split, block_size,
                      stride_qt, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                      stride_ot, stride_oh, stride_tr,
                      qk_scale,
                      HEAD_DIM: tl.constexpr, V_HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      POS_FROM_PTR: tl.constexpr, SPLIT: tl.constexpr, DOT_F32: tl.constexpr):
    row_blocks = tl.cdiv(n_rows, BLOCK_M)
    seq = tl.program_id(0) // row_blocks  # batched decode: one sequence per row block group; else 0
    pid_m = tl.program_id(0) % row_blocks
    g = tl.program_id(1)  # KV head
    split = tl.program_id(2)
    n_kv = tl.num_programs(1)
    n_seqs = tl.num_programs(0) // row_blocks
    if POS_FROM_PTR:  # decode: sequence seq's row at its device position, at most S (max_keys) keys
        S = tl.minimum(tl.load(pos_ptr + seq).to(tl.int32) + 1, S)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = m < n_rows
    t = m // n_rep
    head = g * n_rep + m % n_rep
    last_key = S - T + t  # lower-right causal: row t sees keys [0, S - T + t]
    t = seq * T + t  # the row of q / out
    table = table_ptr + seq * stride_tr
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)

    q = tl.load(q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)

    # keys this program visits: its split's range, cut at the last key its last row sees
    m_last = tl.minimum(pid_m * BLOCK_M + BLOCK_M, n_rows) - 1
    lo = split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, S - T + m_last // n_rep + 1)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    k_base = k_ptr + g * stride_kh
    v_base = v_ptr + g * stride_vh
    for start_n in range(lo, hi, BLOCK_N):
        j = start_n + tl.arange(0, BLOCK_N)
        key_ok = j < hi
        # position j lives in block table[j // block_size], row j % block_size
        blk = tl.load(table + j // block_size, mask=key_ok, other=0)
        row = j % block_size
        k = tl.load(k_base + (blk * stride_kb + row * stride_ks)[None, :] + d[:, None],
                    mask=key_ok[None, :] & (d[:, None] < HEAD_DIM), other=0.0)  # (BLOCK_D, BLOCK_N)
        s = _dot(q, k, DOT_F32) * qk_scale
        s = tl.where(j[None, :] <= last_key[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with no visible key yet keeps max -inf: subtract 0 instead (exp2(-inf) = 0, no NaN)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + (blk * stride_vb + row * stride_vs)[:, None] + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < V_HEAD_DIM), other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_F32)
        m_i = m_new

    if SPLIT:  # float32 partials (split, kv head, row): merged by _combine_kernel
        slot = (split * n_kv + g) * (n_seqs * n_rows) + seq * n_rows + m
        tl.store(part_ptr + slot[:, None] * V_HEAD_DIM + dv[None, :], acc,
                 mask=row_ok[:, None] & (dv[None, :] < V_HEAD_DIM))
        tl.store(stat_ptr + 2 * slot, m_i, mask=row_ok)
        tl.store(stat_ptr + 2 * slot + 1, l_i, mask=row_ok)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # rows that saw no key (padding, position < 0): 0
        tl.store(o_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < V_HEAD_DIM))


@triton.jit
def _combine_kernel(part_ptr, stat_ptr, o_ptr, n_rep, n_rows, n_splits, stride_ot, stride_oh,
                    V_HEAD_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_R: tl.constexpr):
    """o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s for BLOCK_R rows of one KV head,
    merged split by split with the same running-max rescale as the main loop."""
    m = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    g = tl.program_id(1)
    n_kv = tl.num_programs(1)
    row_ok = m < n_rows
    dv = tl.arange(0, BLOCK_DV)
    tile_ok = row_ok[:, None] & (dv[None, :] < V_HEAD_DIM)
    m_run = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    for s in range(0, n_splits):
        slot = (s * n_kv + g) * n_rows + m
        m_s = tl.load(stat_ptr + 2 * slot, mask=row_ok, other=float("-inf"))
        l_s = tl.load(stat_ptr + 2 * slot + 1, mask=row_ok, other=0.0)
        a_s = tl.load(part_ptr + slot[:, None] * V_HEAD_DIM + dv[None, :], mask=tile_ok, other=0.0)
        m_new = tl.maximum(m_run, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # splits past a row's last key: -inf
        w_run = tl.exp2(m_run - m_safe)
        w_s = tl.exp2(m_s - m_safe)
        l_run = l_run * w_run + l_s * w_s
        acc = acc * w_run[:, None] + a_s * w_s[:, None]
        m_run = m_new
    t = m // n_rep
    head = g * n_rep + m % n_rep
    tl.store(o_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
             (acc / tl.where(l_run > 0, l_run, 1.0)[:, None]).to(o_ptr.dtype.element_ty), mask=tile_ok)


def split_plan(n_programs: int, n_keys: int, device: torch.device) -> tuple[int, int]:
    """(n_splits, keys_per_split): split the keys when the row blocks x KV heads alone give
    fewer than two programs per SM; each range a multiple of BLOCK_N, at most MAX_SPLITS."""
    want = triton.cdiv(2 * _sm_count(device), n_programs)
    key_blocks = triton.cdiv(n_keys, BLOCK_N)
    n_splits = max(1, min(want, key_blocks, MAX_SPLITS))
    keys_per_split = triton.cdiv(key_blocks, n_splits) * BLOCK_N
    return triton.cdiv(n_keys, keys_per_split), keys_per_split


def _tile_width(d: int) -> int:
    """Head size rounded up to a power of two (tile shapes), at least 16 (tl.dot's K)."""
    return max(16, 1 << (d - 1).bit_length())


def launch_plan(T: int, n_rep: int, n_kv: int, n_keys: int, device: torch.device,
                n_splits: int | None = None, n_seqs: int = 1) -> tuple[int, int, int]:
    """(BLOCK_M, n_splits, keys_per_split) of one call: T * n_rep rows of each of n_kv heads, for
    each of n_seqs sequences (batched decode), over n_keys keys (max_keys for decode). Up to 16
    rows per sequence (decode, T = 1) take the small tile."""
    n_rows = T * n_rep
    block_m = DECODE_BLOCK_M if n_rows <= DECODE_BLOCK_M else PREFILL_BLOCK_M
    if n_splits is None:
        return (block_m, *split_plan(n_seqs * triton.cdiv(n_rows, block_m) * n_kv, n_keys, device))
    keys_per_split = triton.cdiv(triton.cdiv(n_keys, BLOCK_N), n_splits) * BLOCK_N
    return block_m, triton.cdiv(n_keys, keys_per_split), keys_per_split


def scratch_bytes(T: int, n_heads: int, n_kv: int, v_head_dim: int, elem_size: int, sm_count: int) -> int:
    """Most memory one call allocates, for the memory plan: the output (T, heads, d_v) and, when
    the keys are split, float32 partials (d_v + max + sum) for splits x rows x KV heads, which
    is under 4 * BLOCK_M * SMs (splits only while row blocks x KV heads < 2 x SMs) and under
    MAX_SPLITS x T x heads; independent of the key count. Batched decode of R rows: T = R."""
    partial_rows = min(4 * PREFILL_BLOCK_M * sm_count, MAX_SPLITS * T * n_heads)
    return T * n_heads * v_head_dim * elem_size + partial_rows * (v_head_dim + 2) * 4


def _check_pools(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_size: int) -> None:
    if q.dim() != 3 or k_pool.dim() != 4 or v_pool.dim() != 4:
        raise ValueError(f"paged attention wants q (rows, heads, d) and one layer's pools (n_blocks, kv_heads, "
                         f"block_size, d), got {tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    if (q.shape[1] % k_pool.shape[1] or q.shape[2] != k_pool.shape[3] or v_pool.shape[:3] != k_pool.shape[:3]):
        raise ValueError(f"query heads/size {tuple(q.shape[1:])} do not fit the cache's K {tuple(k_pool.shape)} "
                         f"/ V {tuple(v_pool.shape)}")
    if k_pool.shape[2] != block_size:
        raise ValueError(f"block_size {block_size} is not the pools' {k_pool.shape[2]} rows per block")
    if q.stride(-1) != 1 or k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("attention wants rows contiguous in head_dim")
    for pool in (k_pool, v_pool):  # the kernel's offsets are 32-bit
        if sum((n - 1) * st for n, st in zip(pool.shape, pool.stride())) >= 2 ** 31:
            raise ValueError(f"a KV pool of shape {tuple(pool.shape)} is past 32-bit element offsets")


def _check_table(table: torch.Tensor, q: torch.Tensor, dims: int, what: str) -> None:
    if table.dtype != torch.int32 or table.dim() != dims or table.device != q.device or table.stride(-1) != 1:
        raise ValueError(f"{what} must be a contiguous {dims}-D int32 tensor on {q.device}, got "
                         f"{table.dtype} {tuple(table.shape)} on {table.device}")


def _launch(q, k_pool, v_pool, table, block_size: int, T: int, n_keys: int, pos, n_splits: int | None) -> torch.Tensor:
    """Shared by every entry point: T rows per sequence (decode: 1 per sequence, q.shape[0]
    sequences), n_keys is the key count (prefill) or max_keys (decode, keys > each row's
    position hidden in the kernel); pos None or the device positions."""
    n_blocks, n_kv, _, head_dim = k_pool.shape
    n_heads, v_head_dim = q.shape[1], v_pool.shape[3]
    n_rep = n_heads // n_kv
    n_seqs = q.shape[0] // T
    n_rows = T * n_rep  # per sequence
    out = torch.empty(q.shape[0], n_heads, v_head_dim, dtype=q.dtype, device=q.device)
    block_m, n_splits, keys_per_split = launch_plan(T, n_rep, n_kv, n_keys, q.device, n_splits, n_seqs)
    row_blocks = triton.cdiv(n_rows, block_m)
    split = n_splits > 1
    if split:
        part = torch.empty(n_splits, n_kv, n_seqs * n_rows, v_head_dim, dtype=torch.float32, device=q.device)
        stat = torch.empty(n_splits, n_kv, n_seqs * n_rows, 2, dtype=torch.float32, device=q.device)
    else:
        part = stat = out  # unused
    block_d, block_dv = _tile_width(head_dim), _tile_width(v_head_dim)
    qk_scale = LOG2E / head_dim ** 0.5
    launch(
        _attention_kernel, (n_seqs * row_blocks, n_kv, n_splits),
        q, k_pool, v_pool, out, part, stat, pos if pos is not None else out, table,
        T, n_keys, n_rep, n_rows, keys_per_split, block_size,
        # a pool of one block (the contiguous forms) is only ever read at block 0: stride 0, which
        # keeps the compiled claim "block stride a multiple of 16" (16-byte row loads) true
        q.stride(0), q.stride(1), k_pool.stride(0) if n_blocks > 1 else 0, k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0) if n_blocks > 1 else 0, v_pool.stride(1), v_pool.stride(2),
        out.stride(0), out.stride(1), table.stride(0) if table.dim() == 2 else 0, qk_scale,
        HEAD_DIM=head_dim, V_HEAD_DIM=v_head_dim, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_M=block_m,
        BLOCK_N=BLOCK_N, POS_FROM_PTR=pos is not None, SPLIT=split,
        DOT_F32=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and interpreting()),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    if split:
        launch(_combine_kernel, (triton.cdiv(n_seqs * n_rows, COMBINE_BLOCK_R), n_kv),
               part, stat, out, n_rep, n_seqs * n_rows, n_splits, out.stride(0), out.stride(1),
               V_HEAD_DIM=v_head_dim, BLOCK_DV=block_dv, BLOCK_R=COMBINE_BLOCK_R, num_warps=NUM_WARPS, num_stages=1)
    return out


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
                    start: int, block_size: int, n_splits: int | None = None) -> torch.Tensor:
    """One sequence's rows q (T, heads, d) at positions [start, start + T), their K/V already in
    the pools: k_pool (n_blocks, kv_heads, block_size, d), v_pool (n_blocks, kv_heads,
    block_size, d_v); position p is row p % block_size of block block_table[p // block_size]
    (block_table: int32 (M,) on q's device). Row t sees positions [0, start + t]. Returns
    (T, heads, d_v) in q.dtype. n_splits: key ranges (default: split_plan)."""
    _check_pools(q, k_pool, v_pool, block_size)
    _check_table(block_table, q, 1, "block_table")
    T = q.shape[0]
    if start < 0 or start + T > block_table.shape[0] * block_size:
        raise ValueError(f"rows [{start}, {start + T}) outside a block table of {block_table.shape[0]} blocks "
                         f"of {block_size}")
    return _launch(q, k_pool, v_pool, block_table, block_size, T, start + T, None, n_splits)


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_tables: torch.Tensor, positions: torch.Tensor, block_size: int,
                           max_keys: int, n_splits: int | None = None) -> torch.Tensor:
    """R sequences, one row each: q (R, heads, d), row r at the device position positions[r]
    (an (R,) int32 or int64 tensor on q's device) attends to its positions [0, positions[r]],
    read through block_tables[r] (int32 (R, M) on q's device). Shapes, launches and splits
    depend on R, M and max_keys only (a CUDA graph body): max_keys bounds the keys any row
    reads (<= M * block_size; a row past it sees its first max_keys keys), and a row with a
    negative position sees nothing and gets zeros (padding rows of a graph bucket). Returns
    (R, heads, d_v) in q.dtype."""
    _check_pools(q, k_pool, v_pool, block_size)
    _check_table(block_tables, q, 2, "block_tables")
    R = q.shape[0]
    if block_tables.shape[0] != R or positions.shape != (R,) or positions.device != q.device \
            or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"decode of {R} rows wants block_tables (R, M) and int32/int64 positions (R,) on "
                         f"{q.device}, got {tuple(block_tables.shape)} and {positions.dtype} "
                         f"{tuple(positions.shape)} on {positions.device}")
    if not 0 < max_keys <= block_tables.shape[1] * block_size:
        raise ValueError(f"max_keys {max_keys} outside (0, {block_tables.shape[1] * block_size}] "
                         f"(a table of {block_tables.shape[1]} blocks of {block_size})")
    return _launch(q, k_pool, v_pool, block_tables, block_size, 1, max_keys, positions, n_splits)


# The contiguous forms: a cache (kv_heads, capacity, d) is one block of `capacity` rows, the
# table [[0]]. Kept as thin wrappers until every caller uses the paged form.
_ONE_BLOCK_TABLES: dict = {}


def _one_block_table(device: torch.device) -> torch.Tensor:
    table = _ONE_BLOCK_TABLES.get(device)
    if table is None:
        table = torch.zeros(1, 1, dtype=torch.int32, device=device)
        # made during a CUDA graph capture it belongs to the graph's pool: not kept
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _ONE_BLOCK_TABLES[device] = table
    return table


def _check(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
    if q.dim() != 3 or cache_k.dim() != 3 or cache_v.dim() != 3:
        raise ValueError(f"attention wants q (T, heads, d) and one layer's cache (kv_heads, capacity, d), "
                         f"got {tuple(q.shape)}, {tuple(cache_k.shape)}, {tuple(cache_v.shape)}")
    if q.shape[1] % cache_k.shape[0] or q.shape[2] != cache_k.shape[2] or cache_v.shape[:2] != cache_k.shape[:2]:
        raise ValueError(f"query heads/size {tuple(q.shape[1:])} do not fit the cache's K {tuple(cache_k.shape)} "
                         f"/ V {tuple(cache_v.shape)}")


def attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, start: int,
              n_splits: int | None = None) -> torch.Tensor:
    """q (T, heads, d): rows at positions [start, start + T), already in the cache with their
    K/V. cache_k / cache_v: one layer's (kv_heads, capacity, d) views. Returns (T, heads, d_v)
    in q.dtype. n_splits: key ranges (default: split_plan). paged_attention over one block."""
    _check(q, cache_k, cache_v)
    if start < 0 or start + q.shape[0] > cache_k.shape[1]:
        raise ValueError(f"rows [{start}, {start + q.shape[0]}) outside a cache of {cache_k.shape[1]} positions")
    return paged_attention(q, cache_k.unsqueeze(0), cache_v.unsqueeze(0), _one_block_table(q.device)[0],
                           start, cache_k.shape[1], n_splits)


def decode_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, pos: torch.Tensor,
                     bucket: int, n_splits: int | None = None) -> torch.Tensor:
    """q (1, heads, d) at the device position pos (a (1,) integer tensor on q's device): attends
    to keys [0, pos] of the first `bucket` cache positions. Shapes and launches depend on
    bucket only, and pos is read by the kernel: capturable in a CUDA graph.
    paged_decode_attention over one block."""
    _check(q, cache_k, cache_v)
    if q.shape[0] != 1 or bucket > cache_k.shape[1]:
        raise ValueError(f"decode attention takes one row over at most the cache's {cache_k.shape[1]} "
                         f"positions, got {q.shape[0]} rows over {bucket}")
    return paged_decode_attention(q, cache_k.unsqueeze(0), cache_v.unsqueeze(0), _one_block_table(q.device),
                                  pos.reshape(1), cache_k.shape[1], bucket, n_splits)


def attention_reference(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, start: int) -> torch.Tensor:
    """Plain torch (float32 math, K/V expanded per head): what the kernel computes. Memory
    O(T x S): for checks and small shapes only."""
    T, n_heads, head_dim = q.shape
    S = start + T
    n_rep = n_heads // cache_k.shape[0]
    k = cache_k[:, :S].float().repeat_interleave(n_rep, 0)  # (heads, S, d)
    v = cache_v[:, :S].float().repeat_interleave(n_rep, 0)
    scores = torch.einsum("thd,hsd->hts", q.float(), k) / head_dim ** 0.5
    visible = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hts,hsd->thd", probs, v).to(q.dtype)


def _compile_specs() -> list[dict]:
    """The specializations real launches use (head_dim 128, bf16 / fp16 caches), for offline
    compile checks: kernel, signature (Triton type strings), constexprs, launch options, and
    `aligned`: arguments a real launch passes 16-byte aligned / divisible by 16."""
    specs = []
    for dtype in ("bf16", "fp16"):
        for block_m, pos_type in ((PREFILL_BLOCK_M, None), (DECODE_BLOCK_M, None), (DECODE_BLOCK_M, "i64"),
                                  (DECODE_BLOCK_M, "i32")):
            decode = pos_type is not None
            for split in (False, True):
                sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "o_ptr": f"*{dtype}",
                       "part_ptr": "*fp32" if split else f"*{dtype}", "stat_ptr": "*fp32" if split else f"*{dtype}",
                       "pos_ptr": f"*{pos_type}" if decode else f"*{dtype}", "table_ptr": "*i32",
                       "T": "i32", "S": "i32", "n_rep": "i32", "n_rows": "i32", "keys_per_split": "i32",
                       "block_size": "i32",
                       "stride_qt": "i32", "stride_qh": "i32", "stride_kb": "i32", "stride_kh": "i32",
                       "stride_ks": "i32", "stride_vb": "i32", "stride_vh": "i32", "stride_vs": "i32",
                       "stride_ot": "i32", "stride_oh": "i32", "stride_tr": "i32",
                       "qk_scale": "fp32",
                       "HEAD_DIM": "constexpr", "V_HEAD_DIM": "constexpr", "BLOCK_D": "constexpr",
                       "BLOCK_DV": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                       "POS_FROM_PTR": "constexpr", "SPLIT": "constexpr", "DOT_F32": "constexpr"}
                specs.append({
                    "name": f"attention_{'decode_' + pos_type if decode else 'prefill'}_m{block_m}"
                            f"{'_split' if split else ''}_{dtype}",
                    "kernel": _attention_kernel, "signature": sig,
                    "constexprs": {"HEAD_DIM": 128, "V_HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_DV": 128,
                                   "BLOCK_M": block_m, "BLOCK_N": BLOCK_N,
                                   "POS_FROM_PTR": decode, "SPLIT": split, "DOT_F32": False},
                    "num_warps": NUM_WARPS, "num_stages": NUM_STAGES,
                    # the table and positions are gathered (a table row may start anywhere): no claims
                    "aligned": [n for n in sig if sig[n].startswith("*") and n not in ("pos_ptr", "table_ptr")]
                    + ["keys_per_split", "stride_qt", "stride_qh", "stride_kb", "stride_kh", "stride_ks",
                       "stride_vb", "stride_vh", "stride_vs", "stride_ot", "stride_oh"]})
        specs.append({
            "name": f"attention_combine_{dtype}", "kernel": _combine_kernel,
            "signature": {"part_ptr": "*fp32", "stat_ptr": "*fp32", "o_ptr": f"*{dtype}", "n_rep": "i32",
                          "n_rows": "i32", "n_splits": "i32", "stride_ot": "i32", "stride_oh": "i32",
                          "V_HEAD_DIM": "constexpr", "BLOCK_DV": "constexpr", "BLOCK_R": "constexpr"},
            "constexprs": {"V_HEAD_DIM": 128, "BLOCK_DV": 128, "BLOCK_R": COMBINE_BLOCK_R},
            "num_warps": NUM_WARPS, "num_stages": 1,
            "aligned": ["part_ptr", "stat_ptr", "o_ptr", "stride_ot", "stride_oh"]})
    return specs


# Offline compile checks (tests/kernels/test_compile.py) read this; empty without Triton.
COMPILE_SPECS = _compile_specs() if HAVE_TRITON else []
