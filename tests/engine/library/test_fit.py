"""Whether a model fits this machine (engine/library/fit.py): catalogue estimates planned by the same
planner as real files and checked against the real tensor inventories; local files planned from
their headers; Settings' "GPU layers: N" turned into the engine's manual map."""
from __future__ import annotations

import pytest

from support import FIXTURES
from support.empty_gguf import write_empty_gguf
from tramontane.engine.library.fit import (catalog_bytes, catalog_sizes, fit_of_catalog_entry, fit_of_file,
                                           fit_of_sizes, gpu_layers_device_map)
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
        ("ministral-3-14b-instruct", 40, 5120, 16384), ("mistral-small-3.2-24b-instruct", 40, 5120, 32768),
        ("devstral-small-2507-24b", 40, 5120, 32768), ("ministral-3-8b-reasoning", 34, 4096, 14336),
        ("ministral-3-14b-reasoning", 40, 5120, 16384)]


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


# A Q8_0 Pixtral projector for a 5120-wide decoder (Mistral Small 3.1's tower), by hand:
# block matrices 24 x (4 x 1024² + 3 x 1024 x 4096) = 402,653,184 values, merger 1024 x 4096,
# mm.1 5120 x 1024, mm.2 5120² = 35,651,584: 438,304,768 Q8_0 values (34 bytes / 32); the 4-D
# patch conv 1024 x 3 x 14 x 14 = 602,112 values kept f16; 50 f32 norms of 1024.
Q8_VALUES, PATCH_VALUES, NORMS = 438_304_768, 602_112, 4 * 1024 * 50
Q8_PROJECTOR = Q8_VALUES // 32 * 34 + 2 * PATCH_VALUES + NORMS  # 467,107,840 bytes of tensors
QK_COPIES = 2 * 24 * 1024 * 1024 // 32 * 34  # attn_q / attn_k reordered at load, Q8_0: 53,477,376
Q8_ON_BF16_CPU = 2 * (Q8_VALUES + PATCH_VALUES) + NORMS + QK_COPIES  # 931,495,936: ~2x the file


def _q8_entry(catalog):
    """Mistral Small 3.1 as the catalogue has it, but with a Q8_0 projector."""
    from dataclasses import replace

    small = catalog["mistral-small-3.1-24b-instruct"]
    return replace(small, mmproj_file="mmproj-Mistral-Small-3.1-24B-Instruct-2503-Q8_0.gguf",
                   mmproj_size_gb=Q8_PROJECTOR / 1e9)


def _q8_reference_inventory():
    """The same projector's tensors with gguf-py's block sizes, as a downloaded file's header lists them."""
    from types import SimpleNamespace

    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import GGML_QUANT_SIZES

    shapes = {"v.patch_embd": ((1024, 3, 14, 14), T.F16), "v.pre_ln": ((1024,), T.F32),
              "mm.input_norm": ((1024,), T.F32), "mm.patch_merger": ((1024, 4096), T.Q8_0),
              "mm.1": ((5120, 1024), T.Q8_0), "mm.2": ((5120, 5120), T.Q8_0)}
    for i in range(24):
        shapes.update({f"v.blk.{i}.{n}": ((1024, 1024), T.Q8_0) for n in ("attn_q", "attn_k", "attn_v", "attn_out")})
        shapes.update({f"v.blk.{i}.ffn_gate": ((4096, 1024), T.Q8_0), f"v.blk.{i}.ffn_up": ((4096, 1024), T.Q8_0),
                       f"v.blk.{i}.ffn_down": ((1024, 4096), T.Q8_0), f"v.blk.{i}.ln1": ((1024,), T.F32),
                       f"v.blk.{i}.ln2": ((1024,), T.F32)})
    return {name + ".weight": SimpleNamespace(shape=shape, ggml_type=int(t),
                                              nbytes=int(np.prod(shape)) // GGML_QUANT_SIZES[t][0] * GGML_QUANT_SIZES[t][1])
            for name, (shape, t) in shapes.items()}


@pytest.mark.parametrize("bf16_dot, tower", [(True, Q8_ON_BF16_CPU), (False, Q8_PROJECTOR)])
def test_a_q8_0_projector_not_yet_downloaded_is_planned_as_the_tower_will_hold_it(catalog, bf16_dot, tower):
    """The estimate types the projector's tensors from its file name, so the planner's own rule
    applies: on a CPU with bf16 dot products the loader expands Q8_0 to bf16 (2 bytes a value,
    plus the reordered q/k copies), ~2x the file; elsewhere the file's bytes. Equal to the hand
    numbers above and to the plan of the real inventory (gguf-py's sizes)."""
    from tramontane.engine.mistral3.config import VisionConfig, text_config
    from tramontane.engine.runtime.device_map import model_sizes, vision_tower_bytes
    from support.cpu_kernels import cpu_exact

    entry = _q8_entry(catalog)
    assert entry.mmproj_type == "Q8_0" and sum(t.nbytes for t in _q8_reference_inventory().values()) == Q8_PROJECTOR
    model_bytes, mmproj_bytes = catalog_bytes(entry, "Q4_K_M")
    estimate = catalog_sizes(entry, model_bytes, mmproj_bytes)
    assert estimate.vision_bytes == Q8_PROJECTOR
    cpu = DeviceInfo("cpu", 64 * GiB, "simulated", bf16_dot=bf16_dot)
    with cpu_exact(False):
        plan = plan_devices(estimate, Machine((), cpu))
        assert plan.placements[0].parts["vision tower"] == tower
        pixtral = VisionConfig(1540, 14, 2, 1024, 4096, 24, 16, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4, 5120,
                               "llama.cpp")
        with open_gguf(TINY) as gf:  # any decoder: only the tower's count is compared
            real = model_sizes(text_config(gf), gf.tensors, "real", pixtral, _q8_reference_inventory())
        assert vision_tower_bytes(real, "cpu", bf16_dot) == tower
        # the verdict changes with it: a CPU sized between the two needs
        need = plan.placements[0].total
        other = DeviceInfo("cpu", 64 * GiB, "simulated", bf16_dot=not bf16_dot)
        other_need = plan_devices(estimate, Machine((), other)).placements[0].total
        assert abs(other_need - need) == Q8_ON_BF16_CPU - Q8_PROJECTOR
        between = (need + other_need) // 2 + cpu.headroom
        fit = fit_of_catalog_entry(entry, (model_bytes, mmproj_bytes), (None, None),
                                   Machine((), DeviceInfo("cpu", between, "simulated", bf16_dot=bf16_dot)))
        assert fit.words == ("too big" if bf16_dot else "on the CPU")


def test_an_unload_frees_private_ram_not_a_mapped_files_pages(tmp_path):
    """Issue 35, item 2: a memory-mapped model's resident pages are page cache, which
    MemAvailable counts already; the RAM a switch counts free is the private kind only."""
    import mmap

    import numpy as np

    from support.rss import status_bytes
    from tramontane.engine.host import private_ram

    if not private_ram():
        pytest.skip("/proc/self/status has no RssAnon here")
    size = 64 << 20
    path = tmp_path / "weights.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes())
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        rss, private = status_bytes("VmRSS"), private_ram()
        assert int(np.frombuffer(mapped, dtype=np.uint8)[::4096].sum()) > 0  # every page read
        assert status_bytes("VmRSS") - rss > size // 2  # the RSS the worker used to count
        assert private_ram() - private < size // 8
    held = np.ones(size, dtype=np.uint8)
    assert private_ram() - private > size * 7 // 8
    del held

