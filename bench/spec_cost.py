"""What verifying k drafted tokens costs against a plain decode step (issue 38, bench (a)), and the
speed-up it predicts at a given acceptance.

    python bench/spec_cost.py --model FILE.gguf [--context 1024] [--acceptance 0.7 --draft-cost 0.12]
    python bench/spec_cost.py --shape small            # bench/model.py's random model, real block types

One row: the plain loop's decode step (runtime/decoder.decode: the native whole-step decode on
the CPU, CUDA graphs on a GPU). k+1 rows: one forward of the pending token and k drafts after the
same context (Mistral3Text.logits with every row's logits, what a verification reads), the KV
cache cut back after each. Median of --repeats per row count. Prints one JSON object: seconds per
row count, verify[k] = t(k+1) / t(1) (runtime/speculative.SpeculationCost), and per k the
predicted speed-up expected_tokens(a, k) / (verify[k] + k * draft_cost) with the best k.
Not a test: nothing under tests/ imports it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import SHAPES, build_random_model, sync  # noqa: E402  (bench/model.py's random models)
from tramontane.engine.mistral3.text import Mistral3Text, default_dtype, resolve_device  # noqa: E402
from tramontane.engine.runtime.decoder import decode, new_cache  # noqa: E402
from tramontane.engine.runtime.speculative import SpeculationCost, expected_tokens  # noqa: E402


def step_seconds(model, cache, context: int, rows: int, repeats: int, device) -> float:
    """Median seconds of a step of `rows` rows after `context` positions."""
    gen = torch.Generator().manual_seed(rows)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        ids = torch.randint(1000, model.cfg.vocab_size, (rows,), generator=gen).tolist()
        sync(device)
        t = time.perf_counter()
        if rows == 1:
            decode(model, ids[0], cache)
        else:
            model.logits(ids, context, cache, all_logits=True)
        sync(device)
        times.append(time.perf_counter() - t)
        cache.truncate(context)
    return statistics.median(times[1:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a GGUF file (default: --shape's random model)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--mix", default="q4_k_m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--context", type=int, default=1024, help="positions already in the cache")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--acceptance", type=float, action="append", default=None,
                    help="per-token acceptance to predict for (repeatable; default 0.5 0.7 0.8 0.9)")
    ap.add_argument("--draft-cost", type=float, default=0.0,
                    help="a draft token's step relative to the target's (0: prompt lookup)")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if args.model is not None:
        model = Mistral3Text.load(args.model, device=device)
    else:
        model = build_random_model(args.shape, args.mix, device, default_dtype(device))
    context = min(args.context, model.cfg.context_length - args.max_k - 2)
    cache = new_cache(model, context + args.max_k + 2)
    warm = torch.randint(1000, model.cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0))
    model.logits(warm.tolist(), 0, cache)
    seconds = {rows: step_seconds(model, cache, context, rows, args.repeats, device)
               for rows in range(1, args.max_k + 2)}
    cost = SpeculationCost.from_timings(seconds, args.max_k, args.draft_cost)
    report = {"model": str(args.model) if args.model else f"random {args.shape} {args.mix}", "device": str(device),
              "context": context, "seconds_by_rows": {r: round(s, 6) for r, s in seconds.items()},
              "verify": [round(v, 4) for v in cost.verify], "draft_cost": args.draft_cost, "predicted": {}}
    for a in args.acceptance or [0.5, 0.7, 0.8, 0.9]:
        gains = {k: expected_tokens(a, k) / cost.step(k) for k in range(1, args.max_k + 1)}
        best = max(gains, key=gains.get)
        report["predicted"][a] = {"best_k": best, "speedup": round(gains[best], 3),
                                  "by_k": {k: round(g, 3) for k, g in gains.items()}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
