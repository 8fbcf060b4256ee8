"""Pixtral vision benchmark: our encoder + projector vs HF transformers on the same weights.

    python bench/vision.py                       # CPU, small tower (fast)
    python bench/vision.py --shape real --device cuda --dtype f16   # Mistral-Small-3.1's shape

A random tower is built with HF (`PixtralVisionModel` + `Mistral3MultiModalProjector`), written
to an mmproj GGUF the way llama.cpp's converter lays it out (Q/K rows permuted), loaded by
`VisionTower`, and both encode the same preprocessed 640×480 and 1540×1540 images. Prints
median and min times (runs interleaved), our/HF ratios and the per-token cosine of the two outputs (a sanity check).
Preprocessing (decode + resize + normalise) is timed too, against mistral-common when present.

    python bench/vision.py --preprocess-only     # preprocessing vs mistral-common, every size

--preprocess-only builds no tower: it times our preprocessing against mistral-common's
ImageEncoder on the same file bytes (photo-like JPEG and PNG: gradients + noise; a grey and an
RGBA PNG too) as CPU time (time.process_time, torch at 1 thread), in paired alternating rounds,
and prints the medians and their ratio (below 1: ours is faster).
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from tramontane.engine.mistral3.image import preprocess
from tramontane.engine.mistral3.vision import VisionTower

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support helpers
from support import pixtral_hf  # noqa: E402
from support.pixtral_hf import MEAN, MERGE, PATCH, STD  # noqa: E402

SHAPES = {
    # Mistral-Small-3.1-24B's vision_config: hidden 1024, 24 layers, 16 heads, ffn 4096,
    # patch 14, image 1540, merge 2, text hidden 5120, SiLU.
    "real": dict(hidden=1024, layers=24, heads=16, ffn=4096, text_hidden=5120),
    "small": dict(hidden=128, layers=4, heads=4, ffn=256, text_hidden=256),
    "tiny": dict(hidden=32, layers=3, heads=2, ffn=64, text_hidden=64),
}
IMAGE_SIZE = 1540


def build_hf(shape: dict, device: str):
    return pixtral_hf.build_hf(shape, IMAGE_SIZE, "silu", seed=0, device=device)


def write_mmproj(path: str, tower, projector, shape: dict, ftype: str) -> None:
    """The HF weights as llama.cpp's converter would write them (names, keys, Q/K row permutation)."""
    pixtral_hf.write_mmproj(path, tower, projector, shape, IMAGE_SIZE, "silu",
                            np.float16 if ftype == "f16" else np.float32)


def image_bytes(w: int, h: int) -> bytes:
    rng = np.random.default_rng(w * 7 + h)
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([(xx * 255 // w), (yy * 255 // h), ((xx + yy) * 127 // (w + h))], -1)
    arr = np.clip(arr + rng.integers(-20, 20, arr.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


PREPROCESS_SIZES = "64x64,200x150,320x240,640x480,1024x768,1540x1540,3000x2000"


def photo_bytes(w: int, h: int, fmt: str = "PNG", mode: str = "RGB") -> bytes:
    """A photo-like image (gradients + noise) as a JPEG (quality 90) or PNG file; mode L or RGBA
    converts it (RGBA with a horizontal alpha ramp)."""
    rng = np.random.default_rng(w * 7 + h)
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([(xx * 255 // w), (yy * 255 // h), ((xx + yy) * 127 // (w + h))], -1)
    arr = np.clip(arr + rng.integers(-20, 20, arr.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(arr)
    if mode == "L":
        img = img.convert("L")
    elif mode == "RGBA":
        img = Image.fromarray(np.dstack([arr, (xx * 255 // w).astype(np.uint8)]), "RGBA")
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _cpu_per_call(fn, data: bytes, calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn(data)
    return (time.process_time() - t0) / calls


def preprocess_vs_mistral_common(cases, rounds: int) -> list[tuple[str, float, float]]:
    """[(name, ours s, mistral-common s)]: CPU-time medians of `rounds` paired alternating
    rounds per (name, file bytes) case; each round repeats a call for ~50 ms of CPU."""
    from mistral_common.protocol.instruct.chunk import ImageChunk
    from mistral_common.tokens.tokenizers.image import ImageConfig, ImageEncoder, SpecialImageIDs

    enc = ImageEncoder(ImageConfig(PATCH, IMAGE_SIZE, MERGE), SpecialImageIDs(10, 12, 13))
    ours = lambda d: preprocess(d, image_size=IMAGE_SIZE, patch_size=PATCH, merge=MERGE, mean=MEAN, std=STD)  # noqa: E731
    theirs = lambda d: enc(ImageChunk(image=Image.open(io.BytesIO(d))))  # noqa: E731
    results = []
    for name, data in cases:
        ours(data), theirs(data)  # warm-up
        calls = max(1, int(0.05 / max(_cpu_per_call(theirs, data, 1), 1e-5)))
        a, b = [], []
        for _ in range(rounds):
            a.append(_cpu_per_call(ours, data, calls))
            b.append(_cpu_per_call(theirs, data, calls))
        results.append((name, statistics.median(a), statistics.median(b)))
    return results


def preprocess_table(sizes: str, rounds: int) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        import cv2
        cv2_threads = cv2.getNumThreads()
        cv2.setNumThreads(1)  # mistral-common resizes with cv2: one thread, like ours
    except ImportError:
        cv2 = None
    cases = [(f"{fmt} {size}", photo_bytes(*(int(v) for v in size.split("x")), fmt))
             for fmt in ("JPEG", "PNG") for size in sizes.split(",")]
    cases += [(f"PNG {mode} 640x480", photo_bytes(640, 480, "PNG", mode)) for mode in ("L", "RGBA")]
    print(f"preprocessing, CPU time per image (median of {rounds} paired rounds, torch and cv2 at 1 thread)")
    print(f"{'image':18} {'ours ms':>9} {'mistral-common ms':>18} {'ratio':>6}")
    try:
        for name, ours_s, mc_s in preprocess_vs_mistral_common(cases, rounds):
            print(f"{name:18} {ours_s * 1e3:9.2f} {mc_s * 1e3:18.2f} {ours_s / mc_s:6.2f}", flush=True)
    finally:
        torch.set_num_threads(threads)
        if cv2 is not None:
            cv2.setNumThreads(cv2_threads)


def _once(fn, device: str) -> tuple[float, object]:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def timed_pair(fns, device: str, repeat: int) -> list[tuple[tuple[float, float], object]]:
    """For each fn: ((median s, min s), last output). Runs are interleaved (a, b, a, b...) so
    a noisy shared machine slows both alike; one warm-up run each first."""
    outs = [fn() for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            dt, outs[i] = _once(fn, device)
            times[i].append(dt)
    return [((statistics.median(t), min(t)), o) for t, o in zip(times, outs)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="tower shape (default: tiny on CPU, real on CUDA)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["f32", "f16"], default=None, help="file/compute dtype (default f32 CPU, f16 CUDA)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default=None,
                    help=f"WxH,... (default 640x480,1540x1540; with --preprocess-only {PREPROCESS_SIZES})")
    ap.add_argument("--preprocess-only", action="store_true",
                    help="only preprocessing against mistral-common, CPU time, no tower")
    args = ap.parse_args(argv)
    if args.preprocess_only:
        preprocess_table(args.sizes or PREPROCESS_SIZES, max(args.repeat, 7))
        return 0
    args.sizes = args.sizes or "640x480,1540x1540"
    shape_name = args.shape or ("real" if args.device == "cuda" else "tiny")
    ftype = args.dtype or ("f16" if args.device == "cuda" else "f32")
    shape = SHAPES[shape_name]
    hf_dtype = torch.float16 if ftype == "f16" else torch.float32
    print(f"device {args.device}, tower {shape_name} {shape}, weights {ftype}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")

    t0 = time.perf_counter()
    tower_hf, projector_hf = build_hf(shape, args.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"mmproj-bench-{shape_name}-{ftype}.gguf")
        write_mmproj(path, tower_hf, projector_hf, shape, ftype)
        tower_hf, projector_hf = tower_hf.to(hf_dtype), projector_hf.to(hf_dtype)
        t1 = time.perf_counter()
        ours = VisionTower.load(path, device=args.device)
        load_s = time.perf_counter() - t1
        print(f"built HF + wrote GGUF in {t1 - t0:.1f}s; VisionTower.load {load_s * 1000:.0f} ms; {ours!r}")

        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            data = image_bytes(w, h)
            ours_pre = lambda: preprocess(data, image_size=IMAGE_SIZE, patch_size=PATCH, merge=MERGE,  # noqa: E731
                                          mean=MEAN, std=STD)
            ((pre_s, _), (pixels, rows, cols)), = timed_pair([ours_pre], "cpu", args.repeat)
            line = f"{w}x{h}: grid {rows}x{cols} ({rows * cols} tokens, {rows * cols * MERGE * MERGE} patches)"
            line += f" | preprocess {pre_s * 1000:.1f} ms"
            try:
                from mistral_common.tokens.tokenizers.image import ImageConfig, ImageEncoder, SpecialImageIDs
                from mistral_common.protocol.instruct.chunk import ImageChunk

                enc = ImageEncoder(ImageConfig(PATCH, IMAGE_SIZE, MERGE), SpecialImageIDs(10, 12, 13))
                ((mc_s, _), _), = timed_pair([lambda: enc(ImageChunk(image=Image.open(io.BytesIO(data))))],
                                             "cpu", args.repeat)
                line += f" (mistral-common {mc_s * 1000:.1f} ms, ratio {pre_s / mc_s:.2f})"
            except ImportError:
                pass
            print(line)

            px = pixels.to(args.device)
            def hf_run():
                with torch.inference_mode():
                    sizes = torch.tensor([list(px.shape[1:])], device=args.device)
                    feats = tower_hf(px[None].to(hf_dtype), image_sizes=sizes).last_hidden_state
                    return projector_hf(feats.squeeze(0), sizes)

            ((ours_s, ours_min), y), ((hf_s, hf_min), ref) = timed_pair(
                [lambda: ours.encode(px), hf_run], args.device, args.repeat)
            cos = F.cosine_similarity(y.double(), ref.double(), dim=-1)
            extra = ""
            if args.device == "cuda":
                extra = f", peak GPU mem {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
            print(f"  encode (median / min of {args.repeat}): ours {ours_s * 1000:.1f} / {ours_min * 1000:.1f} ms, "
                  f"HF {hf_s * 1000:.1f} / {hf_min * 1000:.1f} ms, ours/HF ratio {ours_s / hf_s:.2f} / "
                  f"{ours_min / hf_min:.2f}; per-token cosine min {cos.min().item():.6f} mean {cos.mean().item():.6f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
