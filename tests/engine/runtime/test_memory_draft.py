"""The draft model in the one memory plan (issue 38 item 2): its weights, its KV pool and its own
pass are counted on the device it is placed on — beside the output head when it fits, the CPU
when the GPU is full — a model and draft that do not fit together are refused naming both, and
the figures (explain, as_dict, `info --plan --draft-model`, the Models dialog's fit) count it.

Shapes: Mistral-Small-3.1-24B Q4_K_M as target and a Ministral-3-3B-shaped Q4_K_M draft (26
layers, hidden 3072, ffn 9216, 8 KV heads of 128), header-only GGUFs (support.empty_gguf); the
draft's bytes are checked against gguf-py's own reading of its file, its KV by hand."""
from __future__ import annotations

import pytest
import torch
from gguf import GGUFReader

from support import FIXTURES
from support.empty_gguf import write_empty_gguf
from tramontane.engine.gguf import open_gguf
from tramontane.engine.runtime.device_map import (Budget, DeviceInfo, Machine, PlanError, plan_devices,
                                                  plan_for_files, sizes_of_files)

GiB = 1 << 30
KV_3B_GPU = 4096 * 26 * 8 * (128 + 128) * 2  # bf16 K+V of 26 layers for the 4096-token default context
KV_3B_CPU = 2 * KV_3B_GPU  # the draft's CPU pool is float32
GRAPH_POOL = 96 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft")
    return {"target": write_empty_gguf(d / "Mistral-Small-3.1-24B-Q4_K_M.gguf", 40, 5120, 32768),
            "draft": write_empty_gguf(d / "Ministral-3-3B-Q4_K_M.gguf", 26, 3072, 9216)}


def _sizes(path):
    with open_gguf(path) as gf:
        return sizes_of_files(gf)


def _file_tensor_bytes(path) -> int:
    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def _cpu(gib: float) -> DeviceInfo:
    return DeviceInfo("cpu", int(gib * GiB), "simulated")


def _gpu(gib: float) -> DeviceInfo:
    return DeviceInfo("cuda:0", int(gib * GiB), "simulated")


def test_the_draft_sits_beside_the_head_on_a_gpu_with_room(files):
    target, draft = _sizes(files["target"]), _sizes(files["draft"])
    machine = Machine((_gpu(24),), _cpu(64))
    alone = plan_devices(target, machine)
    plan = plan_devices(target, machine, draft=draft)
    assert plan.draft_device == "cuda:0" == plan.head_device and plan.fit == "gpu"
    gpu = plan.placements[0]
    assert gpu.parts["draft model"] == _file_tensor_bytes(files["draft"])  # untied: every tensor once
    assert gpu.parts["draft KV"] == KV_3B_GPU and gpu.parts["draft CUDA graph pool"] == GRAPH_POOL
    draft_resident = _file_tensor_bytes(files["draft"]) + KV_3B_GPU + GRAPH_POOL
    assert gpu.resident == alone.placements[0].resident + draft_resident
    assert gpu.total >= alone.placements[0].total + draft_resident  # every stage holds the draft
    assert "draft" in gpu.stages() and gpu.stages()["draft"] > gpu.resident
    info = plan.as_dict()
    assert info["draft"] == {"model": "Ministral-3-3B-Q4_K_M.gguf", "device": "cuda:0", "bytes": draft_resident}
    text = plan.explain()
    assert "draft model" in text and "draft KV" in text and "draft Ministral-3-3B-Q4_K_M.gguf on cuda:0" in text


def test_a_full_gpu_sends_the_draft_to_the_cpu_and_the_cpu_counts_it(files):
    target, draft = _sizes(files["target"]), _sizes(files["draft"])
    machine = Machine((_gpu(12),), _cpu(64))  # the 24B spills layers to the CPU: the GPU is full
    alone = plan_devices(target, machine)
    plan = plan_devices(target, machine, draft=draft)
    assert plan.fit == "partial" and plan.draft_device == "cpu"
    assert plan.gpu_layers == alone.gpu_layers  # the model's layers keep the GPU
    cpu = next(p for p in plan.placements if p.name == "cpu")
    assert cpu.parts["draft KV"] == KV_3B_CPU and "draft CUDA graph pool" not in cpu.parts
    assert cpu.resident == next(p for p in alone.placements if p.name == "cpu").resident \
        + _file_tensor_bytes(files["draft"]) + KV_3B_CPU


def test_a_gpu_that_holds_the_model_whole_but_not_the_draft_adds_the_cpu(files):
    target, draft = _sizes(files["target"]), _sizes(files["draft"])
    alone = plan_devices(target, Machine((_gpu(40),), _cpu(64)))
    room = alone.placements[0].total + (1 << 30) + (100 << 20)  # headroom + 100 MiB: no room for 2 GB
    plan = plan_devices(target, Machine((DeviceInfo("cuda:0", room, "simulated"),), _cpu(64)), draft=draft)
    assert plan.fit == "gpu" and plan.draft_device == "cpu"
    assert [p.name for p in plan.placements] == ["cuda:0", "cpu"] and not plan.placements[1].layers
    assert plan.placements[0].total == alone.placements[0].total


def test_a_model_and_draft_that_do_not_fit_together_are_refused_naming_both(files):
    target, draft = _sizes(files["target"]), _sizes(files["draft"])
    alone = plan_devices(target, Machine((), _cpu(64)))
    need = alone.placements[0].total
    tight = DeviceInfo("cpu", need + 2 * GiB + GiB // 2, "simulated")  # the model fits, 0.5 GiB to spare
    plan_devices(target, Machine((), tight))
    with pytest.raises(PlanError) as info:
        plan_devices(target, Machine((), tight), draft=draft)
    msg = str(info.value)
    assert "Ministral-3-3B-Q4_K_M.gguf" in msg and "Mistral-Small-3.1-24B-Q4_K_M.gguf" in msg
    assert "4096-token context" in msg and "cpu 0.50 GiB left" in msg
    # a smaller context makes room only for the model's KV, not the draft's 2 GB of weights: still refused
    with pytest.raises(PlanError, match="draft model"):
        plan_devices(target, Machine((), tight), Budget(max_seq_len=1024), draft=draft)


def test_a_manual_map_warns_instead(files):
    target, draft = _sizes(files["target"]), _sizes(files["draft"])
    need = plan_devices(target, Machine((), _cpu(64))).placements[0].total
    tight = DeviceInfo("cpu", need + 2 * GiB + GiB // 2, "simulated")
    plan = plan_devices(target, Machine((), tight), manual=[("cpu", 40)], draft=draft)
    assert plan.draft_device == "cpu" and any("draft model" in w for w in plan.warnings)


def test_info_plan_and_the_models_dialog_fit_count_the_draft(files, capsys):
    import argparse

    from tramontane.engine.cli import inspect
    from tramontane.engine.library.fit import fit_of_file

    machine = Machine((), _cpu(64))
    with_draft = fit_of_file(files["target"], None, machine, "cpu", draft_path=files["draft"])
    without = fit_of_file(files["target"], None, machine, "cpu")
    assert "draft KV" in with_draft.detail and "draft" not in without.detail
    tight = DeviceInfo("cpu", plan_devices(_sizes(files["target"]), machine).placements[0].total + 2 * GiB + 1,
                       "simulated")
    refused = fit_of_file(files["target"], None, Machine((), tight), "cpu", draft_path=files["draft"])
    assert refused.kind == "too_big" and "Ministral-3-3B" in refused.detail

    parser = argparse.ArgumentParser()
    inspect.add_parsers(parser.add_subparsers())
    args = parser.parse_args(["info", str(files["target"]), "--plan", "--device", "cpu",
                              "--draft-model", str(files["draft"])])
    args.func(args)
    assert "draft Ministral-3-3B-Q4_K_M.gguf on cpu" in capsys.readouterr().out


def test_the_engine_loads_the_draft_where_the_plan_put_it():
    from tramontane.engine.runtime.local import LocalEngine

    model = FIXTURES / "mistral3_tiny-f32.gguf"
    eng = LocalEngine(model, device="cpu", context_length=256, draft_model=model)
    try:
        assert eng.plan.draft_device == "cpu" and eng.placement["draft"]["device"] == "cpu"
        draft = eng.scheduler.draft_model
        assert str(draft.model.device) == "cpu"
        cpu = eng.plan.placements[0]
        # what was planned is the pool the loader made: 256 positions of float32 K+V
        assert cpu.parts["draft KV"] == 256 * draft.model.kv_bytes_per_token(dtype=torch.float32)
    finally:
        eng.close()


def test_plan_for_files_names_a_draft_it_cannot_read(files, tmp_path):
    from tramontane.engine.api import EngineError

    with open_gguf(files["target"]) as gf:
        with pytest.raises((EngineError, OSError)) as info:
            plan_for_files(gf, None, "cpu", draft_path=tmp_path / "missing.gguf",
                           machine=Machine((), _cpu(64)))
    assert "missing.gguf" in str(info.value)
