"""CPU-time GMAC/s of the prefill (wide) matmuls at the bench model's shapes, one thread.

Wall-clock numbers mean nothing on a shared machine; this measures the process's CPU time
around many repetitions, so run it pinned to one core:

    taskset -c 1 .venv/bin/python bench/q6k_prefill.py [--variant avx512vnni] [--rows 128]

Weights: layer 0 of a GGUF file (default the bench model's Q6_K file and, for comparison, its
Q4_K_M file), repacked as Mistral3Text.load repacks them on the variant in use. `--so` measures
an extension built into a scratch folder (setup.py build_ext --build-lib DIR) against the tree's.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# the models bench/cpu.py's llama_cpp_tools.sh made: $BENCH_DIR/models, else the workplace's
# bench-data beside the checkout
MODELS = Path(os.environ.get("BENCH_DIR") or Path(__file__).resolve().parent.parent.parent / "bench-data") / "models"
# (tensor of layer 0, what it is): out x in = 4096x2048, 1024x2048, 8192x2048, 2048x4096, 2048x8192
TENSORS = ["attn_q", "attn_k", "ffn_up", "attn_output", "ffn_down"]


def layer0_weights(path: Path) -> dict[str, tuple[int, object, int, int]]:
    """name -> (ggml type, uint8 (out, row bytes) tensor, out, in) of layer 0's matrices"""
    import numpy as np
    import torch
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    found = {}
    for t in reader.tensors:
        for name in TENSORS:
            if t.name == f"blk.0.{name}.weight":
                cols, rows = (int(s) for s in t.shape)
                data = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(rows, -1))
                found[name] = (int(t.tensor_type), data, rows, cols)
    return found


def cpu_seconds(fn, min_seconds: float, batches: int = 5) -> float:
    """CPU seconds of one call of fn: the least of `batches` timed batches, each at least
    min_seconds (other processes' cache traffic only ever adds time)"""
    fn()
    reps, per = 1, []
    while True:
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        dt = time.process_time() - t0
        if dt >= min_seconds:
            break
        reps = max(reps * 2, int(reps * min_seconds / max(dt, 1e-4)) + 1)
    per.append(dt / reps)
    for _ in range(batches - 1):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        per.append((time.process_time() - t0) / reps)
    return min(per)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=[str(MODELS / "bench-Q6_K.gguf"), str(MODELS / "bench-Q4_K_M.gguf")])
    ap.add_argument("--variant", help="force this kernel variant (default: the best this CPU runs)")
    ap.add_argument("--rows", type=int, default=128, help="activation rows (prompt tokens)")
    ap.add_argument("--seconds", type=float, default=0.3, help="CPU seconds per timed batch")
    ap.add_argument("--so", help="an extension built elsewhere (setup.py build_ext --build-lib DIR) to measure "
                                 "instead of the tree's kernels/_cpu*.so")
    ap.add_argument("--only", nargs="*", default=TENSORS, help="layer-0 tensors to measure")
    args = ap.parse_args()
    if args.so:
        import importlib.util
        import sys

        spec = importlib.util.spec_from_file_location("tramontane.kernels._cpu", args.so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["tramontane.kernels._cpu"] = module

    import torch

    from tramontane.kernels import cpu_native
    from tramontane.kernels import ggml_types as gt

    if args.so:
        cpu_native._cpu = module
    cpu_native.set_threads(1)
    torch.set_num_threads(1)
    if args.variant:
        cpu_native.use_variant(args.variant)
    print(f"variant {cpu_native.variant()}, 1 thread, {args.rows} rows, CPU time")
    torch.manual_seed(0)
    for model in args.models:
        for name, (file_type, data, rows, cols) in layer0_weights(Path(model)).items():
            if name not in args.only:
                continue
            t = cpu_native.repacked_type(file_type)
            w = cpu_native.repack(file_type, data) if t is not None else data
            t = t if t is not None else file_type
            x = torch.randn(args.rows, cols)
            sec = cpu_seconds(lambda: cpu_native.matmul(x, t, w, rows, cols), args.seconds)
            label = gt.type_info(file_type).name + ("_R" if t != file_type else "")
            print(f"{Path(model).stem:14} {name:12} {label:6} {rows:5}x{cols:<5} {sec * 1e3:8.2f} ms  "
                  f"{rows * cols * args.rows / sec / 1e9:6.1f} GMAC/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
