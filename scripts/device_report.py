"""The device check's one table, from what its sections left in a results folder:
sections.tsv (name, status, seconds, budget, note), pytest's junit XML files (every CUDA test),
engine.json (bench/gpu_report.py), llama.json (llama-bench -o json) or llama.txt (why not).

    python scripts/device_report.py RESULTS_DIR
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def _rows_of_junit(path: Path) -> list[tuple[str, str, str]]:
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".removeprefix("tests.")
        status, note = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                status = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                note = (el.get("message") or "").splitlines()[0][:90] if el.get("message") else ""
                break
        rows.append((name, status, note))
    return rows


def _llama(results: Path) -> dict:
    """decode / prefill tok/s of llama-bench's JSON (n_gen / n_prompt tests)."""
    path = results / "llama.json"
    if not path.exists():
        return {}
    out = {}
    for run in json.loads(path.read_text() or "[]"):
        if run.get("n_gen"):
            out["decode_tok_s"] = run.get("avg_ts")
        elif run.get("n_prompt"):
            out["prefill_tok_s"] = run.get("avg_ts")
            out["prefill_tokens"] = run.get("n_prompt")
    return out


def table(results: Path) -> str:
    lines = ["| what | tramontane | reference | note |", "|---|---|---|---|"]
    add = lambda *cells: lines.append("| " + " | ".join(str(c) for c in cells) + " |")  # noqa: E731
    sections = results / "sections.tsv"
    if sections.exists():
        for ln in sections.read_text().splitlines():
            name, status, took, budget, note = (ln.split("\t") + [""] * 5)[:5]
            add(f"section {name}", status, f"budget {budget} s", f"took {took} s {note}".strip())
    for xml in sorted(results.glob("*.xml")):
        for name, status, note in _rows_of_junit(xml):
            add(f"test {name}", status, "", note)
    eng_path = results / "engine.json"
    llama = _llama(results)
    llama_note = (results / "llama.txt").read_text().strip() if (results / "llama.txt").exists() else ""
    if eng_path.exists():
        e = json.loads(eng_path.read_text())
        if "placement" in e:
            add("placement", e["placement"], "", f"context {e.get('context')}, graphs {e.get('graphs')}")
        if "decode_tok_s" in e:
            bound = e.get("decode_bound_tok_s") or 0
            add("decode tok/s", f"{e['decode_tok_s']:.1f}",
                f"bound {bound:.1f} ({e.get('weights_read_per_token_bytes', 0) / 1e9:.2f} GB / "
                f"{e.get('copy_bandwidth_GBs', 0):.0f} GB/s)"
                + (f"; llama.cpp {llama['decode_tok_s']:.1f}" if llama.get("decode_tok_s") else ""),
                f"{e['decode_tok_s'] / bound:.0%} of the bound" if bound else "")
            add(f"prefill tok/s ({e.get('prefill_tokens')} tokens)", f"{e.get('prefill_tok_s', 0):.0f}",
                f"llama.cpp {llama['prefill_tok_s']:.0f} ({llama.get('prefill_tokens')} tokens)"
                if llama.get("prefill_tok_s") else "", "")
        if "turn2_ttft_reuse_s" in e:
            add(f"turn-2 TTFT ({e.get('turn2_prompt_tokens')} tokens, {e.get('turn2_reused_tokens')} reused)",
                f"{e['turn2_ttft_reuse_s'] * 1000:.0f} ms", f"cold {e.get('turn2_ttft_cold_s', 0) * 1000:.0f} ms", "")
        if "image_encode_s" in e:
            side = e.get("image_side", 1024)
            add(f"image {side}x{side} encode", f"{e['image_encode_s'] * 1000:.0f} ms", "",
                f"{e.get('image_tokens')} tokens, {e.get('vision_dtype')}")
        for stage, (plan, seen) in e.get("memory_planned_vs_reserved", {}).items():
            if plan or seen:
                add(f"GPU memory: {stage}", f"reserved {(seen or 0) / 2**30:.2f} GiB",
                    f"planned {(plan or 0) / 2**30:.2f} GiB", "over plan!" if plan and seen and seen > plan else "")
        for w in e.get("warnings", []):
            add("engine warning", "", "", w)
        for what, why in e.get("errors", {}).items():
            add(f"engine: {what}", "FAILED", "", why)
        if llama and "decode_tok_s" not in e:
            add("llama.cpp decode / prefill tok/s", "", f"{llama.get('decode_tok_s')} / {llama.get('prefill_tok_s')}", "")
    elif llama:
        add("llama.cpp decode tok/s", "", llama.get("decode_tok_s", ""), "")
    if llama_note:
        add("llama.cpp", "", "", llama_note)
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
