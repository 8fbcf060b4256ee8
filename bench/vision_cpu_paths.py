"""The vision tower alone on the CPU, one projector file against another: CPU time per image
encode (time.process_time: all threads of this process, so a loaded machine's waits do not
count), in paired alternating rounds, medians. Made for the quantized projector against the
16-bit one (its bf16 path):

    python bench/vision_cpu_paths.py /work/bench-data/models/mmproj-bench-f16.gguf \
        /work/bench-data/models/mmproj-bench-Q8_0.gguf --rounds 5
    python bench/vision_cpu_paths.py Q8.gguf Q8.gguf:native  # the Q8_0 file in bf16 / on int8 kernels
    python bench/vision_cpu_paths.py Q8.gguf:native --profile  # cProfile of one encode

Make a Q8_0 projector with tests/support/quantize_mmproj.py. torch runs at 1 thread, our pool at
--threads (default 2); the image is bench/cpu.py's 640x480 photo at the tower's resize.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import photo_jpeg  # noqa: E402

from tramontane.engine.mistral3.vision import VisionTower  # noqa: E402
from tramontane.kernels import cpu_native  # noqa: E402


def cpu_seconds(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mmproj", nargs="+", help="projector GGUFs (each loaded once, timed alternately)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="the native pool's threads")
    ap.add_argument("--profile", action="store_true", help="cProfile one encode of each file instead")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cpu_native.set_threads(args.threads)
    towers, names = [], []
    for spec in args.mmproj:  # FILE or FILE:native (no bf16 weights: the native kernels' path)
        path, _, how = spec.partition(":")
        t0 = time.perf_counter()
        towers.append(VisionTower.load(path, cpu_bf16=False if how == "native" else None))
        names.append(f"{Path(path).name}{' (native)' if how == 'native' else ''}")
        print(f"loaded {names[-1]} in {time.perf_counter() - t0:.1f} s")
    pixels = towers[0].preprocess(photo_jpeg(), "photo.jpg")[0]
    print(f"image {tuple(pixels.shape)}, pool {cpu_native.threads()} threads, torch 1")
    for t in towers:
        print(f"  {t!r}")
        t.encode(pixels)  # warm-up: plans, repacking, first-touch pages
    if args.profile:
        for t, name in zip(towers, names):
            prof = cProfile.Profile()
            cpu = time.process_time()
            prof.runcall(t.encode, pixels)
            print(f"\n{name}: {time.process_time() - cpu:.2f} s CPU (the profile is the calling thread's)")
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
            print(out.getvalue())
        return 0
    times: list[list[float]] = [[] for _ in towers]
    for _ in range(args.rounds):
        for i, t in enumerate(towers):
            times[i].append(cpu_seconds(lambda: t.encode(pixels)))
    base = statistics.median(times[0])
    for name, ts in zip(names, times):
        med = statistics.median(ts)
        print(f"{name}: median {med:.2f} s CPU per image (min {min(ts):.2f}, {len(ts)} rounds), "
              f"{med / base:.2f}x the first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
