"""The device planner on the real tensor inventories of Mistral-Small-3.1-24B (Q4_K_M, Q8_0)
and Ministral-3 8B / 14B (Q4_K_M), for simulated machines, checked against numbers worked
out by hand below.

The text models are GGUF files holding the real shapes and llama.cpp's Q4_K_M type choice
with no data (sparse files: the header is real, the tensor bytes are a hole), read by the
engine's own reader; byte counts come from gguf-py's block sizes. Pixtral's projector is an
inventory dict (f16, as the published mmproj-...-f16.gguf).
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import GGML_QUANT_SIZES

from support import FIXTURES
from support.empty_gguf import write_empty_gguf
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.config import VisionConfig
from tramontane.engine.runtime.device_map import (Budget, DeviceInfo, Machine, PlanError, gpu_layers_map,
                                                  model_sizes, parse_device_map, plan_devices, sizes_of_files)

GiB = 1 << 30


# ----------------------------------------------------------------------------- inventories

def _nbytes(shape, qtype) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


def _pixtral(text_hidden: int, n_layers: int = 24, hidden: int = 1024, ffn: int = 4096, patch: int = 14):
    """Mistral-Small-3.1's Pixtral tower + projector, f16 matrices and f32 norms."""
    shapes = {"v.patch_embd.weight": ((hidden, 3, patch, patch), T.F16), "v.pre_ln.weight": ((hidden,), T.F32),
              "mm.input_norm.weight": ((hidden,), T.F32), "mm.patch_merger.weight": ((hidden, 4 * hidden), T.F16),
              "mm.1.weight": ((text_hidden, hidden), T.F16), "mm.2.weight": ((text_hidden, text_hidden), T.F16)}
    for i in range(n_layers):
        b = f"v.blk.{i}."
        shapes.update({b + n + ".weight": ((hidden, hidden), T.F16) for n in ("attn_q", "attn_k", "attn_v", "attn_out")})
        shapes.update({b + "ffn_gate.weight": ((ffn, hidden), T.F16), b + "ffn_up.weight": ((ffn, hidden), T.F16),
                       b + "ffn_down.weight": ((hidden, ffn), T.F16), b + "ln1.weight": ((hidden,), T.F32),
                       b + "ln2.weight": ((hidden,), T.F32)})
    cfg = VisionConfig(1540, patch, 2, hidden, ffn, n_layers, 16, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4,
                       text_hidden, "llama.cpp")
    return cfg, {k: SimpleNamespace(nbytes=_nbytes(s, t)) for k, (s, t) in shapes.items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inventories")
    return {
        "small-24b": write_empty_gguf(d / "Mistral-Small-3.1-24B-Q4_K_M.gguf", 40, 5120, 32768),
        "small-24b-q8": write_empty_gguf(d / "Mistral-Small-3.1-24B-Q8_0.gguf", 40, 5120, 32768, mix="q8_0"),
        "ministral-8b": write_empty_gguf(d / "Ministral-3-8B-Q4_K_M.gguf", 34, 4096, 14336),
        "ministral-14b": write_empty_gguf(d / "Ministral-3-14B-Q4_K_M.gguf", 40, 5120, 16384),
    }


def _sizes(path, vision: bool = False):
    with open_gguf(path) as gf:
        text = sizes_of_files(gf)
        if not vision:
            return text
        from tramontane.engine.mistral3.config import text_config

        vcfg, vinv = _pixtral(5120)
        return model_sizes(text_config(gf), gf.tensors, text.name, vcfg, vinv, "mmproj-f16.gguf")


# Hand arithmetic for Mistral-Small-3.1-24B Q4_K_M (hidden 5120, q 32x128, kv 8x128, ffn 32768,
# vocab 131072). Q4_K = 144 bytes / 256 values, Q6_K = 210 / 256.
Q_PARAMS = 5120 * 4096 + 5120 * 1024 + 5120 * 1024 + 4096 * 5120 + 3 * 5120 * 32768  # 555,745,280
NORMS = 2 * 5120 * 4
L4 = Q_PARAMS * 144 // 256 + NORMS  # all Q4_K: 312,647,680
L6 = L4 + (5120 * 1024 + 32768 * 5120) * (210 - 144) // 256  # attn_v + ffn_down in Q6_K: 357,253,120
HEAD = 131072 * 5120 * 210 // 256 + 5120 * 4  # output Q6_K + output_norm: 550,522,880
EMBED = 131072 * 5120 * 144 // 256  # 377,487,360
VISION = 2 * (1024 * 3 * 14 * 14 + 1024 * 4096 + 5120 * 1024 + 5120 * 5120 + 24 * (4 * 1024**2 + 3 * 1024 * 4096)) \
    + 4 * (2 + 2 * 24) * 1024  # 878,018,560
KV_GPU = 4096 * 8 * (128 + 128) * 2  # bf16 K+V for 4096 positions: 16 MiB
KV_CPU = 2 * KV_GPU  # f32
ACT_GPU = 2048 * (4 * 5120 + 4096 + 2 * 1024 + 3 * 32768) * 2  # one 2048-row prefill chunk in bf16: 511,705,088
ACT_CPU = 512 * (4 * 5120 + 4096 + 2 * 1024 + 3 * 32768) * 4  # 512-row chunk in f32
# CUDA flash attention (kernels/attention.py): its bf16 output, and float32 split partials (d_v +
# max + sum) for at most 4 x 64-row blocks x 160 SMs; the CPU's float32 state per row and head;
# the 32 MiB of dequantized weight rows a multi-row matmul may hold; the head's logits + f32 copy
ATT_GPU = 2048 * 32 * 128 * 2 + 4 * 64 * 160 * (128 + 2) * 4
ATT_CPU = 512 * 32 * (128 + 2) * 4
MATMUL_SCRATCH, LOGITS = 32 << 20, 2 * 131072 * 4
PREFILL_GPU = ACT_GPU + ATT_GPU + MATMUL_SCRATCH  # beyond resident, one 2048-row chunk
# 1024² image -> 37x37 merged -> 74² patches, float32 rows + attention state (16 heads of 64)
VISION_ACT = 74 * 74 * (7 * 1024 + 3 * 4096) * 4 + 74 * 74 * 16 * (64 + 2) * 4
RUNTIME_GPU = {"cuBLAS workspace": 64 << 20, "CUDA graph pool": 96 << 20}
RUNTIME = sum(RUNTIME_GPU.values())
HEADROOM_GPU, HEADROOM_CPU = 1 << 30, 2 * GiB


def _more_bits(i: int) -> bool:
    return i < 5 or i >= 35 or (i - 5) % 3 == 2


def _layer(i: int) -> int:
    return L6 if _more_bits(i) else L4


def _gpu(gib: float, name: str = "cuda:0") -> DeviceInfo:
    return DeviceInfo(name, int(gib * GiB), "simulated")


CPU64 = DeviceInfo("cpu", 64 * GiB, "simulated")


def test_inventory_read_from_the_empty_gguf_matches_the_hand_numbers(files):
    s = _sizes(files["small-24b"], vision=True)
    assert s.n_layers == 40 and [s.layer_bytes[i] for i in (0, 5, 6, 7, 34, 35)] == [L6, L4, L4, L6, L6, L6]
    assert sum(s.layer_bytes) == 20 * L6 + 20 * L4
    assert (s.embedding_bytes, s.head_bytes, s.vision_bytes) == (EMBED, HEAD, VISION)
    # the whole file: 14.326 GB of tensors (the published file, 14.334 GB, adds the tokenizer)
    assert round((sum(s.layer_bytes) + EMBED + HEAD) / 1e9, 3) == 14.326


def test_inventory_of_a_real_file_matches_gguf_py(tmp_path):
    """sizes_of_files on a llama.cpp-converted fixture agrees with gguf-py's own reader."""
    path = os.path.join(FIXTURES, "mistral3_q256-llamacpp-Q4_K_M.gguf")
    with open_gguf(path) as gf:
        s = sizes_of_files(gf)
    ref = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    for i in range(s.n_layers):
        assert s.layer_bytes[i] == sum(n for k, n in ref.items() if k.startswith(f"blk.{i}."))
    assert s.embedding_bytes == ref["token_embd.weight"]
    assert s.head_bytes == ref["output.weight"] + ref["output_norm.weight"]


@pytest.mark.parametrize("gib, first, l6, l4", [
    # usable = gib - 1 headroom; the GPU first takes the head, the whole vision tower (it fits),
    # cuBLAS's workspace and the graph pool; its worst stage is a prefill chunk (580 MB beyond
    # resident, more than an image's 449 MB); then layers from the last one down, 16 MiB KV each.
    (8, 26, 8, 6),     # 366,702,592 bytes to spare; layer 25 would need 7,327,744 more
    (12, 13, 13, 14),  # 156,119,040 to spare; layer 12 would need 173,305,856 more
    (16, 1, 19, 20),   # 230,354,944 to spare; layer 0 would need 143,675,392 more
])
def test_24b_with_projector_on_one_gpu_spills_the_first_layers_to_the_cpu(files, gib, first, l6, l4):
    s = _sizes(files["small-24b"], vision=True)
    plan = plan_devices(s, Machine((_gpu(gib),), CPU64))
    gpu, cpu = plan.placements
    n = 40 - first
    assert gpu.layers == range(first, 40) and cpu.layers == range(0, first)
    assert sum(map(_more_bits, gpu.layers)) == l6 and l6 + l4 == n
    assert gpu.weights == l6 * L6 + l4 * L4 and gpu.kv == n * KV_GPU and gpu.activations == ACT_GPU
    assert gpu.parts == {"output head + norm": HEAD, "vision tower": VISION, **RUNTIME_GPU}
    assert gpu.vision_activations == VISION_ACT and gpu.prefill_scratch == ATT_GPU + MATMUL_SCRATCH + LOGITS
    assert cpu.parts == {"token embedding": EMBED}  # a lookup: stays in CPU memory
    resident = HEAD + VISION + RUNTIME + gpu.weights + gpu.kv
    usable = gib * GiB - HEADROOM_GPU
    stages = gpu.stages()
    assert stages == {"load": HEAD + VISION + gpu.weights + max(map(_layer, gpu.layers)),
                      "vision encode": resident + VISION_ACT, "prefill chunk": resident + PREFILL_GPU + LOGITS,
                      "decode": resident}
    assert gpu.total == max(stages.values()) == resident + PREFILL_GPU + LOGITS <= usable
    assert gpu.total + _layer(first - 1) + KV_GPU > usable  # one more layer would not fit
    assert cpu.weights == sum(_layer(i) for i in range(first)) and cpu.kv == first * KV_CPU
    assert (plan.head_device, plan.embedding_device, plan.vision_device) == ("cuda:0", "cpu", "cuda:0")
    assert plan.fit == "partial" and plan.summary() == f"{n} of 40 layers on GPU, {first} on CPU"
    assert plan.layer_devices() == ["cpu"] * first + ["cuda:0"] * n
    assert not plan.warnings


def test_24b_with_projector_fits_a_24gb_gpu_whole(files):
    s = _sizes(files["small-24b"], vision=True)
    plan = plan_devices(s, Machine((_gpu(24),), CPU64))
    (gpu,) = plan.placements
    whole = 20 * L6 + 20 * L4 + 40 * KV_GPU + EMBED + HEAD + VISION + RUNTIME + PREFILL_GPU + LOGITS
    assert gpu.total == whole == 16_627_290_112 <= 24 * GiB - HEADROOM_GPU
    assert plan.fit == "gpu" and plan.summary() == "all 40 layers on cuda:0"
    assert (plan.embedding_device, plan.head_device, plan.vision_device) == ("cuda:0",) * 3


def test_two_24gb_gpus(files):
    # Q4_K_M fits the first GPU whole: the second stays free
    plan = plan_devices(_sizes(files["small-24b"], vision=True), Machine((_gpu(24), _gpu(24, "cuda:1")), CPU64))
    assert [p.name for p in plan.placements] == ["cuda:0"] and plan.gpu_layers == 40
    # Q8_0 (25 GB) does not: cuda:0 takes the head and 38 layers, cuda:1 the other 2, none on the CPU
    s = _sizes(files["small-24b-q8"])
    layer = Q_PARAMS * 34 // 32 + NORMS  # Q8_0: 34 bytes / 32 values
    head = 131072 * 5120 * 34 // 32 + 5120 * 4
    assert s.layer_bytes[0] == layer and s.head_bytes == head
    plan = plan_devices(s, Machine((_gpu(24), _gpu(24, "cuda:1")), CPU64))
    g0, g1, cpu = plan.placements
    room = 24 * GiB - HEADROOM_GPU - head - RUNTIME - PREFILL_GPU - 2 * 131072 * 4  # 23,230,853,120
    assert 38 * (layer + KV_GPU) <= room < 39 * (layer + KV_GPU)
    assert g0.layers == range(2, 40) and g1.layers == range(0, 2) and not cpu.layers
    assert cpu.parts == {"token embedding": 131072 * 5120 * 34 // 32}
    assert plan.fit == "gpu" and plan.summary() == "all 40 layers on GPU (38 on cuda:0, 2 on cuda:1)"


def test_cpu_only_machine_holds_everything_in_f32_kv(files):
    s = _sizes(files["small-24b"], vision=True)
    plan = plan_devices(s, Machine((), CPU64))
    (cpu,) = plan.placements
    resident = 20 * L6 + 20 * L4 + 40 * KV_CPU + EMBED + HEAD + VISION
    assert cpu.stages()["prefill chunk"] == resident + ACT_CPU + ATT_CPU + 2 * 131072 * 4
    assert cpu.total == resident + VISION_ACT  # an image's rows outweigh a 512-row chunk's
    assert plan.fit == "cpu" and plan.summary() == "all 40 layers on the CPU"
    with pytest.raises(PlanError, match="does not fit this machine"):  # 16 GB of RAM: 14 usable < 17.2 needed
        plan_devices(s, Machine((), DeviceInfo("cpu", 16 * GiB)))


def test_unified_memory_never_adds_the_cpu(files):
    s = _sizes(files["small-24b"], vision=True)
    plan = plan_devices(s, Machine((_gpu(64),), CPU64, unified=True))
    assert [p.name for p in plan.placements] == ["cuda:0"]
    # 16 GB of shared memory: needs 16,627,290,112, has 16,106,127,360 -> an error, not a CPU spill
    with pytest.raises(PlanError, match=r"small|Small|24B") as err:
        plan_devices(s, Machine((_gpu(16),), CPU64, unified=True))
    assert "0.49 GiB more" in str(err.value) and "4096-token context" in str(err.value)


def test_a_gpu_with_room_for_no_layer_is_a_warning_naming_the_parameters(files):
    s = _sizes(files["small-24b"], vision=True)
    plan = plan_devices(s, Machine((_gpu(16), _gpu(2, "cuda:1")), CPU64))
    assert [len(p.layers) for p in plan.placements] == [39, 0, 1]
    (warning,) = plan.warnings
    assert warning.startswith("cuda:1 can fit 0 layers") and "max_seq_len (4096)" in warning
    assert "max_num_images" in warning
    # a smaller budget is what the warning suggests: 1024 positions leave more room everywhere
    small = plan_devices(s, Machine((_gpu(16), _gpu(2, "cuda:1")), CPU64), Budget(max_seq_len=1024))
    assert small.gpu_layers > plan.gpu_layers


def test_does_not_fit_anywhere_is_an_error_before_loading(files):
    s = _sizes(files["small-24b"], vision=True)
    with pytest.raises(PlanError, match="layers .* are left over") as err:
        plan_devices(s, Machine((_gpu(8),), DeviceInfo("cpu", 8 * GiB)))
    assert "Mistral-Small-3.1-24B-Q4_K_M.gguf does not fit this machine" in str(err.value)


def test_ministral_3_8b_and_14b(files):
    """8B (34 layers, hidden 4096, ffn 14336) fits an 8 GB GPU; 14B (40 x 5120, ffn 16384)
    needs 12 GB, and on 8 GB keeps its last layers and the head on the GPU."""
    s8 = _sizes(files["ministral-8b"])
    layer8 = (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336) * 144 // 256 + 2 * 4096 * 4
    assert s8.layer_bytes[5] == layer8  # a Q4_K-only layer (34 // 8 = 4; (5 - 4) % 3 != 2)
    kv, act8 = KV_GPU, 2048 * (4 * 4096 + 4096 + 2048 + 3 * 14336) * 2
    whole8 = (sum(s8.layer_bytes) + 34 * kv + s8.embedding_bytes + s8.head_bytes + RUNTIME
              + act8 + ATT_GPU + MATMUL_SCRATCH + LOGITS)
    assert whole8 <= 8 * GiB - HEADROOM_GPU
    assert plan_devices(s8, Machine((_gpu(8),), CPU64)).fit == "gpu"

    s14 = _sizes(files["ministral-14b"])
    assert plan_devices(s14, Machine((_gpu(12),), CPU64)).fit == "gpu"
    plan = plan_devices(s14, Machine((_gpu(8),), CPU64))
    gpu, cpu = plan.placements
    act14 = 2048 * (4 * 5120 + 4096 + 2048 + 3 * 16384) * 2
    room = 8 * GiB - HEADROOM_GPU - s14.head_bytes - RUNTIME - act14 - ATT_GPU - MATMUL_SCRATCH - LOGITS
    used = sum(s14.layer_bytes[i] + kv for i in gpu.layers)
    assert gpu.layers.stop == 40 and used <= room < used + s14.layer_bytes[gpu.layers.start - 1] + kv
    assert plan.fit == "partial" and plan.summary() == f"{len(gpu.layers)} of 40 layers on GPU, {len(cpu.layers)} on CPU"
    # by hand: room 7,516,192,768 - 550,522,880 - 167,772,160 - 310,378,496 - 38,076,416 - 33,554,432
    # - 1,048,576 = 6,414,839,808; a layer is 171,089,920 (Q4_K) or 194,068,480 (Q6_K attn_v/ffn_down)
    # + 16 MiB KV; layers 8..39 hold 14 Q6_K-ish + 18 Q4_K: 5,796,577,280 + 32 x 16 MiB = 6,333,448,192;
    # layer 7 (Q6_K-ish) would add 210,845,696 to the 81,391,616 left
    assert gpu.layers == range(8, 40) and gpu.weights == 14 * 194_068_480 + 18 * 171_089_920


def test_manual_maps_override_the_counts(files):
    s = _sizes(files["small-24b"], vision=True)
    machine = Machine((_gpu(16),), CPU64)
    plan = plan_devices(s, machine, manual=parse_device_map("cuda:0=30,cpu=10"))
    assert plan.manual and plan.layer_devices() == ["cuda:0"] * 30 + ["cpu"] * 10
    assert (plan.embedding_device, plan.head_device) == ("cuda:0", "cpu")  # first and last segment
    assert plan.summary() == "30 of 40 layers on GPU, 10 on CPU" and not plan.warnings
    # Settings' "GPU layers: 34": the rest first on the CPU, the head with the GPU layers
    assert gpu_layers_map(40, 34) == [("cpu", 6), ("cuda:0", 34)]
    plan = plan_devices(s, machine, manual=gpu_layers_map(40, 34))
    assert plan.summary() == "34 of 40 layers on GPU, 6 on CPU" and plan.head_device == "cuda:0"
    assert gpu_layers_map(40, 0) == [("cpu", 40)] and gpu_layers_map(40, 99) == [("cuda:0", 40)]
    # asked for more than the GPU holds: a warning (the user's override), not a refusal
    plan = plan_devices(s, Machine((_gpu(8),), CPU64), manual=parse_device_map("cuda=40"))
    assert plan.warnings and "cuda:0 is asked to hold" in plan.warnings[0]


@pytest.mark.parametrize("text, match", [
    ("cuda:0=x", "not DEVICE=LAYERS"),
    ("gpu=40", "unknown device 'gpu'"),
    ("cpu=20,cpu=20", "cpu is named twice"),
    ("cuda:0=30,cpu=5", "places 35 layers; .* has 40"),
    ("cuda:1=40", "no cuda:1"),
    ("", "empty"),
])
def test_bad_device_maps_are_one_clear_error(files, text, match):
    s = _sizes(files["small-24b"])
    with pytest.raises(PlanError, match=match):
        plan_devices(s, Machine((_gpu(16),), CPU64), manual=parse_device_map(text))


def test_explain_shows_the_arithmetic(files):
    plan = plan_devices(_sizes(files["small-24b"], vision=True), Machine((_gpu(16),), CPU64))
    text = plan.explain()
    assert "cuda:0 (simulated): 16.00 GiB free - 1.00 GiB headroom = 15.00 GiB usable" in text
    assert "layers 1-39 (39)" in text and "39 x 16.0 MiB KV" in text
    assert "KV per layer           4096 positions x 2048 values x 2 B (16-bit)" in text  # KV_GPU's factors
    assert "KV per layer           4096 positions x 2048 values x 4 B (f32)" in text  # the CPU's layer 0
    assert "max_seq_len 4096 x max_batch_size 1, 1 image(s) of 1024x1024; context 4096" in text
    assert "stages: load " in text and "prefill chunk" in text and "vision encode" in text
    assert text.endswith("=> 39 of 40 layers on GPU, 1 on CPU")


def test_local_engine_refuses_before_loading_when_nothing_fits(monkeypatch):
    """The plan comes first: a machine too small is one clear error, and no weight is read."""
    from tramontane.engine.mistral3.text import Mistral3Text
    from tramontane.engine.runtime import device_map
    from tramontane.engine.runtime.local import LocalEngine

    tiny = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
    monkeypatch.setattr(device_map, "detect_machine", lambda: Machine((), DeviceInfo("cpu", 2 * GiB + (1 << 20))))

    def never(*args, **kwargs):
        raise AssertionError("weights were loaded before the plan refused")

    monkeypatch.setattr(Mistral3Text, "load", never)
    with pytest.raises(PlanError, match="mistral3_tiny-f32.gguf does not fit this machine with a 512-token context: it needs"):
        LocalEngine(tiny, device="cpu")


def test_moving_only_the_embedding_keeps_every_layer_on_the_gpu(files):
    """24B text-only needs 15,749,271,552 bytes whole on one GPU, 15,371,784,192 without its
    embedding table. A GPU with 15.5 GiB free (14.5 usable = 15,569,256,448) misses the first
    by 0.16 GiB: the table (a row lookup) goes to CPU memory, and all 40 layers stay on the GPU."""
    s = _sizes(files["small-24b"])
    whole = 20 * L6 + 20 * L4 + 40 * KV_GPU + EMBED + HEAD + RUNTIME + PREFILL_GPU + LOGITS
    assert (whole, whole - EMBED) == (15_749_271_552, 15_371_784_192)
    plan = plan_devices(s, Machine((_gpu(15.5),), CPU64))
    gpu, cpu = plan.placements
    assert whole - EMBED <= gpu.device.usable < whole
    assert gpu.layers == range(0, 40) and gpu.total == whole - EMBED and cpu.parts == {"token embedding": EMBED}
    assert plan.fit == "gpu" and plan.summary() == "all 40 layers on cuda:0"


@pytest.mark.parametrize("gib", [8, 12, 16, 24])
def test_24b_with_projector_stays_under_each_devices_memory_at_every_stage(files, gib):
    """Every stage (load, an image through the tower, a 2048-row prefill chunk, decode) of every
    device, summed here from the hand terms, is under that device's memory less its headroom."""
    s = _sizes(files["small-24b"], vision=True)
    plan = plan_devices(s, Machine((_gpu(gib),), CPU64))
    assert plan.context_length == 4096 and plan.vision_device == "cuda:0"
    for p in plan.placements:
        n = len(p.layers)
        weights = sum(_layer(i) for i in p.layers)
        tables = sum(v for k, v in p.parts.items() if k not in RUNTIME_GPU)
        if p.device.kind == "cuda":
            assert p.parts.keys() >= {"output head + norm", "vision tower", *RUNTIME_GPU}
            resident = weights + n * KV_GPU + tables + RUNTIME
            want = {"load": weights + tables + max(map(_layer, p.layers)),
                    "vision encode": resident + VISION_ACT,
                    "prefill chunk": resident + PREFILL_GPU + LOGITS,
                    "decode": resident}  # a decode step lives in the graph pool
        else:
            resident = weights + n * KV_CPU + tables
            decode = (4 * 5120 + 4096 + 2 * 1024 + 3 * 32768) * 4 + 32 * 4096 * 4  # one f32 row, the scores
            want = {"load": weights + tables, "prefill chunk": resident + ACT_CPU + ATT_CPU,
                    "decode": resident + decode}
        assert p.stages() == want
        assert max(want.values()) == p.total <= p.device.usable < p.device.free_bytes
    assert plan.fit == ("gpu" if gib == 24 else "partial")


def test_f16_kv_fits_twice_the_context_of_f32_on_the_same_cpu(files):
    """The CPU KV's element size follows kv_type: on a CPU sized so that f32 KV fits exactly
    8192 positions, f16 fits exactly 16384. Up to ~2M positions the prefill chunk is the peak
    stage (one 512-row chunk outweighs a decode row and its scores), so the need is
    FIXED + 40 layers x ctx x kv_width x element bytes."""
    s = _sizes(files["small-24b"])
    fixed = 20 * L6 + 20 * L4 + EMBED + HEAD + ACT_CPU + ATT_CPU + LOGITS
    per_position = {"f32": 40 * 8 * (128 + 128) * 4, "f16": 40 * 8 * (128 + 128) * 2}  # 327,680 / 163,840
    cpu = DeviceInfo("cpu", HEADROOM_CPU + fixed + 8192 * per_position["f32"], "simulated")
    for kv_type, fits in (("f32", 8192), ("f16", 16384)):
        plan = plan_devices(s, Machine((), cpu), Budget(max_seq_len=fits, kv_type=kv_type))
        (p,) = plan.placements
        assert p.kv == fits * per_position[kv_type] == 8192 * per_position["f32"]
        assert p.total == fixed + p.kv == cpu.usable
        with pytest.raises(PlanError, match="does not fit"):
            plan_devices(s, Machine((), cpu), Budget(max_seq_len=fits + 1, kv_type=kv_type))
    # split over a GPU and the CPU: only the CPU's layers get the smaller KV
    f32 = plan_devices(s, Machine((_gpu(12),), CPU64))
    f16 = plan_devices(s, Machine((_gpu(12),), CPU64), Budget(kv_type="f16"))
    assert [p.layers for p in f16.placements] == [p.layers for p in f32.placements]
    gpu, cpu_p = f16.placements
    assert gpu.kv == len(gpu.layers) * KV_GPU and cpu_p.kv == len(cpu_p.layers) * KV_CPU // 2 > 0
    assert "CPU KV f16" in f16.explain() and "CPU KV" not in f32.explain()
    with pytest.raises(PlanError, match="KV type 'q8' is not one of f32, f16"):
        plan_devices(s, Machine((), CPU64), Budget(kv_type="q8"))


def test_the_compute_dtype_is_the_models_own_answer_for_each_device(files, monkeypatch):
    """The planner keeps no dtype rule of its own (issue 34, item 7): detect_machine asks the
    text model's default_dtype of every device, and the plan's KV and activations follow that
    answer. Here default_dtype is made to answer float32 on a GPU: its layers' KV and prefill
    rows then cost twice what a 16-bit GPU's do."""
    import torch

    from tramontane.engine.mistral3 import text
    from tramontane.engine.runtime import device_map, memory

    real = text.default_dtype
    assert device_map.detect_machine().cpu.compute_value_bytes == real(torch.device("cpu")).itemsize == 4
    monkeypatch.setattr(memory, "gpu_free_memory", lambda: [(24 * GiB, 24 * GiB, "fake", False, "nvml", (8, 0))])
    monkeypatch.setattr(text, "default_dtype", lambda device: torch.float32 if device.type == "cuda" else real(device))
    (gpu,) = device_map.detect_machine().gpus
    assert gpu.compute_value_bytes == 4 and gpu.value_bytes == 4
    s = _sizes(files["ministral-8b"])
    wide = plan_devices(s, Machine((gpu,), CPU64)).placements[0]
    narrow = plan_devices(s, Machine((_gpu(24),), CPU64)).placements[0]  # simulated: a 16-bit GPU
    assert narrow.device.value_bytes == 2 and wide.layers == narrow.layers
    assert wide.kv == 2 * narrow.kv and wide.activations == 2 * narrow.activations
    assert "x 4 B (32-bit)" in plan_devices(s, Machine((gpu,), CPU64)).explain()
