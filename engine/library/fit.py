"""Whether a model fits this machine, in words, from the engine's device planner
(engine/runtime/device_map.py): for files on disk from their headers, for catalogue entries
not yet downloaded from the catalogue's sizes and shapes; and Settings' "GPU layers: N" as
the planner's manual map.

Nothing here does its own memory arithmetic: an entry not yet downloaded becomes an estimated
tensor inventory (its file size spread over its tensors by parameter count; its projector's
tensors typed as the projector's file name says, so the planner's rule for what the vision tower
keeps applies: a Q8_0 projector expanded to bf16 on a bf16 CPU) handed to the same `model_sizes`
and `plan_devices` a loaded file goes through.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from ...kernels.ggml_types import F16, F32, TYPES, type_info
from ..api import EngineError
from ..mistral3.config import LAYOUTS, TextConfig, VisionConfig
from ..runtime.device_map import (UNKNOWN_RAM, Budget, Machine, ModelSizes, PlanError, gpu_layers_map,
                                  model_sizes, plan_devices, plan_for_files)
from .catalog import CatalogEntry
from .sizes import size_text

# The dialog's words for the planner's DevicePlan.fit, and for a PlanError.
FIT_WORDS = {"gpu": "on the GPU", "partial": "partly on the CPU", "cpu": "on the CPU",
             "too_big": "too big"}

# Pixtral, the vision tower of Mistral Small 3.1 and of every Ministral 3 (their projectors
# differ only in the output width, the decoder's hidden size). Used to size the activations
# of an image for a projector not yet downloaded.
PIXTRAL = {"image_size": 1540, "patch_size": 14, "merge": 2, "hidden": 1024, "ffn": 4096, "n_layers": 24,
           "n_heads": 16}


@dataclass(frozen=True)
class Fit:
    """One model on this machine: `kind` is "gpu", "partial", "cpu" or "too_big"; `detail`
    is the plan with its arithmetic, or the planner's reason it does not fit."""

    kind: str
    detail: str

    @property
    def words(self) -> str:
        return FIT_WORDS[self.kind]


def machine_for_a_switch(machine: Machine | None = None, reserved=None) -> Machine:
    """This machine as the next load will find it: the engine unloads the current model first,
    so the GPU memory this process holds (`reserved(index)`, torch's caching allocator) counts
    as free. Without it a loaded 14B would make every other model look too big."""
    from ..runtime.device_map import detect_machine

    machine = machine or detect_machine()
    if not machine.gpus:
        return machine
    if reserved is None:
        import torch

        reserved = torch.cuda.memory_reserved
    gpus = tuple(replace(d, free_bytes=d.free_bytes + int(reserved(int(d.name.split(":")[1]))))
                 for d in machine.gpus)  # the rest (its capability) as detected
    return Machine(gpus, machine.cpu, machine.unified)


def without_the_loaded_model(machine: Machine, freed_bytes: int) -> Machine:
    """The machine as a switch finds it: loading a model unloads the current one first, so the
    RAM only it holds (`freed_bytes`: its private pages, host.private_ram; its mapped file's
    pages are free already) counts as free; the GPU's is counted by machine_for_a_switch. Apply
    it once to a detected machine: a machine it returned has the RAM in already."""
    cpu = machine.cpu
    if cpu is None or freed_bytes <= 0 or cpu.free_bytes >= UNKNOWN_RAM:
        return machine
    return Machine(machine.gpus, replace(cpu, free_bytes=cpu.free_bytes + freed_bytes), machine.unified)


def machine_for(machine: Machine, device: str) -> Machine:
    """Settings' device "cpu" plans without the GPUs, as the engine then loads."""
    return Machine((), machine.cpu) if device == "cpu" else machine


def fit_of_sizes(sizes: ModelSizes, machine: Machine, budget: Budget | None = None) -> Fit:
    try:
        plan = plan_devices(sizes, machine, budget or Budget())
    except PlanError as exc:
        return Fit("too_big", str(exc))
    return Fit(plan.fit, plan.explain())


def fit_of_file(model_path: str | os.PathLike, mmproj_path: str | os.PathLike | None,
                machine: Machine, device: str = "auto", budget: Budget | None = None,
                draft_path: str | os.PathLike | None = None) -> Fit | None:
    """The plan of a model file (and its projector, and the draft model the engine would load
    beside it) read from their headers; None when the file is not a model the engine runs
    (loading it says why). `budget`: the context planned for (default: the loader's default)."""
    from ..gguf import open_gguf

    try:
        with open_gguf(model_path) as gf:
            plan = plan_for_files(gf, mmproj_path, "cpu" if device == "cpu" else "auto",
                                  machine=machine, budget=budget or Budget(), draft_path=draft_path)
    except PlanError as exc:
        return Fit("too_big", str(exc))
    except (EngineError, OSError):
        return None
    return Fit(plan.fit, plan.explain())


def catalog_bytes(entry: CatalogEntry, quant: str) -> tuple[int | None, int | None]:
    """(model, projector) sizes in bytes as the catalogue gives them: None where it leaves one
    open (the hub knows it), a projector of 0 for a text-only entry."""
    v = entry.variant(quant)
    return _gb_bytes(v.size_gb), _gb_bytes(entry.mmproj_size_gb) if entry.vision else 0


def catalog_size_text(sizes: tuple[int | None, int | None]) -> str:
    """An entry's download, (model, projector) bytes, as the Models dialog and `models list
    --catalog` show it: "?" while the model's size is not known."""
    model, mmproj = sizes
    if model is None:
        return "?"
    if mmproj is None:  # a projector whose size the catalogue does not pin
        return f"{size_text(model)} + projector"
    return size_text(model + mmproj)


def _gb_bytes(gb: float | None) -> int | None:
    return round(gb * 1e9) if gb else None


def fit_of_catalog_entry(entry: CatalogEntry, sizes: tuple[int | None, int | None],
                         files: tuple[Path | None, Path | None], machine: Machine,
                         device: str = "auto", budget: Budget | None = None) -> Fit | None:
    """Where a catalogue entry would run: its files' own plan once the model is on disk
    (`files` as catalog_files gives them), else the estimate from its (model, projector)
    `sizes`; None while the model's size is not known."""
    model_bytes, mmproj_bytes = sizes
    path, proj = files
    if path is not None:
        return fit_of_file(path, proj, machine, device, budget)
    if model_bytes and entry.shape is not None:
        return fit_of_sizes(catalog_sizes(entry, model_bytes, mmproj_bytes), machine, budget)
    return None


def catalog_sizes(entry: CatalogEntry, model_bytes: int, mmproj_bytes: int | None) -> ModelSizes:
    """An estimated inventory of an entry not yet downloaded: `model_bytes` spread over its
    tensors by parameter count (K-quant mixes differ by a few percent per tensor), the norms
    in f32; the projector (when its size is known) as Pixtral with `mmproj_bytes`."""
    s = entry.shape
    if s is None:
        raise ValueError(f"catalogue entry {entry.id!r} has no shape")
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    layer_params = 2 * s.hidden * q_width + 2 * s.hidden * kv_width + 3 * s.hidden * s.ffn
    table_params = s.vocab * s.hidden
    norm_bytes = 4 * s.hidden * (2 * s.layers + 1)
    matrix_params = s.layers * layer_params + table_params * (1 if s.tied else 2)
    per_param = max(model_bytes - norm_bytes, 0) / matrix_params
    tensors = {f"blk.{i}": _nbytes(layer_params * per_param + 8 * s.hidden) for i in range(s.layers)}
    tensors["token_embd.weight"] = _nbytes(table_params * per_param)
    tensors["output_norm.weight"] = _nbytes(4 * s.hidden)
    if not s.tied:
        tensors["output.weight"] = _nbytes(table_params * per_param)
    cfg = TextConfig(arch="mistral3", n_layers=s.layers, hidden=s.hidden, n_heads=s.heads,
                     n_kv_heads=s.kv_heads, head_dim=s.head_dim, v_head_dim=s.head_dim, ffn=s.ffn,
                     vocab_size=s.vocab, norm_eps=1e-5, rope_theta=1e6, rope_dim=s.head_dim,
                     context_length=0, tied_embeddings=s.tied)
    name = entry.variants[0].file or entry.name
    if not (entry.vision and mmproj_bytes):
        return model_sizes(cfg, tensors, name)
    vision = VisionConfig(eps=1e-5, mean=(0.5,) * 3, std=(0.5,) * 3, activation="silu", rope_theta=1e4,
                          text_hidden=s.hidden, layout="llama.cpp", **PIXTRAL)
    return model_sizes(cfg, tensors, name, vision, projector_inventory(vision, mmproj_bytes, entry.mmproj_type),
                       entry.mmproj_file or "projector")


def projector_inventory(vision: VisionConfig, mmproj_bytes: int, type_name: str | None) -> dict[str, SimpleNamespace]:
    """An estimated inventory of a llama.cpp-layout projector not yet downloaded: its tensors by
    name and shape, the matrices in `type_name` (the file's, e.g. "Q8_0"), the 4-D patch conv
    16-bit beside quantized matrices and the norms f32 (as llama.cpp's clip quantizer leaves
    them), `mmproj_bytes` spread over the matrices by their type's bytes a value. An unknown
    type gives one opaque tensor of the file's size (the planner then counts the file's bytes)."""
    matrix_type = {t.name: t.id for t in TYPES.values()}.get((type_name or "").upper())
    if matrix_type is None:
        return {"mmproj": _nbytes(mmproj_bytes)}
    names, h, ffn, out = LAYOUTS["llama.cpp"], vision.hidden, vision.ffn, vision.text_hidden
    patch_type = F16 if type_info(matrix_type).block_size > 1 else matrix_type
    matrices = {names["patch"]: ((h, 3, vision.patch_size, vision.patch_size), patch_type),
                names["merger"]: ((h, h * vision.merge ** 2), matrix_type),
                names["mm1"]: ((out, h), matrix_type), names["mm2"]: ((out, out), matrix_type)}
    shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "gate": (ffn, h), "up": (ffn, h), "down": (h, ffn)}
    matrices.update({names[role].format(i=i): (shape, matrix_type)
                     for i in range(vision.n_layers) for role, shape in shapes.items()})
    norms = [names["pre_norm"], names["mm_norm"]] + [names[role].format(i=i) for i in range(vision.n_layers)
                                                      for role in ("attn_norm", "ffn_norm")]
    nominal = {name: math.prod(shape) * type_info(t).type_size / type_info(t).block_size
               for name, (shape, t) in matrices.items()}
    scale = max(mmproj_bytes - 4 * h * len(norms), 0) / sum(nominal.values())
    inventory = {name + ".weight": SimpleNamespace(shape=shape, ggml_type=t, nbytes=int(nominal[name] * scale))
                 for name, (shape, t) in matrices.items()}
    inventory.update({name + ".weight": SimpleNamespace(shape=(h,), ggml_type=F32, nbytes=4 * h) for name in norms})
    inventory[names["mm2"] + ".weight"].nbytes += max(mmproj_bytes - sum(t.nbytes for t in inventory.values()), 0)
    return inventory  # the file's bytes to the byte (what truncating each share lost, on one matrix)


def _nbytes(n: float) -> SimpleNamespace:
    return SimpleNamespace(nbytes=int(n))


def gpu_layers_device_map(model_path: str | os.PathLike, gpu_layers: int | None,
                          device: str = "auto") -> str | None:
    """Settings' "GPU layers: N" as the engine's manual map for this file ("cpu=10,cuda:0=30");
    None for the automatic plan (no N, or the device setting is "cpu")."""
    if gpu_layers is None or gpu_layers < 0 or device == "cpu":
        return None
    from ..gguf import open_gguf
    from ..mistral3.config import text_config

    with open_gguf(model_path) as gf:
        n_layers = text_config(gf).n_layers
    return ",".join(f"{name}={count}" for name, count in gpu_layers_map(n_layers, gpu_layers))
