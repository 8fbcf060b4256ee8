"""Benchmark: decode tok/s of a model split across devices against the same model on one
device, and what the split itself costs per step (boundary copies, bookkeeping).

    python bench/split.py                        # CPU: one model, then the same weights split
                                                 # across two logical CPUs (forced split)
    python bench/split.py --device cuda          # GPU: whole on the GPU, then half the layers
                                                 # on the CPU (--gpu-layers), and that CPU part alone

On the CPU the split and unsplit runs share the very same weights (only the segments differ),
and alternate step by step so a busy machine slows both alike; their difference is also taken
in process CPU time, which other programs do not inflate. The split's own cost is measured
directly as well: per boundary, the copy of the hidden row plus a pass through the next
segment holding no layer (its bookkeeping), over the step time. The target is < 3 % of a step.
Random weights in the real type mix (bench/model.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import MIXES, SHAPES, RandomSource, build_random_model  # noqa: E402  (bench/model.py)

from tramontane.engine.mistral3.config import TextConfig  # noqa: E402
from tramontane.engine.mistral3.text import Mistral3Text, Segment, _enter_segment  # noqa: E402
from tramontane.engine.mistral3.weights import load_weights, want_dense  # noqa: E402
from tramontane.engine.runtime.decoder import decode, new_cache  # noqa: E402
from tramontane.engine.runtime.device_map import (DeviceInfo, Machine, gpu_layers_map,  # noqa: E402
                                                  model_sizes, plan_devices)

SPLIT_OVERHEAD_LIMIT = 0.03


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_times(model: Mistral3Text, n_prompt: int, n_steps: int, warmup: int = 3) -> list[float]:
    """Seconds per decode step after an n_prompt-token prefill (fresh cache each call)."""
    cache = new_cache(model, n_prompt + warmup + n_steps + 8)
    ids = torch.randint(0, model.cfg.vocab_size, (n_prompt,), generator=torch.Generator().manual_seed(0))
    model.forward(model.embed(ids), 0, cache)
    out = []
    for i in range(warmup + n_steps):
        sync(model.device)
        t0 = time.perf_counter()
        decode(model, int(ids[i % n_prompt]), cache)
        sync(model.device)
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def split_seconds(model: Mistral3Text, repeats: int = 2000) -> float:
    """Seconds a decode step spends on the split itself: for each segment after the first,
    the boundary copy of the row and the segment's own bookkeeping (a pass through the same
    segment holding no layer: RoPE rows, the call)."""
    from dataclasses import replace

    cache = new_cache(model, 64)
    total = 0.0
    for prev, seg in zip(model.segments, model.segments[1:]):
        x = torch.randn(1, model.cfg.hidden, dtype=prev.dtype, device=prev.device)
        empty = replace(seg, layers=range(0))

        def cross_and_enter():
            return model.run_segment(empty, _enter_segment(x, seg), [(cache, 5, 1)])

        for _ in range(10):
            cross_and_enter()
        sync(seg.device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            cross_and_enter()
        sync(seg.device)
        total += (time.perf_counter() - t0) / repeats
    return total


def split_across_logical_cpus(model: Mistral3Text, at: int) -> list[Segment]:
    """The same weights, run as two segments "cpu:0" / "cpu:1" (a boundary copy at layer `at`)."""
    whole = model.segments[0]
    return [Segment("cpu:0", whole.device, whole.dtype, range(0, at)),
            Segment("cpu:1", whole.device, whole.dtype, range(at, model.cfg.n_layers))]


def cfg_of(shape: str) -> TextConfig:
    s = SHAPES[shape]
    return TextConfig(arch="mistral3", n_layers=s["n_layers"], hidden=s["hidden"], n_heads=s["n_heads"],
                      n_kv_heads=s["n_kv_heads"], head_dim=s["head_dim"], v_head_dim=s["head_dim"],
                      ffn=s["ffn"], vocab_size=s["vocab_size"], norm_eps=1e-5, rope_theta=s["rope_theta"],
                      rope_dim=s["head_dim"], context_length=s["context_length"], tied_embeddings=False)


def build_split_cuda(shape: str, mix: str, gpu_layers: int) -> Mistral3Text:
    """Random weights loaded through a manual plan: the first layers on the CPU, the rest + head on cuda:0."""
    cfg = cfg_of(shape)
    source = RandomSource(cfg, mix, torch.device("cuda"))
    big = DeviceInfo("cuda:0", 1 << 50), DeviceInfo("cpu", 1 << 50)
    plan = plan_devices(model_sizes(cfg, source.tensors), Machine((big[0],), big[1]),
                        manual=gpu_layers_map(cfg.n_layers, gpu_layers))
    model = Mistral3Text(cfg, torch.device("cuda:0"), torch.bfloat16)
    model._apply_plan(plan, None)
    model.dense_weights = want_dense(source, cfg, torch.device("cpu"), None)
    load_weights(model, source)
    return model


def report(label: str, times: list[float]) -> float:
    med = statistics.median(times)
    print(f"{label:<34} {1 / med:8.2f} tok/s   median step {med * 1e3:8.3f} ms   (n={len(times)})")
    return med


def run_cpu(args) -> int:
    cpu = torch.device("cpu")
    model = build_random_model(args.shape or "small", args.mix, cpu, torch.float32)
    layouts = {"whole": list(model.segments), "split": split_across_logical_cpus(model, model.cfg.n_layers // 2)}
    print(f"shape {args.shape or 'small'} ({model.cfg.n_layers} layers, hidden {model.cfg.hidden}), mix "
          f"{args.mix}, dense CPU weights: {model.dense_weights}, torch threads {torch.get_num_threads()}")
    n = args.steps * args.repeats
    ids = torch.randint(0, model.cfg.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(0))
    caches = {}
    for name, segments in layouts.items():
        model.segments = segments
        caches[name] = new_cache(model, args.prompt + n + 8)
        model.forward(model.embed(ids), 0, caches[name])
    # Step by step, alternating which goes first: machine noise hits both alike, and the paired
    # differences cancel most of it.
    # Wall time for tok/s; the process's CPU time for the overhead, which other programs on a
    # busy machine do not inflate (with --threads 1 it is exactly the work of a step).
    times = {"whole": [], "split": []}
    cpu_times = {"whole": [], "split": []}
    for i in range(n + 3):
        for name in (("whole", "split") if i % 2 else ("split", "whole")):
            model.segments = layouts[name]
            t0, c0 = time.perf_counter(), time.process_time()
            decode(model, int(ids[i % args.prompt]), caches[name])
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
                cpu_times[name].append(time.process_time() - c0)
    m_whole = report("whole (one CPU segment)", times["whole"])
    report("split (cpu:0 + cpu:1)", times["split"])
    c_whole, c_split = statistics.mean(cpu_times["whole"]), statistics.mean(cpu_times["split"])
    print(f"CPU time per step: whole {c_whole * 1e3:.3f} ms, split {c_split * 1e3:.3f} ms")
    model.segments = layouts["split"]
    return verdict(split_seconds(model), m_whole, (c_split - c_whole) / c_whole)


def run_cuda(args) -> int:
    shape = args.shape or "ministral-3b"
    cfg = cfg_of(shape)
    gpu_layers = cfg.n_layers // 2 if args.gpu_layers is None else args.gpu_layers
    print(f"shape {shape} ({cfg.n_layers} layers), mix {args.mix}; split: {cfg.n_layers - gpu_layers} layers "
          f"on the CPU, {gpu_layers} + head on cuda:0")
    gpu = build_random_model(shape, args.mix, torch.device("cuda"), torch.bfloat16)
    m_gpu = report("whole on cuda:0", decode_times(gpu, args.prompt, args.steps))
    del gpu
    torch.cuda.empty_cache()
    split = build_split_cuda(shape, args.mix, gpu_layers)
    m_split = report(f"split ({cfg.n_layers - gpu_layers} CPU + {gpu_layers} GPU layers)",
                     decode_times(split, args.prompt, args.steps))
    # The same model's CPU part alone, run on its own: the split step should be the two parts' sum.
    cpu_seg, gpu_seg = split.segments
    cache = new_cache(split, args.prompt + args.steps + 16)
    cache.length = args.prompt
    x = torch.randn(1, cfg.hidden, dtype=cpu_seg.dtype)
    times = []
    for i in range(3 + args.steps):
        t0 = time.perf_counter()
        split.run_segment(cpu_seg, x, [(cache, args.prompt, 1)])
        if i >= 3:
            times.append(time.perf_counter() - t0)
    m_cpu_part = report("its CPU segment alone", times)
    copy = split_seconds(split)
    print(f"split step - CPU part = {(m_split - m_cpu_part) * 1e3:.3f} ms for the GPU part + head "
          f"(whole-GPU step {m_gpu * 1e3:.3f} ms)")
    return verdict(copy, m_split, None)


def verdict(copy_s: float, step_s: float, measured: float | None) -> int:
    share = copy_s / step_s
    print(f"split itself (boundary copies + bookkeeping): {copy_s * 1e6:.1f} us per step = "
          f"{share * 100:.3f} % of a step (limit {SPLIT_OVERHEAD_LIMIT * 100:.0f} %)")
    if measured is not None:
        print(f"measured split - whole (CPU time): {measured * 100:+.2f} % of a step")
    ok = share < SPLIT_OVERHEAD_LIMIT
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="default: small on CPU, ministral-3b on CUDA")
    ap.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m")
    ap.add_argument("--prompt", type=int, default=64, help="tokens prefilled before decoding")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="CPU: runs of --steps (whole and split alternate each step)")
    ap.add_argument("--gpu-layers", type=int, help="CUDA: layers on the GPU (default: half)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (on a shared machine, 1 is steadier)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA GPU: nothing to measure")
            return 0
        return run_cuda(args)
    return run_cpu(args)


if __name__ == "__main__":
    sys.exit(main())
