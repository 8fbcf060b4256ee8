"""scripts/device_report.py: the device check's one table, from a junit file written by pytest
itself (a pass, a failure, a skip), an engine report and llama-bench's JSON fields (n_prompt,
n_gen, avg_ts as llama-bench writes them)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_report", ROOT / "scripts" / "device_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_one_table_has_every_test_the_numbers_and_llama_cpp(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "test_three.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pass\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='needs a CUDA GPU')\ndef test_gpu():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                          f"--junitxml={results / 'cuda.xml'}", str(tmp_path / "test_three.py")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 1, run.stdout[-2000:]
    (results / "sections.tsv").write_text("setup\tpassed\t41\t100\t\nengine-bench\tskipped\t0\t140\tonly 90s left\n")
    (results / "engine.json").write_text(json.dumps({
        "placement": "all 40 layers on cuda:0", "context": 4096, "graphs": [256, 512],
        "decode_tok_s": 50.0, "decode_bound_tok_s": 200.0, "weights_read_per_token_bytes": 13.9e9,
        "copy_bandwidth_GBs": 2780.0, "prefill_tokens": 2048, "prefill_tok_s": 3000.0,
        "turn2_prompt_tokens": 1540, "turn2_reused_tokens": 1516, "turn2_ttft_reuse_s": 0.05,
        "turn2_ttft_cold_s": 0.6, "image_encode_s": 0.25, "image_tokens": 1406, "vision_dtype": "bfloat16",
        "memory_planned_vs_reserved": {"load": [15e9, 14.5e9], "decode": [16e9, 16.5e9]},
        "warnings": ["CUDA graph capture failed for decode bucket 512 (keys) of layers 0-39 on cuda:0: x"]}))
    (results / "llama.json").write_text(json.dumps([
        {"n_prompt": 2048, "n_gen": 0, "avg_ts": 3500.5}, {"n_prompt": 0, "n_gen": 64, "avg_ts": 60.25}]))
    table = _report_module().table(results).splitlines()
    assert table[0] == "| what | tramontane | reference | note |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    assert "passed" in rows["test test_three::test_ok"]
    assert "FAILED" in rows["test test_three::test_bad"] and "one is not two" in rows["test test_three::test_bad"]
    assert "skipped" in rows["test test_three::test_gpu"] and "needs a CUDA GPU" in rows["test test_three::test_gpu"]
    assert "skipped" in rows["section engine-bench"] and "only 90s left" in rows["section engine-bench"]
    assert rows["decode tok/s"] == ("| decode tok/s | 50.0 | bound 200.0 (13.90 GB / 2780 GB/s); llama.cpp 60.2 "
                                    "| 25% of the bound |")
    assert "3000" in rows["prefill tok/s (2048 tokens)"] and "llama.cpp 3500 (2048 tokens)" in rows["prefill tok/s (2048 tokens)"]
    assert "50 ms" in rows["turn-2 TTFT (1540 tokens, 1516 reused)"] and "cold 600 ms" in rows["turn-2 TTFT (1540 tokens, 1516 reused)"]
    assert "250 ms" in rows["image 1024x1024 encode"]
    assert "over plan!" in rows["GPU memory: decode"] and "over plan" not in rows["GPU memory: load"]
    assert "decode bucket 512" in rows["engine warning"]
