"""What the planner counts for the vision tower on the CPU (device_map.vision_tower_bytes): where
the tower runs the bf16 path (a CPU with bf16 dot products, outside exact mode), every matmul
matrix is kept in bf16 (2 bytes a value, a Q8_0 file dequantized at load) plus the q/k copies
the loader reorders for llama.cpp's layout; elsewhere the file's bytes. Checked against hand
arithmetic, and against the tensors a loaded tiny Q8_0 tower really holds on this machine."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import GGML_QUANT_SIZES

from support import FIXTURES
from tramontane.engine import host
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.config import TextConfig, VisionConfig
from tramontane.engine.mistral3.vision import VisionTower
from tramontane.engine.runtime import device_map
from tramontane.engine.runtime.device_map import (Budget, DeviceInfo, Machine, cpu_tower_runs_bf16, model_sizes,
                                                  plan_devices, sizes_of_files, vision_tower_bytes)
from support.cpu_kernels import cpu_exact

GiB = 1 << 30
H, FFN, LAYERS, TEXT_HIDDEN, PATCH = 64, 128, 2, 96, 14


def _inventory(matrix_type: T) -> dict[str, SimpleNamespace]:
    """A llama.cpp-layout Pixtral projector: block / projector matrices in `matrix_type`, the 4-D
    patch conv in f16 and the norms in f32 (as tests/support/quantize_mmproj.py leaves them)."""
    shapes = {"v.patch_embd.weight": ((H, 3, PATCH, PATCH), T.F16), "v.pre_ln.weight": ((H,), T.F32),
              "mm.input_norm.weight": ((H,), T.F32), "mm.patch_merger.weight": ((H, 4 * H), matrix_type),
              "mm.1.weight": ((TEXT_HIDDEN, H), matrix_type), "mm.2.weight": ((TEXT_HIDDEN, TEXT_HIDDEN), matrix_type)}
    for i in range(LAYERS):
        b = f"v.blk.{i}."
        shapes.update({b + n + ".weight": ((H, H), matrix_type) for n in ("attn_q", "attn_k", "attn_v", "attn_out")})
        shapes.update({b + "ffn_gate.weight": ((FFN, H), matrix_type), b + "ffn_up.weight": ((FFN, H), matrix_type),
                       b + "ffn_down.weight": ((H, FFN), matrix_type), b + "ln1.weight": ((H,), T.F32),
                       b + "ln2.weight": ((H,), T.F32)})

    def info(shape, qtype):
        block, size = GGML_QUANT_SIZES[qtype]
        return SimpleNamespace(shape=shape, ggml_type=int(qtype), nbytes=int(np.prod(shape)) // block * size)

    return {name: info(shape, qtype) for name, (shape, qtype) in shapes.items()}


TEXT = TextConfig(arch="mistral3", n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, head_dim=16, v_head_dim=16,
                  ffn=64, vocab_size=100, norm_eps=1e-5, rope_theta=1e6, rope_dim=16, context_length=0,
                  tied_embeddings=True)
TEXT_TENSORS = {"token_embd.weight": SimpleNamespace(nbytes=100 * 32 * 4), "blk.0.x": SimpleNamespace(nbytes=1000)}
VISION = VisionConfig(112, PATCH, 2, H, FFN, LAYERS, 4, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4, TEXT_HIDDEN,
                      "llama.cpp")


def _sizes(matrix_type: T):
    return model_sizes(TEXT, TEXT_TENSORS, "tiny", VISION, _inventory(matrix_type), "mmproj")


# Hand arithmetic (hidden 64, ffn 128, 2 blocks, text hidden 96, patch 14, merge 2):
PATCH_VALUES = 64 * 3 * 14 * 14  # 37,632, f16 in every file here: 75,264 bytes
BLOCK_VALUES = 4 * 64 * 64 + 3 * 128 * 64  # q, k, v, o + gate, up, down: 40,960
PROJ_VALUES = 64 * 256 + 96 * 64 + 96 * 96  # merger, mm.1, mm.2: 31,744
QUANT_VALUES = 2 * BLOCK_VALUES + PROJ_VALUES  # 113,664
NORM_BYTES = 4 * 64 * (1 + 2 * 2 + 1)  # pre_ln, ln1 and ln2 per block, mm.input_norm: 1,536
Q8_FILE = 2 * PATCH_VALUES + QUANT_VALUES // 32 * 34 + NORM_BYTES  # 75,264 + 120,768 + 1,536 = 197,568
Q8_QK_COPIES = 2 * 2 * (64 * 64 // 32 * 34)  # attn_q, attn_k of both blocks, Q8_0: 17,408
Q8_ON_BF16_CPU = 2 * (PATCH_VALUES + QUANT_VALUES) + NORM_BYTES + Q8_QK_COPIES  # 302,592 + 1,536 + 17,408 = 321,536
F32_FILE = 2 * PATCH_VALUES + 4 * QUANT_VALUES + NORM_BYTES  # 75,264 + 454,656 + 1,536 = 531,456


def test_q8_0_tower_on_a_bf16_cpu_counts_two_bytes_a_matrix_value():
    s = _sizes(T.Q8_0)
    assert s.vision_bytes == Q8_FILE == 197_568
    assert vision_tower_bytes(s, "cpu", cpu_bf16=True) == Q8_ON_BF16_CPU == 321_536
    assert vision_tower_bytes(s, "cpu", cpu_bf16=False) == Q8_FILE  # int8 path: the file read in place


def test_a_float32_file_keeps_its_bytes_on_a_bf16_cpu():
    """The bf16 path takes 16-bit or quantized matrices only (vision.bf16_weights): float32 stays."""
    s = _sizes(T.F32)
    assert s.vision_bytes == F32_FILE == 531_456
    assert vision_tower_bytes(s, "cpu", cpu_bf16=True) == F32_FILE


def test_a_catalogue_estimate_without_shapes_keeps_the_file_bytes():
    """engine/library/fit.py's estimate knows the projector's size only, not its types."""
    bare = model_sizes(TEXT, TEXT_TENSORS, "tiny", VISION, {"mmproj": SimpleNamespace(nbytes=Q8_FILE)})
    assert vision_tower_bytes(bare, "cpu", cpu_bf16=True) == Q8_FILE


@pytest.mark.parametrize("bf16_dot, exact, expected", [(True, False, Q8_ON_BF16_CPU), (False, False, Q8_FILE),
                                                       (True, True, Q8_FILE)])
def test_the_plan_takes_the_cpus_flag_and_exact_mode(bf16_dot, exact, expected):
    machine = Machine((), DeviceInfo("cpu", 64 * GiB, "simulated", bf16_dot=bf16_dot))
    with cpu_exact(exact):
        plan = plan_devices(_sizes(T.Q8_0), machine, Budget())
    assert plan.vision_device == "cpu"
    assert plan.placements[-1].parts["vision tower"] == expected


def test_the_cpus_flag_comes_from_the_host_probe(monkeypatch):
    for answer in (True, False):
        monkeypatch.setattr(host, "cpu_has_bf16_dot", lambda: answer)
        machine = device_map.detect_machine()
        assert machine.cpu.bf16_dot is answer
        assert machine.find("cpu:1").bf16_dot is answer  # a logical CPU is the same CPU
    assert not DeviceInfo("cuda:0", GiB).bf16_dot


# ----------------------------------------------------------------------------- a loaded tower

def _held_bytes(tower: VisionTower) -> int:
    """Bytes of every tensor the tower holds in memory: its bf16 matrices (built at load), the
    weights it still keeps beside them except those that only map the file (their pages were
    given back: vision._bf16_stack), the norms and the patch bias. Each tensor counted once."""
    weights = [tower.patch, tower.merger, tower.mm1, tower.mm2] + [
        getattr(b, n) for b in tower.blocks for n in ("q", "k", "v", "o", "gate", "up", "down")]
    tensors = [w.data for w in weights if not (w.mapped and tower.bf16 is not None)]
    tensors += [w._dense for w in weights if w._dense is not None]
    tensors += [tower.pre_norm, tower.mm_norm] + [t for b in tower.blocks for t in (b.attn_norm, b.ffn_norm)]
    tensors += [tower.patch_bias] if tower.patch_bias is not None else []
    if tower.bf16 is not None:
        bf = tower.bf16
        tensors += [bf.patch, bf.merger, bf.mm1, bf.mm2] + [t for b in bf.blocks for t in (b.qkv, b.o, b.gate_up, b.down)]
    return sum({t.data_ptr(): t.numel() * t.element_size() for t in tensors}.values())


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    """A Q8_0 projector (hidden 128, so clip's quantizer takes every block matrix) made from a
    random HF Pixtral by llama.cpp's layout and gguf-py's quantizer."""
    pytest.importorskip("transformers")
    from support import pixtral_hf
    from support.quantize_mmproj import quantized_mmproj_copy

    shape = dict(hidden=128, layers=3, heads=4, ffn=256, text_hidden=96)
    hf = pixtral_hf.build_hf(shape, 112, "silu", seed=2, attention="eager")
    folder = tmp_path_factory.mktemp("q8")
    pixtral_hf.write_mmproj(folder / "mmproj-f16.gguf", *hf, shape, 112, "silu", np.float16)
    return quantized_mmproj_copy(folder / "mmproj-f16.gguf", folder / "mmproj-Q8_0.gguf")


def _file_sizes(mmproj):
    with open_gguf(FIXTURES / "mistral3_tiny-f32.gguf") as gf, open_gguf(mmproj) as mm:
        return sizes_of_files(gf, mm)


@pytest.mark.skipif(not host.cpu_has_bf16_dot(), reason="this CPU has no bf16 dot products")
@pytest.mark.parametrize("mmproj", ["q8", "f16"])
def test_the_plan_equals_what_a_loaded_tower_holds_on_this_cpu(mmproj, q8_file):
    path = q8_file if mmproj == "q8" else FIXTURES / "mmproj-mistral3_tiny-f16.gguf"
    cpu = device_map.detect_machine().cpu
    assert cpu.bf16_dot and cpu_tower_runs_bf16(cpu)
    tower = VisionTower.load(path)  # the engine's default on this CPU: the bf16 path
    assert tower.bf16 is not None and tower.bf16.blocks[0].qkv.dtype == torch.bfloat16
    sizes = _file_sizes(path)
    held = _held_bytes(tower)
    assert vision_tower_bytes(sizes, "cpu", cpu_tower_runs_bf16(cpu)) == held
    if mmproj == "q8":
        assert held > 1.5 * sizes.vision_bytes  # the file's bytes alone would undercount it


@pytest.mark.parametrize("exact", [False, True])
def test_elsewhere_the_plan_equals_the_files_bytes_the_tower_holds(q8_file, monkeypatch, exact):
    """No bf16 dot products (the int8 path), or exact mode: no bf16 matrices are made, and the
    tower holds the file's bytes (q/k as reordered copies in place of their mapped rows)."""
    from tramontane.engine.mistral3 import vision as vision_module

    monkeypatch.setattr(vision_module, "cpu_has_bf16_dot", lambda: exact)  # exact mode: on a bf16 CPU
    with cpu_exact(exact):
        tower = VisionTower.load(q8_file)
        assert tower.bf16 is None
        cpu = DeviceInfo("cpu", 64 * GiB, bf16_dot=exact)
        assert not cpu_tower_runs_bf16(cpu)
        sizes = _file_sizes(q8_file)
        assert vision_tower_bytes(sizes, "cpu", cpu_tower_runs_bf16(cpu)) == sizes.vision_bytes == _held_bytes(tower)


def test_a_model_switch_keeps_the_cpus_flag():
    """The Models dialog's machine for a switch (the loaded model's RAM counted free) is the same CPU."""
    from tramontane.engine.library.fit import without_the_loaded_model

    machine = Machine((), DeviceInfo("cpu", 8 * GiB, "simulated", bf16_dot=True))
    switched = without_the_loaded_model(machine, GiB)
    assert switched.cpu.free_bytes == 9 * GiB and switched.cpu.bf16_dot
