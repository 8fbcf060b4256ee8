"""Where the fused multi-row kernel stops paying: linear_rows (dequant in registers + tensor
cores) against linear_prefill (dequant to scratch once + cuBLAS), bf16, Mistral-Small-3.1-24B
shapes, by activation rows. The rows where the dense path starts winning are what
kernels/linear.FUSED_MAX_ROWS should be (its comment has the arithmetic this measures).

    python bench/rows_crossover.py [--types Q4_K,Q6_K] [--rows 2,8,32,64,128,192,256,384,512,1024,2048]

Needs a CUDA GPU. Prints one line per (type, shape, rows) and the crossover per type.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_matmul import MISTRAL_SMALL_SHAPES, _types, gpu_time_ms, random_weight  # noqa: E402
from tramontane.kernels import ggml_types as gt  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_K,Q6_K")
    p.add_argument("--rows", default="2,8,32,64,128,192,256,384,512,1024,2048")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("rows_crossover: needs a CUDA GPU", file=sys.stderr)
        return 2
    from tramontane.kernels.linear import FUSED_MAX_ROWS, PREFILL_CHUNK_BYTES
    from tramontane.kernels.qmatmul import linear_prefill, linear_rows, rows_config

    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"FUSED_MAX_ROWS = {FUSED_MAX_ROWS}")
    print(f"{'type':6} {'shape':22} {'rows':>5} {'fused us':>10} {'dense us':>10} {'dense/fused':>11} "
          f"{'fused TFLOP/s':>13}  config")
    for t in _types(args.types):
        wins = {}
        for label, (in_f, out_f) in MISTRAL_SMALL_SHAPES.items():
            w = random_weight(t, out_f, in_f, "cuda")
            for rows in rows_list:
                x = torch.randn(rows, in_f, device="cuda", dtype=torch.bfloat16)
                t_rows = gpu_time_ms(lambda: linear_rows(x, w), iters=10)
                t_dense = gpu_time_ms(lambda: linear_prefill(x, w, PREFILL_CHUNK_BYTES), iters=10)
                tflops = 2 * rows * in_f * out_f / (t_rows * 1e-3) / 1e12
                wins.setdefault(rows, []).append(t_dense / t_rows)
                print(f"{gt.type_name(t):6} {label:22} {rows:>5} {t_rows * 1e3:>10.1f} {t_dense * 1e3:>10.1f} "
                      f"{t_dense / t_rows:>11.2f} {tflops:>13.1f}  {rows_config(rows, out_f, in_f, x.device)}",
                      flush=True)
            del w
        fused_better = [r for r in rows_list if min(wins[r]) >= 1.0]
        print(f"{gt.type_name(t)}: the fused kernel is at least as fast on every shape at rows "
              f"{fused_better or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
