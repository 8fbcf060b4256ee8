"""Quantized-matmul benchmark.

On a GPU, per type and Mistral-Small-3.1 linear shape (in -> out), prints the fused decode
kernel's time and effective bandwidth (weight bytes / time, L2 flushed before every call), its
ratio to a device-to-device copy measured on the same GPU (read + write bytes / time), and its
speed-up over dequantize-to-bf16 + cuBLAS matmul. Goal on H200: >= 0.80 of copy for Q4_K and
Q6_K at 1 row.

    python bench/quant_matmul.py                 # default types, 1 activation row
    python bench/quant_matmul.py --types all --rows 1,4,8
    python bench/quant_matmul.py --sweep         # try decode configs for Q4_K/Q6_K, print the best
    python bench/quant_matmul.py --ptx           # no GPU needed: instruction-count proxy (below)

Without a GPU it runs a reduced CPU mode (torch reference path on small shapes) and says so.

--ptx compiles the decode kernels offline for sm_90 (Triton's bundled ptxas/nvdisasm), counts the
PTX and SASS instructions of the inner loop (the longest loop of the kernel: one 256-element
unit per iteration), and divides by the weight elements one iteration covers per thread. An H200
SM issues 128 thread-instructions per clock and gets ~18.4 bytes per clock of HBM (4.8 TB/s /
132 SMs / 1.98 GHz), so a kernel that needs more than 128 / (18.4 / bytes per element)
instructions per element cannot keep up with memory: the printed "issue-bound % of HBM" is that
ratio (an upper bound: latency, occupancy and instruction mix are not modelled).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support helpers
from support.quant_bytes import F16_FIELDS  # noqa: E402
from tramontane.kernels import ggml_types as gt  # noqa: E402
from tramontane.kernels.linear import QWeight, linear_reference  # noqa: E402

# (in_features, out_features) of Mistral-Small-3.1's text layers
MISTRAL_SMALL_SHAPES = {
    "q_proj 5120->4096": (5120, 4096),
    "o_proj 4096->5120": (4096, 5120),
    "gate/up 5120->32768": (5120, 32768),
    "down 32768->5120": (32768, 5120),
    "k/v 5120->1024": (5120, 1024),
}
DEFAULT_TYPES = ["Q4_K", "Q6_K", "Q5_K", "Q8_0", "Q4_0", "Q5_0"]


def random_weight(ggml_type: int, out_f: int, in_f: int, device) -> QWeight:
    """Random valid blocks generated on the device (host numpy would be slow for 100+ MB)."""
    info = gt.type_info(ggml_type)
    rb = gt.row_bytes(ggml_type, in_f)
    g = torch.Generator(device=device).manual_seed(ggml_type)
    raw = torch.randint(0, 256, (out_f * rb,), dtype=torch.uint8, device=device, generator=g)
    blocks = raw.view(-1, info.type_size)
    for off in F16_FIELDS[ggml_type]:
        vals = (torch.randn(blocks.shape[0], device=device, generator=g) * 0.01).to(torch.float16)
        blocks[:, off : off + 2] = vals.view(torch.uint8).view(-1, 2)
    return QWeight(ggml_type, (out_f, in_f), raw.view(out_f, rb))


def gpu_time_ms(fn, iters: int = 30, flush_bytes: int = 256 << 20) -> float:
    """Median time of fn() with the L2 cache flushed before each call (CUDA events)."""
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = gpu_time_ms(lambda: dst.copy_(src), iters=20)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _types(arg: str) -> list[int]:
    names = [t.name for t in gt.TYPES.values() if not t.is_float] if arg == "all" else arg.split(",")
    by_name = {t.name: t.id for t in gt.TYPES.values()}
    return [by_name[n.strip().upper()] for n in names]


def run_gpu(args) -> None:
    from tramontane.kernels.qmatmul import decode_config, dequantize_triton, linear_decode

    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth_gbs()
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}")
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read+write bytes / time)")
    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"{'type':7} {'shape':22} {'rows':>4} {'decode us':>10} {'GB/s':>7} {'of copy':>8} "
          f"{'deq+mm us':>10} {'speedup':>8} {'bf16 F.linear GB/s':>18}  config")
    summary = {}
    for t in _types(args.types):
        for label, (in_f, out_f) in MISTRAL_SMALL_SHAPES.items():
            w = random_weight(t, out_f, in_f, "cuda")
            for rows in rows_list:
                x = torch.randn(rows, in_f, device="cuda", dtype=torch.bfloat16)
                cfg = decode_config(out_f, in_f, rows, x.device, t)
                t_dec = gpu_time_ms(lambda: linear_decode(x, w))
                t_dm = gpu_time_ms(lambda: x @ dequantize_triton(w, torch.bfloat16).t())
                dense_gbs = ""
                if args.dense and t == _types(args.types)[0]:
                    wd = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16)
                    t_dense = gpu_time_ms(lambda: torch.nn.functional.linear(x, wd))
                    dense_gbs = f"{wd.numel() * 2 / (t_dense * 1e-3) / 1e9:.0f}"
                    del wd
                gbs = w.nbytes / (t_dec * 1e-3) / 1e9
                summary.setdefault((gt.type_name(t), rows), []).append(gbs / copy_gbs)
                print(f"{gt.type_name(t):7} {label:22} {rows:>4} {t_dec * 1e3:>10.1f} {gbs:>7.0f} "
                      f"{gbs / copy_gbs:>8.2f} {t_dm * 1e3:>10.1f} {t_dm / t_dec:>8.2f} {dense_gbs:>18}  {cfg}",
                      flush=True)
            del w
    print("mean fraction of copy bandwidth per type/rows: "
          + ", ".join(f"{k[0]}@{k[1]}={statistics.mean(v):.2f}" for k, v in summary.items()))


def run_sweep(args) -> None:
    """Try decode configs on the two shapes that matter most; print the best per type."""
    from tramontane.kernels.qmatmul import DOT_TYPES, linear_decode

    copy_gbs = copy_bandwidth_gbs()
    print(f"sweep (copy {copy_gbs:.0f} GB/s): type shape rows -> best (block_n, block_m, split_k, num_warps)")
    for t in _types(args.sweep_types):
        for label in ("q_proj 5120->4096", "gate/up 5120->32768", "k/v 5120->1024"):
            in_f, out_f = MISTRAL_SMALL_SHAPES[label]
            w = random_weight(t, out_f, in_f, "cuda")
            for rows in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(rows, in_f, device="cuda", dtype=torch.bfloat16)
                bm = 1 if rows == 1 else 2 if rows == 2 else 4 if rows <= 4 else 8
                results = []
                # one row of Q4_K/Q6_K runs the one-warp scale-after-dot kernel: sweep those too
                one_warp = bm == 1 and t in DOT_TYPES
                for bn in (4, 8, 16, 32, 64):
                    for split in (1, 2, 4, 8, 16) if one_warp else (1, 2, 4, 8):
                        for warps in (1, 2, 4) if one_warp else (2, 4, 8):
                            cfg = (bn, bm, split, warps)
                            try:
                                ms = gpu_time_ms(lambda: linear_decode(x, w, config=cfg), iters=10)
                            except Exception as e:  # e.g. out of registers / shared memory
                                print(f"  {cfg}: {type(e).__name__}", file=sys.stderr)
                                continue
                            results.append((ms, cfg))
                results.sort()
                best = ", ".join(f"{cfg}:{w.nbytes / (ms * 1e-3) / 1e9 / copy_gbs:.2f}" for ms, cfg in results[:3])
                print(f"{gt.type_name(t):6} {label:22} rows={rows}: {best}", flush=True)


def run_cpu(args) -> None:
    from tramontane.kernels import linear as linear_mod

    print("no GPU: reduced CPU mode (torch reference path, small shapes; Triton kernels not timed)")
    budget = linear_mod.CPU_DENSE_CACHE_BYTES
    for t in _types(args.types)[:3]:
        for mode, cache in (("chunked", 0), ("cached", budget)):
            linear_mod.CPU_DENSE_CACHE_BYTES = cache
            w = random_weight(t, 1024, 2048, "cpu")
            for rows in (1, 64):
                x = torch.randn(rows, 2048)
                linear_reference(x, w)
                start = time.perf_counter()
                for _ in range(3):
                    linear_reference(x, w)
                dt = (time.perf_counter() - start) / 3
                print(f"{gt.type_name(t):6} 2048->1024 rows={rows:>3} {mode:8}: {dt * 1e3:7.1f} ms "
                      f"({w.nbytes / dt / 1e9:.2f} GB/s of raw weight bytes)")
    linear_mod.CPU_DENSE_CACHE_BYTES = budget


HBM_BYTES_PER_CLK_PER_SM = 4.8e12 / 132 / 1.98e9  # H200
ISSUE_PER_CLK_PER_SM = 128


def _loop_body(lines: list[str], label_re: str, branch_re: str) -> list[str]:
    """The longest backward-branching block: lines from a label to a branch back to it."""
    import re

    labels, best = {}, []
    for i, line in enumerate(lines):
        m = re.match(label_re, line)
        if m:
            labels[m.group(1)] = i
        m = re.search(branch_re, line)
        if m and m.group(1) in labels and labels[m.group(1)] <= i and i - labels[m.group(1)] > len(best):
            best = lines[labels[m.group(1)]:i + 1]
    return best


def ptx_proxy(kernel, signature: dict, constexprs: dict, num_warps: int, elems_per_iter: int) -> dict:
    """Compile for sm_90 offline; instructions per weight element in the inner loop."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    import triton.backends.nvidia as nv
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    aligned = [n for n in names if signature[n].startswith("*")] + [n for n in ("K", "row_bytes", "stride_xm") if n in names]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    k = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "enable_fp_fusion": True})
    ptx = [ln.strip() for ln in k.asm["ptx"].splitlines()]
    ptx_body = _loop_body(ptx, r"^(\$L__\w+):", r"bra(?:\.uni)?\s+(\$L__\w+);")
    ptx_n = sum(1 for ln in ptx_body if ln and not ln.endswith(":") and not ln.startswith(("//", ".", "{", "}")))
    bindir = os.path.join(os.path.dirname(nv.__file__), "bin")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", cubin], capture_output=True, text=True).stdout
        ptx_file = os.path.join(tmp, "k.ptx")
        with open(ptx_file, "w") as f:
            f.write(k.asm["ptx"])
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90)  # the one Triton compiles with (knows its PTX version)
        ptxas = ptxas.path if hasattr(ptxas, "path") else ptxas[0]
        info = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx_file, "-o",
                               os.path.join(tmp, "o.cubin")], capture_output=True, text=True).stderr
    sass_lines = []
    for ln in sass.splitlines():
        ln = ln.strip()
        label = re.match(r"^\.(L_x_\d+):", ln)
        if label:
            sass_lines.append(label.group(0))
            continue
        m = re.match(r"^/\*[0-9a-f]{4,}\*/\s+(.*?);", ln)
        if m:
            sass_lines.append(m.group(1))
    sass_body = [ln for ln in _loop_body(sass_lines, r"^\.(L_x_\d+):", r"BRA\s+`?\(?\.?(L_x_\d+)") if not ln.startswith(".")]
    threads = num_warps * 32
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    return {"ptx": ptx_n * threads / elems_per_iter, "sass": len(sass_body) * threads / elems_per_iter,
            "regs": int(regs.group(1)) if regs else -1, "spill": int(spills.group(1)) if spills else -1}


def run_ptx(args) -> None:
    from tramontane.kernels import qmatmul

    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "part_ptr": "*fp32", "table_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "row_bytes": "i32", "n_blocks": "i32", "n_units": "i32", "units_per_split": "i32",
           "stride_xm": "i32", "QTYPE": "constexpr", "BLOCK_N": "constexpr", "BLOCK_M": "constexpr"}
    dot_sig = {**{k: v for k, v in sig.items() if v != "constexpr"}, "f2p23": "i32", "QTYPE": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_M": "constexpr", "X_BF16": "constexpr"}

    class Dev:  # decode_config only asks for .type
        type = "cpu"

    print("sm_90 inner loop, instructions per weight element (bf16 x; rows=8: per element, not per MAC)")
    print(f"{'type':6} {'rows':>4} {'kernel':8} {'tile':>12} {'PTX':>6} {'SASS':>6} {'regs':>5} {'issue-bound % of HBM':>21}")
    for t in _types(args.types):
        bytes_per_elem = gt.type_info(t).type_size / gt.type_info(t).block_size
        ceiling = ISSUE_PER_CLK_PER_SM * bytes_per_elem / HBM_BYTES_PER_CLK_PER_SM
        for rows in [int(r) for r in args.rows.split(",")]:
            bn, bm, _, warps = qmatmul.decode_config(4096, 5120, rows, Dev(), t)
            runs = [("generic", qmatmul._decode_kernel, sig, {}, _DECODE_TILE_GENERIC.get(t, (16, 4)) if bm == 1 else (bn, warps))]
            if bm == 1 and t in qmatmul.DOT_TYPES:
                runs.append(("dot", qmatmul._decode_dot_kernel, dot_sig, {"X_BF16": True}, (bn, warps)))
            for name, kernel, signature, extra, (tile_n, tile_w) in runs:
                r = ptx_proxy(kernel, signature, {"QTYPE": t, "BLOCK_N": tile_n, "BLOCK_M": bm, **extra}, tile_w,
                              tile_n * qmatmul.UNIT)
                pct = min(1.0, ceiling / r["sass"])
                print(f"{gt.type_name(t):6} {rows:>4} {name:8} {f'{tile_n}x{bm}/{tile_w}w':>12} {r['ptx']:>6.2f} "
                      f"{r['sass']:>6.2f} {r['regs']:>5} {pct:>20.0%}" + (f"  SPILLS {r['spill']} B" if r["spill"] > 0 else ""),
                      flush=True)


# the generic kernel's 1-row tiles (qmatmul._DECODE_TILE_1ROW, default 16 rows / 4 warps)
_DECODE_TILE_GENERIC = {gt.Q6_K: (8, 2)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES), help="comma list of GGUF types or 'all'")
    ap.add_argument("--rows", default="1", help="comma list of activation row counts")
    ap.add_argument("--dense", action="store_true", help="also time a dense bf16 F.linear of the same shape")
    ap.add_argument("--sweep", action="store_true", help="search decode configs instead")
    ap.add_argument("--sweep-types", default="Q4_K,Q6_K")
    ap.add_argument("--ptx", action="store_true", help="instruction-count proxy from offline sm_90 compiles (no GPU)")
    args = ap.parse_args(argv)
    if args.ptx:
        if args.types == ",".join(DEFAULT_TYPES):
            args.types = "Q4_K,Q6_K"
        if args.rows == "1":
            args.rows = "1,8"
        run_ptx(args)
    elif not torch.cuda.is_available():
        run_cpu(args)
    elif args.sweep:
        run_sweep(args)
    else:
        run_gpu(args)


if __name__ == "__main__":
    main()
