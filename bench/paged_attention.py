"""Native CPU decode attention, contiguous KV cache against paged KV, in one run.

    python bench/paged_attention.py [--keys 4096] [--block 32] [--rounds 15] [--threads N]

A 24B-like head layout (Mistral-Small: 32 query heads, 8 KV heads, head size 128): one query row
over `--keys` cached positions, float16 and float32 KV. Contiguous: cpu_native.attend_decode on a
(8, keys, 128) cache. Paged: cpu_native.paged_attend_decode on pools of blocks of `--block` rows,
the sequence's blocks shuffled through the pool (as a block allocator leaves them), the same values.
Each round times both back to back (the order flips every round, so a slow spell of a shared machine
falls on both) as the median of several calls; the medians over rounds and the median of the
rounds' ratios (paged / contiguous, the goal is <= 1.05x; a ratio of two timings taken side by side
holds better than the ratio of medians on a shared machine) are printed. The outputs are checked
equal first.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from tramontane.kernels import cpu_native

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def _median_call(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(dtype: torch.dtype, n_keys: int, block: int, rounds: int, calls: int) -> tuple[float, float, float]:
    g = torch.Generator().manual_seed(0)
    n_blocks = (n_keys + block - 1) // block
    k_cache = torch.randn(KV_HEADS, n_blocks * block, HEAD_DIM, generator=g).to(dtype)
    v_cache = torch.randn(KV_HEADS, n_blocks * block, HEAD_DIM, generator=g).to(dtype)
    table = torch.randperm(n_blocks, generator=g).to(torch.int32)
    k_pool = torch.empty(n_blocks, KV_HEADS, block, HEAD_DIM, dtype=dtype)
    v_pool = torch.empty_like(k_pool)
    for b in range(n_blocks):  # the sequence's b-th block lives at pool block table[b]
        k_pool[int(table[b])] = k_cache[:, b * block:(b + 1) * block]
        v_pool[int(table[b])] = v_cache[:, b * block:(b + 1) * block]
    q = torch.randn(1, HEADS, HEAD_DIM, generator=g)
    tables, positions = table[None].contiguous(), torch.tensor([n_keys - 1], dtype=torch.int32)

    def contiguous():
        return cpu_native.attend_decode(q[0], k_cache, v_cache, n_keys)

    def paged():
        return cpu_native.paged_attend_decode(q, k_pool, v_pool, tables, positions, block)

    if not torch.equal(contiguous().reshape(1, -1), paged()):
        raise SystemExit(f"{dtype}: paged decode attention differs from the contiguous one")
    for _ in range(3):  # warm caches and the pool's threads
        contiguous(), paged()
    t_contig, t_paged, ratios = [], [], []
    for r in range(rounds):
        pair = [(contiguous, t_contig), (paged, t_paged)]
        for fn, out in (pair if r % 2 == 0 else pair[::-1]):
            out.append(_median_call(fn, calls))
        ratios.append(t_paged[-1] / t_contig[-1])
    return statistics.median(t_contig), statistics.median(t_paged), statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=7, help="calls per timing (their median)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if not cpu_native.AVAILABLE:
        raise SystemExit(f"native CPU kernels not built: {cpu_native.IMPORT_ERROR}")
    threads = cpu_native.set_threads(args.threads)
    print(f"decode attention, Hq {HEADS} Hkv {KV_HEADS} d {HEAD_DIM}, {args.keys} keys, blocks of {args.block}; "
          f"variant {cpu_native.variant()}, {threads} threads; medians of {args.rounds} rounds x {args.calls} calls")
    for dtype in (torch.float16, torch.float32):
        contig, paged, ratio = measure(dtype, args.keys, args.block, args.rounds, args.calls)
        name = str(dtype).replace("torch.", "")
        print(f"  {name:8s} contiguous {contig * 1e3:7.3f} ms   paged {paged * 1e3:7.3f} ms   "
              f"paged / contiguous {ratio:.3f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
