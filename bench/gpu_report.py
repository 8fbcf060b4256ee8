"""The engine on one model file as a user gets it (LocalEngine: the plan, the load, graphs captured
at load), measured: decode and prefill tok/s against the memory-bandwidth bound, turn-2 TTFT
with KV reuse against cold, one 1024x1024 image's encode time, and the plan's memory per stage
against what the GPU's allocator really held (peak reserved) at that stage.

    python bench/gpu_report.py MODEL.gguf [--mmproj MMPROJ.gguf] [--device cuda] --json OUT.json

Decode reads every linear weight once per token: bound tok/s = copy bandwidth / those bytes
(the copy bandwidth measured here, read + write of a large device copy). Not a test.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time

import numpy as np
import torch

from tramontane.engine.api import ImagePart, SamplingParams
from tramontane.engine.cli.bench import copy_bandwidth
from tramontane.engine.runtime.local import LocalEngine


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _png(side: int, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


class StagePeaks:
    """Peak bytes torch's allocator reserved on one GPU during each stage (reset between)."""

    def __init__(self, device: torch.device):
        self.device, self.peaks = device, {}

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def end(self, stage: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peaks[stage] = int(torch.cuda.max_memory_reserved(self.device))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--mmproj", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", type=int, default=2048, help="prefill length (cold)")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--turn1", type=int, default=1500, help="tokens of the first turn (reused in turn 2)")
    ap.add_argument("--image", type=int, default=1024)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    out: dict = {"model": a.model}
    device = torch.device("cuda:0" if a.device.startswith("cuda") else "cpu")
    peaks = StagePeaks(device)

    t = time.perf_counter()
    peaks.start()
    try:
        eng = LocalEngine(a.model, a.mmproj, device="cuda" if device.type == "cuda" else "cpu")
    except Exception as exc:  # noqa: BLE001 - the table says why
        out["errors"] = {"load": f"{type(exc).__name__}: {exc}"[:300]}
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=1)
        raise
    _sync(device)
    peaks.end("load")
    out["load_s"] = time.perf_counter() - t
    out["placement"] = eng.placement["summary"]
    out["context"] = eng.context_size
    out["warnings"] = eng.warnings
    model = eng.model
    graphs = eng.pool.decode_graphs
    out["graphs"] = sorted({(r, b) for _, r, b in graphs.graphs}) if graphs is not None else []  # (rows, keys)
    # bytes a decode step reads: every layer, the head (not the embedding table: one row)
    sizes = eng.plan
    weights = model.weight_bytes - (model.embedding.weight.nbytes if model.head is not model.embedding.weight else 0)
    out["weights_read_per_token_bytes"] = weights
    bw = copy_bandwidth(device, (2 << 30) if device.type == "cuda" else (256 << 20))
    out["copy_bandwidth_GBs"] = bw
    out["decode_bound_tok_s"] = bw * 1e9 / weights
    print(f"placement: {out['placement']}; context {out['context']}; graphs for (rows, keys) buckets {out['graphs']}")
    print(f"load {out['load_s']:.1f} s; copy bandwidth {bw:.0f} GB/s; {weights / 1e9:.2f} GB read per token")
    vocab = model.cfg.vocab_size
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(1000, vocab, n).tolist()  # noqa: E731

    errors = out.setdefault("errors", {})

    def step(name: str, fn) -> None:
        """One measurement; a failure is recorded (the table shows it) and the others still run."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a first GPU run: report everything that fails
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"{name}: FAILED: {errors[name]}")

    def warm():  # first launches (Triton compile / autotune) outside the measurements
        eng.complete(ids(64), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), session_key="warm")

    def prefill_and_decode():
        n_prompt = min(a.prompt, eng.context_size - a.decode - 1)
        peaks.start()
        r = eng.complete(ids(n_prompt), SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
                         session_key="prefill")
        peaks.end("prefill chunk")
        out["prefill_tokens"], out["prefill_tok_s"] = n_prompt, n_prompt / r.stats.ttft_s
        peaks.start()
        r = eng.complete(ids(32), SamplingParams(max_tokens=a.decode, temperature=0.0, ignore_eos=True),
                         session_key="decode")
        peaks.end("decode")
        out["decode_tokens"], out["decode_tok_s"] = len(r.token_ids), r.stats.decode_tok_s
        print(f"decode {out['decode_tok_s']:.1f} tok/s (bound {out['decode_bound_tok_s']:.1f}, "
              f"{out['decode_tok_s'] / out['decode_bound_tok_s']:.0%}); prefill {n_prompt} tokens "
              f"{out['prefill_tok_s']:.0f} tok/s")

    def turn2():  # the first turn's KV reused, against the same prompt cold
        turn1 = ids(min(a.turn1, eng.context_size // 2))
        first = eng.complete(turn1, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), session_key="chat")
        prompt = turn1 + first.token_ids + ids(24)
        two = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        reuse = eng.complete(prompt, two, session_key="chat")
        cold = eng.complete(prompt, two, session_key="cold")
        out.update(turn2_prompt_tokens=len(prompt), turn2_reused_tokens=reuse.stats.reused_tokens,
                   turn2_ttft_reuse_s=reuse.stats.ttft_s, turn2_ttft_cold_s=cold.stats.ttft_s)
        print(f"turn 2 ({len(prompt)} tokens, {reuse.stats.reused_tokens} reused): TTFT "
              f"{reuse.stats.ttft_s * 1000:.0f} ms, cold {cold.stats.ttft_s * 1000:.0f} ms")

    def batched_decode():
        """Decode steps of 1 and 8 sequences over the pool (paged attention, every row through its
        block table), replayed from the (rows, keys) graph buckets against the same steps eager."""
        from tramontane.engine.runtime.decoder import decode_rows

        for streams in (1, 8):
            for mode in ("graphed", "eager"):
                saved = eng.pool.decode_graphs
                if mode == "eager":
                    eng.pool.decode_graphs = None
                seqs = [eng.new_sequence() for _ in range(streams)]
                try:
                    for seq in seqs:
                        model.forward(model.embed(ids(40)), 0, seq)
                    tokens = [1000 + i for i in range(streams)]
                    decode_rows(model, tokens, seqs)  # first launches
                    _sync(device)
                    t = time.perf_counter()
                    steps = 16
                    for _ in range(steps):
                        tokens = decode_rows(model, tokens, seqs).argmax(-1).tolist()
                    _sync(device)
                    rate = streams * steps / (time.perf_counter() - t)
                finally:
                    eng.pool.decode_graphs = saved
                    for seq in seqs:
                        seq.release()
                out[f"decode_{streams}_streams_{mode}_tok_s"] = rate
            g, e = out[f"decode_{streams}_streams_graphed_tok_s"], out[f"decode_{streams}_streams_eager_tok_s"]
            print(f"decode, {streams} stream(s) at once: graphed {g:.1f} tok/s, eager {e:.1f} tok/s ({g / e:.2f}x)")

    def image():
        pic = ImagePart(_png(a.image, 1), f"noise-{a.image}.png")
        eng.vision.encode_image_parts([ImagePart(_png(64, 2), "warm.png")])  # first launches
        eng.vision.clear_cache()
        peaks.start()
        t = time.perf_counter()
        feats = eng.vision.encode_image_parts([pic])[0]
        _sync(device)
        out["image_encode_s"] = time.perf_counter() - t
        peaks.end("vision encode")
        out["image_tokens"], out["vision_dtype"] = int(feats.shape[0]), str(eng.vision.dtype).removeprefix("torch.")
        out["image_side"] = a.image
        print(f"image {a.image}x{a.image} ({out['image_tokens']} tokens, {out['vision_dtype']}): "
              f"{out['image_encode_s'] * 1000:.0f} ms")

    try:
        step("warm-up", warm)
        step("prefill and decode", prefill_and_decode)
        step("turn 2", turn2)
        step("batched decode", batched_decode)
        if eng.vision is not None:
            step("image", image)
        if device.type == "cuda":
            planned = next((p for p in sizes.placements if p.name == "cuda:0"), None)
            out["memory_planned_vs_reserved"] = {
                stage: [planned.stages().get(stage) if planned else None, peaks.peaks.get(stage)]
                for stage in ("load", "vision encode", "prefill chunk", "decode")}
            for stage, (plan, seen) in out["memory_planned_vs_reserved"].items():
                if plan or seen:
                    print(f"memory {stage}: planned {(plan or 0) / 2**30:.2f} GiB, "
                          f"reserved {(seen or 0) / 2**30:.2f} GiB")
        for w in out["warnings"]:
            print("warning:", w)
    finally:
        eng.close()
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=1)
    return out if not errors else {}

if __name__ == "__main__":
    sys.exit(0 if main() else 1)
