"""Whether a model fits this machine (engine/library/fit.py): catalogue estimates planned by the same
planner as real files and checked against the real tensor inventories; local files planned from
their headers; Settings' "GPU layers: N" turned into the engine's manual map."""
from __future__ import annotations

import pytest

from support import FIXTURES
from support.empty_gguf import write_empty_gguf
from tramontane.engine.library.fit import catalog_sizes, fit_of_file, fit_of_sizes, gpu_layers_device_map
from tramontane.engine.gguf import open_gguf
from tramontane.engine.library.catalog import load_catalog
from tramontane.engine.runtime.device_map import (DeviceInfo, Machine, parse_device_map, plan_devices,
                                                  plan_for_files, sizes_of_files)

GiB = 1 << 30
CPU64 = DeviceInfo("cpu", 64 * GiB, "simulated")
TINY = FIXTURES / "mistral3_tiny-f32.gguf"
TINY_PROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"

# (catalogue id, layers, hidden, ffn) of the entries whose real Q4_K_M inventory we can write
REAL = [("mistral-small-3.1-24b-instruct", 40, 5120, 32768), ("ministral-3-8b-instruct", 34, 4096, 14336),
        ("ministral-3-14b-instruct", 40, 5120, 16384)]


def _gpu(gib: float) -> Machine:
    return Machine((DeviceInfo("cuda:0", int(gib * GiB), "simulated"),), CPU64)


@pytest.fixture(scope="module")
def real_sizes(tmp_path_factory):
    d = tmp_path_factory.mktemp("inventories")
    out = {}
    for entry_id, layers, hidden, ffn in REAL:
        with open_gguf(write_empty_gguf(d / f"{entry_id}.gguf", layers, hidden, ffn)) as gf:
            out[entry_id] = sizes_of_files(gf)
    return out


@pytest.fixture(scope="module")
def catalog():
    return {e.id: e for e in load_catalog()}


@pytest.mark.parametrize("entry_id", [r[0] for r in REAL])
def test_published_file_size_matches_the_shape(catalog, real_sizes, entry_id):
    """The catalogue's size and shape are independent facts; the real Q4_K_M inventory of the
    shape must add up to the published file (which adds the tokenizer and metadata)."""
    s = real_sizes[entry_id]
    tensors = sum(s.layer_bytes) + s.embedding_bytes + s.head_bytes
    published = catalog[entry_id].variants[0].size_gb * 1e9
    assert 0 < published - tensors < 0.005 * published


@pytest.mark.parametrize("gib", [8, 12, 16, 24])
@pytest.mark.parametrize("entry_id", [r[0] for r in REAL])
def test_catalogue_estimate_plans_like_the_real_inventory(catalog, real_sizes, entry_id, gib):
    entry = catalog[entry_id]
    estimate = catalog_sizes(entry, int(entry.variants[0].size_gb * 1e9), None)
    assert estimate.n_layers == real_sizes[entry_id].n_layers
    # the estimate spreads the file over its tensors: within 3% of the real layer bytes (the head is Q6_K, heavier than the average)
    assert sum(estimate.layer_bytes) == pytest.approx(sum(real_sizes[entry_id].layer_bytes), rel=0.03)
    machine = _gpu(gib)
    est, real = plan_devices(estimate, machine), plan_devices(real_sizes[entry_id], machine)
    assert est.fit == real.fit
    assert abs(est.gpu_layers - real.gpu_layers) <= 1


def test_fit_words_on_simulated_machines(catalog):
    small = catalog["mistral-small-3.1-24b-instruct"]
    sizes = catalog_sizes(small, int(14.334e9), int(0.878e9))
    assert sizes.has_vision and sizes.vision_bytes == int(0.878e9)
    assert fit_of_sizes(sizes, _gpu(24)).words == "on the GPU"
    partial = fit_of_sizes(sizes, _gpu(12))
    assert partial.words == "partly on the CPU" and "layers on GPU" in partial.detail
    assert fit_of_sizes(sizes, Machine((), CPU64)).words == "on the CPU"
    too_big = fit_of_sizes(sizes, Machine((), DeviceInfo("cpu", 8 * GiB)))
    assert too_big.words == "too big" and "does not fit this machine" in too_big.detail
    # 2.147 GB of 3B weights with a 2 GiB-headroom 6 GiB GPU: on the GPU, from the same planner
    three = catalog["ministral-3-3b-instruct"]
    assert three.shape.tied
    assert fit_of_sizes(catalog_sizes(three, 2_147_023_008, None), _gpu(6)).kind == "gpu"


def test_fit_of_a_file_is_the_engines_plan():
    machine = Machine((), DeviceInfo("cpu", 16 * GiB))
    fit = fit_of_file(TINY, TINY_PROJ, machine)
    with open_gguf(TINY) as gf:
        plan = plan_for_files(gf, TINY_PROJ, "cpu", machine=machine)
    assert (fit.kind, fit.detail) == ("cpu", plan.explain())
    assert "vision tower" in fit.detail
    assert fit_of_file(TINY, None, _gpu(8)).kind == "gpu"
    assert fit_of_file(TINY, None, _gpu(8), device="cpu").kind == "cpu"  # Settings' device: cpu
    # a CPU with no room left: the planner's error, in words
    full = fit_of_file(TINY, None, Machine((), DeviceInfo("cpu", 2 * GiB)))
    assert full.words == "too big" and "does not fit" in full.detail
    assert fit_of_file(TINY_PROJ, None, machine) is None  # a projector is not a model


def test_gpu_layers_setting_becomes_the_manual_map():
    with open_gguf(TINY) as gf:
        n = sizes_of_files(gf).n_layers
    assert gpu_layers_device_map(TINY, None) is None
    assert gpu_layers_device_map(TINY, -1) is None
    assert gpu_layers_device_map(TINY, 1, device="cpu") is None
    assert gpu_layers_device_map(TINY, 1) == f"cpu={n - 1},cuda:0=1"
    assert gpu_layers_device_map(TINY, 0) == f"cpu={n}"
    assert gpu_layers_device_map(TINY, 999) == f"cuda:0={n}"
    with open_gguf(TINY) as gf:
        plan = plan_for_files(gf, None, "auto", gpu_layers_device_map(TINY, 1), machine=_gpu(8))
    assert (plan.manual, plan.gpu_layers, plan.cpu_layers) == (True, 1, n - 1)
    assert parse_device_map(gpu_layers_device_map(TINY, 1)) == [("cpu", n - 1), ("cuda:0", 1)]


def test_a_switch_counts_the_loaded_models_gpu_memory_as_free(catalog):
    from tramontane.engine.library.fit import machine_for_a_switch

    two = Machine((DeviceInfo("cuda:0", 2 * GiB, "a", capability=(8, 9)),
                   DeviceInfo("cuda:1", 3 * GiB, "b", capability=(7, 5))), CPU64)
    held = {0: 10 * GiB, 1: 0}
    after = machine_for_a_switch(two, reserved=held.__getitem__)
    assert [d.free_bytes for d in after.gpus] == [12 * GiB, 3 * GiB]
    assert [d.capability for d in after.gpus] == [(8, 9), (7, 5)]  # the tower's dtype there is planned as before
    assert after.cpu == CPU64 and [d.description for d in after.gpus] == ["a", "b"]
    # Ministral 3 14B: partly on the CPU with 2 GB free, on the GPU once the loaded model's 10 GB count
    e = catalog["ministral-3-14b-instruct"]
    sizes = catalog_sizes(e, 8_239_593_024, None)
    assert fit_of_sizes(sizes, Machine(two.gpus[:1], CPU64)).kind == "partial"
    assert fit_of_sizes(sizes, Machine(after.gpus[:1], CPU64)).kind == "gpu"
    cpu_only = Machine((), CPU64)
    assert machine_for_a_switch(cpu_only, reserved=None) is cpu_only  # no GPU: torch not asked
