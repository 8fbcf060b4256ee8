"""`tramontane-cli info --plan` and `--device-map` on run / bench."""
import json
import os

import pytest

from support import FIXTURES
from support.empty_gguf import write_empty_gguf
from tramontane.engine.cli.main import main as cli_main
from tramontane.engine.gguf import open_gguf
from tramontane.engine.runtime import device_map

GiB = 1 << 30
TINY = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")


@pytest.fixture
def gpu12(monkeypatch):
    """A simulated machine: one 12 GB GPU and 64 GB of RAM."""
    machine = device_map.Machine((device_map.DeviceInfo("cuda:0", 12 * GiB, "simulated"),),
                                 device_map.DeviceInfo("cpu", 64 * GiB, "simulated"))
    monkeypatch.setattr(device_map, "detect_machine", lambda: machine)


def test_info_plan_prints_the_arithmetic(tmp_path, gpu12, capsys):
    """Mistral-Small-3.1-24B Q4_K_M (text only, an empty sparse GGUF) on 12 GB: usable 11 GiB
    - head 550,522,880 - cuBLAS workspace and graph pool 167,772,160 - a prefill chunk's rows and
    scratch 584,384,512 leaves 10,508,480,512 for layers 10..39 with 16 MiB KV each
    (10,507,223,040); layer 9 would need 333,422,592 more."""
    path = write_empty_gguf(tmp_path / "small.gguf", 40, 5120, 32768)
    assert cli_main(["info", "--plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "cuda:0 (simulated): 12.00 GiB free - 1.00 GiB headroom = 11.00 GiB usable" in out
    assert "layers 10-39 (30)" in out and out.rstrip().endswith("=> 30 of 40 layers on GPU, 10 on CPU")
    assert cli_main(["info", "--plan", "--max-seq-len", "1024", "--json", str(path)]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["gpu_layers"] > 30 and plan["fit"] == "partial" and plan["embedding"] == "cpu"
    assert plan["context_length"] == 1024 and set(plan["devices"][0]["stages"]) == {"load", "prefill chunk", "decode"}


def test_info_plan_errors_are_one_line(tmp_path, gpu12, capsys):
    assert cli_main(["info", "--plan", "--device-map", "cuda:1=2", TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device map 'cuda:1=2': this machine has no cuda:1") and err.count("\n") == 1
    assert cli_main(["info", "--plan", "--max-seq-len", "0", TINY]) == 2
    assert "--max-seq-len must be at least 1" in capsys.readouterr().err


def test_run_with_a_device_map_answers_as_without(capsys):
    args = ["run", "--model", TINY, "--device", "cpu", "--prompt", "hello", "--max-tokens", "6", "--temperature", "0", "--json"]
    assert cli_main(args) == 0
    whole = json.loads(capsys.readouterr().out)
    assert cli_main(args + ["--device-map", "cpu:0=1,cpu:1=1"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert split["token_ids"] == whole["token_ids"] and split["text"] == whole["text"]
    assert cli_main(args + ["--device-map", "cpu=3"]) == 2
    assert "places 3 layers; mistral3_tiny-f32.gguf has 2" in capsys.readouterr().err


def test_perplexity_with_a_device_map_is_the_same_number(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("The tramontane is a cold north wind. It blows over the plain.\n", encoding="utf-8")
    args = ["perplexity", "--model", TINY, "--file", str(text), "--device", "cpu", "--json"]
    assert cli_main(args) == 0
    whole = json.loads(capsys.readouterr().out)
    assert cli_main(args + ["--device-map", "cpu:0=1,cpu:1=1"]) == 0
    assert json.loads(capsys.readouterr().out) == whole


def test_info_plan_kv_type_f16_fits_twice_the_positions_of_f32(tmp_path, monkeypatch, capsys):
    """--kv-type reaches the planner: Mistral-Small-3.1-24B (the planner's own hand-checked case,
    tests/engine/runtime/test_device_map.py::test_f16_kv_fits_twice_the_context_of_f32_on_the_same_cpu)
    on a CPU sized so that f32 KV fits exactly 8192 positions; KV is what limits there, so
    f16 fits exactly 16384 and one position more fails either way."""
    path = write_empty_gguf(tmp_path / "small.gguf", 40, 5120, 32768)
    with open_gguf(path) as gf:
        sizes = device_map.sizes_of_files(gf)
    big = device_map.DeviceInfo("cpu", 1 << 50, "simulated")
    need = device_map.plan_devices(sizes, device_map.Machine((), big),
                                   device_map.Budget(max_seq_len=8192)).placements[0].total
    cpu = device_map.DeviceInfo("cpu", need + big.headroom, "simulated")
    monkeypatch.setattr(device_map, "detect_machine", lambda: device_map.Machine((), cpu))
    per_layer = {"f32": 8192 * 8 * (128 + 128) * 4, "f16": 16384 * 8 * (128 + 128) * 2}  # both 64 MiB
    for kv_type, fits in (("f32", 8192), ("f16", 16384)):
        args = ["info", "--plan", "--device", "cpu", "--kv-type", kv_type, str(path)]
        assert cli_main(args + ["--max-seq-len", str(fits)]) == 0
        out = capsys.readouterr().out
        assert f"40 x {per_layer[kv_type] / (1 << 20):.1f} MiB KV" in out
        assert f"{fits} positions x 2048 values x {4 if kv_type == 'f32' else 2} B ({kv_type})" in out
        assert out.rstrip().endswith("=> all 40 layers on the CPU")
        assert cli_main(args + ["--max-seq-len", str(fits + 1)]) == 2
        assert "does not fit this machine" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's own refusal, like run's
        cli_main(["info", "--plan", "--kv-type", "q8", str(path)])
    assert exited.value.code == 2 and "invalid choice: 'q8'" in capsys.readouterr().err
