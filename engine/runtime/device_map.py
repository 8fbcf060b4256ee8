"""Device mapping: which device holds each layer, the embedding, the head and the vision tower,
planned from the file's tensor sizes before any weight is loaded.

The method is mistral.rs's (see device-mapping.md in the shared notes): budget parameters
(`Budget`, estimates and not limits) size the KV cache and the activations; devices are every
CUDA GPU (free memory minus a headroom), then the CPU on machines whose CPU memory is separate
(never on unified memory); each device in turn takes everything that is left if it fits, else
layers one by one with their KV share up to its capacity. A manual map (`parse_device_map`,
`gpu_layers_map`) overrides the counts.

Where it goes further than that anchor, cheaply:
- the output head runs on every token: it goes to the first GPU, with the last layers, so a
  split model has one boundary per step (CPU layers first, then the GPU layers and the head);
- the token embedding is a row lookup: on a split model it stays in CPU memory;
- the vision tower is placed whole on a GPU when it fits there (an image encodes in one piece);
- a draft model (speculative decoding) is placed whole after the model: beside the head when it
  fits, else the CPU; its weights, KV pool and own pass are terms of that device like the rest.
Every byte is counted by runtime/memory.py's terms, stage by stage (load, vision encode, prefill
chunk, decode): a device's need is its worst stage, and the loader allocates what the plan
counted (the KV cache for the plan's `context_length`, nothing from "what is left").
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from ...kernels.ggml_types import BF16, F16, F32
from .. import host
from ..api import EngineError
from ..mistral3.config import LAYOUTS, LINEAR_ROLES, TextConfig, VisionConfig
from . import memory as mem
from .memory import CPU_HEADROOM_BYTES, CUDA_HEADROOM_BYTES, DEFAULT_CONTEXT, GiB, MiB
BF16_BYTES = 2  # a value of the vision tower's bf16 matrices (a bf16 CPU's, a GPU's with bf16)
F32_BYTES = 4  # a value of its float32 matrices (a GPU without bf16)
# What a simulated device (no compute_value_bytes) computes in: float32 on a CPU, bf16 on a GPU.
SIMULATED_VALUE_BYTES = {"cpu": F32_BYTES, "cuda": BF16_BYTES}
UNKNOWN_RAM = 1 << 50  # a system that does not say: plan as if the CPU had room (as before planning)


class PlanError(EngineError):
    """The model cannot be placed on this machine (raised before anything is loaded)."""


# ----------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class Budget:
    """What the plan reserves room for: estimates, not limits at run time."""

    max_seq_len: int = DEFAULT_CONTEXT  # the context the loader allocates (capped by the file's)
    max_batch_size: int = 1
    max_num_images: int = 1  # only when a projector is loaded
    max_image_length: int = 1024  # images assumed square of this side
    kv_type: str = "f32"  # the CPU layers' KV elements (memory.KV_TYPE_BYTES); GPU layers keep their dtype

    @property
    def tokens(self) -> int:
        return self.max_seq_len * self.max_batch_size


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # "cuda:0", "cpu" (tests may add logical "cpu:1")
    free_bytes: int
    description: str = ""
    bf16_dot: bool = False  # a CPU that multiplies bf16 in hardware (host.cpu_has_bf16_dot): the vision tower runs bf16 there
    # a CUDA GPU's compute capability (detect_machine): without bf16 (host.cuda_has_bf16) the vision
    # tower runs float32 there; None: not known (a simulated GPU), planned as one with bf16
    capability: tuple[int, int] | None = None
    # Bytes of one value of the text model's compute dtype here (its activations, a GPU's KV): what
    # mistral3.text.default_dtype answers for this device, asked of it by detect_machine (the
    # planner keeps no rule of its own). None: a simulated device, planned as a CPU's float32 or a
    # GPU's 16-bit dtype (SIMULATED_VALUE_BYTES).
    compute_value_bytes: int | None = None

    @property
    def kind(self) -> str:
        return self.name.split(":")[0]

    @property
    def value_bytes(self) -> int:
        """Bytes of one value of the text model's compute dtype on this device."""
        return self.compute_value_bytes or SIMULATED_VALUE_BYTES[self.kind]

    @property
    def headroom(self) -> int:
        return CUDA_HEADROOM_BYTES if self.kind == "cuda" else CPU_HEADROOM_BYTES

    @property
    def usable(self) -> int:
        return max(self.free_bytes - self.headroom, 0)


@dataclass(frozen=True)
class Machine:
    gpus: tuple[DeviceInfo, ...] = ()
    cpu: DeviceInfo | None = None
    unified: bool = False  # GPU and CPU share one memory: the CPU is no extra room

    @property
    def devices(self) -> list[DeviceInfo]:
        """Planning order: the GPUs, then the CPU where it has memory of its own."""
        out = list(self.gpus)
        if self.cpu is not None and not (self.unified and self.gpus):
            out.append(self.cpu)
        return out

    def find(self, name: str) -> DeviceInfo | None:
        name = canonical_device(name)
        for dev in self.devices:
            if dev.name == name:
                return dev
        if name.startswith("cpu:") and self.cpu is not None and self.cpu in self.devices:
            return replace(self.cpu, name=name)  # a logical CPU
        return None


def detect_machine() -> Machine:
    """This machine: free memory of every CUDA GPU now (NVML: no CUDA context is created on a
    GPU only to ask, see memory.gpu_free_memory), and MemAvailable of the system. Each device's
    compute dtype is the model's own answer for it (compute_value_bytes)."""
    gpus, unified = [], False
    for i, (free, _total, name, integrated, how, capability) in enumerate(mem.gpu_free_memory()):
        unified = unified or integrated
        gpus.append(DeviceInfo(f"cuda:{i}", free, name if how in ("nvml", "torch") else f"{name}, {how}",
                               capability=capability, compute_value_bytes=_compute_value_bytes(f"cuda:{i}")))
    ram, bf16_dot = host.available_ram(), host.cpu_has_bf16_dot()
    cpu_bytes = _compute_value_bytes("cpu")
    cpu = (DeviceInfo("cpu", ram, "system memory", bf16_dot, compute_value_bytes=cpu_bytes) if ram
           else DeviceInfo("cpu", UNKNOWN_RAM, "system memory, size unknown", bf16_dot,
                           compute_value_bytes=cpu_bytes))
    return Machine(tuple(gpus), cpu, unified)


def _compute_value_bytes(name: str) -> int:
    """Bytes of a value of the dtype the text model computes in on device `name`, as the loader
    picks it (mistral3.text.default_dtype; torch and the model are imported only to ask)."""
    import torch

    from ..mistral3.text import default_dtype

    return default_dtype(torch.device(name)).itemsize


@dataclass(frozen=True)
class ModelSizes:
    """What the planner needs from a model file (and its projector), in bytes as stored."""

    name: str
    layer_bytes: tuple[int, ...]  # per decoder block, quantized as in the file
    embedding_bytes: int  # token_embd
    head_bytes: int  # output (or token_embd again when tied) + output_norm + anything outside the blocks
    tied: bool
    kv_width: int  # K and V values per token per layer: n_kv_heads * (head_dim + v_head_dim)
    row_width: int  # activation values per prompt row inside a layer
    vision_bytes: int = 0
    vision_name: str = ""
    vision_row_width: int = 0  # activation values per patch inside the vision tower
    vision_patch: int = 14  # patch_size * merge gives the image grid step
    vision_merge: int = 2
    vision_image_size: int = 1540  # longest side the preprocessing keeps
    n_heads: int = 32  # query heads, and their size: attention scratch
    head_dim: int = 128
    vocab: int = 131072  # logits rows
    context_length: int = 0  # the file's; 0 = not known
    vision_heads: int = 16
    vision_head_dim: int = 64
    vision_float_values: int = 0  # values of its float (F32/F16/BF16) matrices, kept in the tower's dtype
    vision_float_bytes: int = 0  # those matrices' bytes in the file
    vision_bf16_values: int = 0  # values of its matmul matrices where a bf16 CPU converts them (none F32), else 0
    vision_bf16_bytes: int = 0  # those matrices' bytes in the file
    vision_copied_bytes: int = 0  # matrices the loader copies to reorder their rows (llama.cpp's q/k), file bytes

    @property
    def n_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def has_vision(self) -> bool:
        return self.vision_bytes > 0


def model_sizes(cfg: TextConfig, tensors: Mapping[str, object], name: str = "model",
                vision: VisionConfig | None = None, vision_tensors: Mapping[str, object] | None = None,
                vision_name: str = "projector") -> ModelSizes:
    """Sizes from a tensor inventory: {name: anything with `.nbytes`} (GGUFFile.tensors)."""
    layers = [0] * cfg.n_layers
    other = 0
    for tname, info in tensors.items():
        parts = tname.split(".")
        if parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < cfg.n_layers:
            layers[int(parts[1])] += info.nbytes
        elif tname != "token_embd.weight":
            other += info.nbytes
    embedding = tensors["token_embd.weight"].nbytes
    head = other + (embedding if cfg.tied_embeddings else 0)
    kv_width = cfg.n_kv_heads * (cfg.head_dim + cfg.v_head_dim)
    # residual, norm output, attention output, MLP out + q, k, v + gate, up, gate*up
    row_width = 4 * cfg.hidden + cfg.q_width + kv_width + 3 * cfg.ffn
    text = dict(n_heads=cfg.n_heads, head_dim=cfg.head_dim, vocab=cfg.vocab_size,
                context_length=cfg.context_length)
    sizes = ModelSizes(name, tuple(layers), embedding, head, cfg.tied_embeddings, kv_width, row_width, **text)
    if vision is None:
        return sizes
    vbytes = sum(t.nbytes for t in (vision_tensors or {}).values())
    matrices = [t for t in (vision_tensors or {}).values()
                if getattr(t, "ggml_type", None) in (F32, F16, BF16) and len(getattr(t, "shape", ())) >= 2]
    matmul = _vision_matmul_tensors(vision, vision_tensors or {})
    bf16 = [t for t in matmul.values() if getattr(t, "ggml_type", F32) != F32]
    bf16 = bf16 if matmul and len(bf16) == len(matmul) else []  # one float32 matrix: the file keeps float32
    copied = [t for n, t in matmul.items() if vision.layout == "llama.cpp" and n.endswith((".attn_q", ".attn_k"))]
    return ModelSizes(name, tuple(layers), embedding, head, cfg.tied_embeddings, kv_width, row_width,
                      vision_bytes=vbytes, vision_name=vision_name,
                      # as row_width: 4 residual-sized + q, k, v + gate, up, gate*up per patch
                      vision_row_width=7 * vision.hidden + 3 * vision.ffn,
                      vision_patch=vision.patch_size, vision_merge=vision.merge,
                      vision_image_size=vision.image_size, vision_heads=vision.n_heads,
                      vision_head_dim=vision.hidden // vision.n_heads,
                      vision_float_values=sum(math.prod(t.shape) for t in matrices),
                      vision_float_bytes=sum(t.nbytes for t in matrices),
                      vision_bf16_values=sum(math.prod(t.shape) for t in bf16),
                      vision_bf16_bytes=sum(t.nbytes for t in bf16),
                      vision_copied_bytes=sum(t.nbytes for t in copied), **text)


def _vision_matmul_tensors(vision: VisionConfig, tensors: Mapping[str, object]) -> dict[str, object]:
    """{role name: tensor} of every weight the tower multiplies by (the patch conv, the blocks'
    q/k/v/o/gate/up/down, merger, mm1, mm2), as the loader names them; {} where the inventory
    has no such tensors with shapes (a catalogue estimate)."""
    names = LAYOUTS.get(vision.layout, {})
    found = []
    for role in ("patch",) + LINEAR_ROLES:
        name = names.get(role, "")
        found += [name.format(i=i) for i in range(vision.n_layers)] if "{i}" in name else [name]
    out = {n: tensors.get(n + ".weight") for n in found}
    if any(t is None or not getattr(t, "shape", None) for t in out.values()):
        return {}
    return out


def sizes_of_files(model_gf, mmproj_gf=None) -> ModelSizes:
    """Sizes of an open model GGUF (and projector GGUF): reads only the headers."""
    from ..mistral3.config import read_config, text_config

    cfg = text_config(model_gf)
    vision = read_config(mmproj_gf) if mmproj_gf is not None else None
    return model_sizes(cfg, model_gf.tensors, model_gf.path.name, vision,
                       mmproj_gf.tensors if mmproj_gf is not None else None,
                       mmproj_gf.path.name if mmproj_gf is not None else "")


# ----------------------------------------------------------------------------- the arithmetic

def kv_value_bytes(device: DeviceInfo, kv_type: str) -> int:
    """Bytes of one KV element on `device`: the CPU's KV is the kv_type's, a GPU's keeps the
    model's compute dtype whatever the kv_type (decoder.new_cache allocates so)."""
    return mem.kv_type_bytes(kv_type) if device.kind == "cpu" else device.value_bytes


def context_of(sizes: ModelSizes, budget: Budget) -> int:
    """The context the plan budgets and the loader allocates: the budget's, capped by the file's."""
    n = budget.max_seq_len
    return min(n, sizes.context_length) if sizes.context_length else n


def kv_bytes_per_layer(sizes: ModelSizes, budget: Budget, device: DeviceInfo) -> int:
    return mem.kv_bytes(context_of(sizes, budget) * budget.max_batch_size, sizes.kv_width, 1,
                        kv_value_bytes(device, budget.kv_type))


def activation_bytes(sizes: ModelSizes, budget: Budget, device: DeviceInfo) -> int:
    """Peak of one layer pass: the rows of one prefill chunk (never more than the budget's)."""
    rows = mem.prefill_rows(context_of(sizes, budget) * budget.max_batch_size, device.kind)
    return mem.prefill_activation_bytes(rows, sizes.row_width, device.value_bytes)


def prefill_scratch_bytes(sizes: ModelSizes, budget: Budget, device: DeviceInfo) -> int:
    """Besides the chunk's rows: flash attention's per-row state, and on a GPU the dequantized
    weight rows of a multi-row quantized matmul."""
    rows = mem.prefill_rows(context_of(sizes, budget) * budget.max_batch_size, device.kind)
    if device.kind != "cuda":
        return mem.attention_scratch_bytes(rows, sizes.n_heads, sizes.head_dim)
    n_kv = sizes.kv_width // (2 * sizes.head_dim)  # k and v of one size (Mistral 3)
    return (mem.gpu_attention_scratch_bytes(rows, sizes.n_heads, n_kv, sizes.head_dim, device.value_bytes)
            + mem.matmul_scratch_bytes())


def image_patches(sizes: ModelSizes, budget: Budget) -> int:
    """Patches of one square image of max_image_length (as the preprocessing grids it)."""
    side = min(budget.max_image_length, sizes.vision_image_size)
    step = sizes.vision_patch * sizes.vision_merge
    per_side = ((side - 1) // step + 1) * sizes.vision_merge
    return per_side * per_side


def vision_activation_bytes(sizes: ModelSizes, budget: Budget, device_kind: str) -> int:
    """The images of one prompt through the tower: float32 everywhere (the residual stream is,
    and GPUs without bf16 run the whole tower in float32: fp16 overflows there)."""
    if not sizes.has_vision:
        return 0
    return mem.vision_stage_bytes(budget.max_num_images * image_patches(sizes, budget), sizes.vision_row_width,
                                  sizes.vision_heads, sizes.vision_head_dim, 4)


# ----------------------------------------------------------------------------- the plan

# Resident parts that exist only once the model runs (not while its weights load).
RUNTIME_PARTS = ("cuBLAS workspace", "CUDA graph pool", "draft KV", "draft CUDA graph pool")
STAGES = ("load", "vision encode", "prefill chunk", "decode", "draft")
# The draft model's KV elements on a CPU: its pool is made with new_pool's default (draft.py)
DRAFT_KV_TYPE = "f32"


@dataclass
class Placement:
    """What one device holds, and what that costs at each stage."""

    device: DeviceInfo
    layers: range = range(0)
    weights: int = 0  # of its layers
    kv: int = 0
    activations: int = 0  # one prefill chunk's rows through a layer
    parts: dict[str, int] = field(default_factory=dict)  # resident: "token embedding", "vision tower", ...
    prefill_scratch: int = 0  # attention state, matmul scratch, logits
    decode_scratch: int = 0  # one row and the logits (a GPU's live in its graph pool)
    vision_activations: int = 0  # when the tower is here
    load_scratch: int = 0  # one fused weight in flight while loading
    draft_scratch: int = 0  # the draft model's own pass (a prompt chunk or a decode step), when it is here

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def resident(self) -> int:
        return self.weights + self.kv + sum(self.parts.values())

    def stages(self) -> dict[str, int]:
        """Peak bytes at each stage; stages never overlap, so the need is the largest."""
        loaded = self.weights + sum(n for k, n in self.parts.items() if k not in RUNTIME_PARTS)
        out = {"load": loaded + self.load_scratch,
               "prefill chunk": self.resident + self.activations + self.prefill_scratch,
               "decode": self.resident + self.decode_scratch}
        if self.vision_activations:
            out["vision encode"] = self.resident + self.vision_activations
        if self.draft_scratch:  # the draft runs its own passes, never inside the target's
            out["draft"] = self.resident + self.draft_scratch
        return {s: out[s] for s in STAGES if s in out}

    @property
    def total(self) -> int:
        return max(self.stages().values())


@dataclass
class DevicePlan:
    model: str
    n_layers: int
    budget: Budget
    placements: list[Placement]  # machine order: GPUs, then the CPU
    embedding_device: str
    head_device: str
    vision_device: str | None
    manual: bool = False
    warnings: list[str] = field(default_factory=list)
    context_length: int = DEFAULT_CONTEXT  # what the loader allocates (context_of)
    draft: str | None = None  # the draft model's file name, when one is planned
    draft_device: str | None = None  # where it runs whole (its weights, its KV pool)

    def layer_devices(self) -> list[str]:
        out = [""] * self.n_layers
        for p in self.placements:
            for i in p.layers:
                out[i] = p.name
        return out

    @property
    def gpu_layers(self) -> int:
        return sum(len(p.layers) for p in self.placements if p.device.kind == "cuda")

    @property
    def cpu_layers(self) -> int:
        return self.n_layers - self.gpu_layers

    @property
    def fit(self) -> str:
        """"gpu" (all layers on GPUs), "partial" (some on the CPU) or "cpu" (no GPU layer)."""
        if self.gpu_layers == self.n_layers:
            return "gpu"
        return "partial" if self.gpu_layers else "cpu"

    def summary(self) -> str:
        """One line for the model bar: where the model runs."""
        used = [p for p in self.placements if p.layers]
        if len(used) == 1:
            where = "the CPU" if used[0].device.kind == "cpu" else used[0].name
            return f"all {self.n_layers} layers on {where}"
        if self.gpu_layers and self.cpu_layers:
            return f"{self.gpu_layers} of {self.n_layers} layers on GPU, {self.cpu_layers} on CPU"
        kind = "GPU" if self.gpu_layers else "CPU"
        return (f"all {self.n_layers} layers on {kind} ("
                + ", ".join(f"{len(p.layers)} on {p.name}" for p in used) + ")")

    def as_dict(self) -> dict:
        """The plan as data (model bar, Settings, `info --plan --json`)."""
        return {
            "summary": self.summary(),
            "n_layers": self.n_layers,
            "gpu_layers": self.gpu_layers,
            "cpu_layers": self.cpu_layers,
            "context_length": self.context_length,
            "devices": [{"device": p.name, "first_layer": p.layers.start, "layers": len(p.layers),
                         "bytes": p.total, "usable_bytes": p.device.usable, "stages": p.stages()}
                        for p in self.placements],
            "embedding": self.embedding_device,
            "head": self.head_device,
            "vision": self.vision_device,
            "fit": self.fit,
            "draft": {"model": self.draft, "device": self.draft_device,
                      "bytes": self._draft_bytes()} if self.draft else None,
            "manual": self.manual,
            "warnings": list(self.warnings),
        }

    def explain(self) -> str:
        """The plan with its arithmetic, for `tramontane-cli info --plan`."""
        b = self.budget
        lines = [f"plan for {self.model} ({'manual map' if self.manual else 'automatic'})",
                 f"budget: max_seq_len {b.max_seq_len} x max_batch_size {b.max_batch_size}"
                 + (f", {b.max_num_images} image(s) of {b.max_image_length}x{b.max_image_length}"
                    if self.vision_device else "") + f"; context {self.context_length}"
                 + (f"; CPU KV {b.kv_type}" if b.kv_type != "f32" else "")]
        for p in self.placements:
            d = p.device
            lines.append(f"{d.name}{' (' + d.description + ')' if d.description else ''}: "
                         f"{_gib(d.free_bytes)} free - {_gib(d.headroom)} headroom = {_gib(d.usable)} usable")
            for part, n in p.parts.items():
                lines.append(f"  {part:<22} {_gib(n)}")
            if p.layers:
                n = len(p.layers)
                lines.append(f"  layers {p.layers.start}-{p.layers.stop - 1} ({n}){'':<7} "
                             f"{_gib(p.weights)} weights + {n} x {_mib(p.kv // n)} KV = {_gib(p.kv)}")
                lines.append(f"  {'KV per layer':<22} {self._kv_arithmetic(p)}")
            transient = [("one fused weight at load", p.load_scratch), ("prefill chunk rows", p.activations),
                         ("prefill scratch", p.prefill_scratch), ("decode step", p.decode_scratch),
                         ("one image's activations", p.vision_activations), ("draft pass", p.draft_scratch)]
            lines.append("  while running: " + ", ".join(f"{what} {_gib(n)}" for what, n in transient if n))
            lines.append("  stages: " + ", ".join(f"{s} {_gib(n)}" for s, n in p.stages().items()))
            lines.append(f"  {'peak':<22} {_gib(p.total)} of {_gib(d.usable)}")
        lines.extend(f"warning: {w}" for w in self.warnings)
        lines.append(f"=> {self.summary()}" + (f"; draft {self.draft} on {self.draft_device}" if self.draft else ""))
        return "\n".join(lines)


    def _draft_bytes(self) -> int:
        """The draft's resident bytes: its weights, its KV pool, its decode graphs."""
        p = next(p for p in self.placements if p.name == self.draft_device)
        return sum(p.parts.get(k, 0) for k in ("draft model", "draft KV", "draft CUDA graph pool"))

    def _kv_arithmetic(self, p: Placement) -> str:
        """One layer's KV as its factors: positions x values per position x bytes of the
        element (the CPU's per kv_type, a GPU's its compute dtype)."""
        positions = self.context_length * self.budget.max_batch_size
        value_bytes = kv_value_bytes(p.device, self.budget.kv_type)
        width = p.kv // len(p.layers) // (positions * value_bytes)
        element = self.budget.kv_type if p.device.kind == "cpu" else f"{8 * value_bytes}-bit"
        return f"{positions} positions x {width} values x {value_bytes} B ({element})"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= 100 * MiB else _mib(n)


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


_DEVICE_NAME = re.compile(r"^(cpu|cuda)(:\d+)?$")


def canonical_device(name: str) -> str:
    name = name.strip().lower()
    if not _DEVICE_NAME.match(name):
        raise PlanError(f"device map: unknown device '{name}': use cpu, cuda or cuda:N")
    return "cuda:0" if name == "cuda" else name


def parse_device_map(text: str) -> list[tuple[str, int]]:
    """`cuda:0=30,cpu=10` -> [("cuda:0", 30), ("cpu", 10)]: layer counts per device, in layer order."""
    out: list[tuple[str, int]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit():
            raise PlanError(f"device map '{text}': '{item}' is not DEVICE=LAYERS (e.g. cuda:0=30,cpu=10)")
        dev = canonical_device(name)
        if any(dev == d for d, _ in out):
            raise PlanError(f"device map '{text}': {dev} is named twice")
        out.append((dev, int(count)))
    if not out:
        raise PlanError(f"device map '{text}' is empty (e.g. cuda:0=30,cpu=10)")
    return out


def gpu_layers_map(n_layers: int, gpu_layers: int, gpu: str = "cuda:0") -> list[tuple[str, int]]:
    """Settings' "GPU layers: N" as a manual map: the rest on the CPU first, the last N (and the
    head) on the GPU, like the automatic plan."""
    n = max(0, min(int(gpu_layers), n_layers))
    return [(d, c) for d, c in (("cpu", n_layers - n), (gpu, n)) if c]


def plan_devices(sizes: ModelSizes, machine: Machine, budget: Budget = Budget(),
                 manual: Sequence[tuple[str, int]] | None = None, draft: ModelSizes | None = None) -> DevicePlan:
    """Place the model (automatic, or the counts of `manual`), and a draft model for speculative
    decoding beside it (`draft`, see _place_draft). PlanError when they cannot fit."""
    plan = _plan_model(sizes, machine, budget, manual)
    if draft is not None:
        _place_draft(plan, sizes, draft, machine)
    return plan


def _plan_model(sizes: ModelSizes, machine: Machine, budget: Budget,
                manual: Sequence[tuple[str, int]] | None) -> DevicePlan:
    devices = machine.devices
    if not devices:
        raise PlanError("no device to run on (no GPU and no CPU memory reported)")
    if budget.max_seq_len <= 0:
        raise PlanError(f"context length must be positive, got {budget.max_seq_len}")
    try:
        mem.kv_type_bytes(budget.kv_type)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if manual is not None:
        return _manual_plan(sizes, machine, budget, manual)
    all_layers = range(sizes.n_layers)
    context = context_of(sizes, budget)

    # Everything on the first device, when it fits: no split, nothing moved.
    first = devices[0]
    p = Placement(first)
    _add_embedding_and_head(p, p, sizes)
    _fill(p, sizes, all_layers, budget)
    if sizes.has_vision:
        _add_vision(p, sizes, budget)
    if p.total <= first.usable or len(devices) == 1:
        plan = DevicePlan(sizes.name, sizes.n_layers, budget, [p], first.name, first.name,
                          first.name if sizes.has_vision else None, context_length=context)
        if p.total > first.usable:
            raise _does_not_fit(plan, sizes, [], p.total - first.usable)
        return plan

    placements = [Placement(d) for d in devices]
    # The head on the first device that can hold it with the last layer (and a pass through it).
    head_p = next((p for p in placements if _holds_head(p, sizes, budget)), placements[-1])
    has_cpu = devices[-1].kind == "cpu"
    embed_p = placements[-1] if has_cpu else head_p
    _add_embedding_and_head(embed_p, head_p, sizes)
    vision_p = None
    if sizes.has_vision:
        # Whole on a GPU when it fits beside what is there already; else the CPU (or the last device).
        vision_p = next((p for p in placements if p.device.kind == "cuda"
                         and _add_vision(_copy(p), sizes, budget).total <= p.device.usable), placements[-1])
        _add_vision(vision_p, sizes, budget)

    # Greedy, device by device; layers from the last one down (the head's device takes the last).
    remaining = list(reversed(all_layers))
    plan = DevicePlan(sizes.name, sizes.n_layers, budget, placements, embed_p.name, head_p.name,
                      vision_p.name if vision_p else None, context_length=context)
    for p in placements:
        if not remaining:
            break
        d = p.device
        take = 0
        while take < len(remaining) and _with_layers(p, sizes, remaining[:take + 1], budget).total <= d.usable:
            take += 1
        if take == 0:
            one = _with_layers(p, sizes, remaining[:1], budget)
            plan.warnings.append(
                f"{d.name} can fit 0 layers: {_gib(max(d.usable - p.total, 0))} of its {_gib(d.usable)} usable left "
                f"after its share, one layer needs {_gib(one.total - p.total)} "
                f"({_gib(one.weights)} + {_mib(one.kv)} KV + {_gib(one.activations)} activations and scratch); "
                f"lower max_seq_len ({budget.max_seq_len})"
                + (f" or max_num_images ({budget.max_num_images}) / max_image_length "
                   f"({budget.max_image_length})" if sizes.has_vision else "")
                + " to use it")
            continue
        taken, remaining = remaining[:take], remaining[take:]
        _fill(p, sizes, range(min(taken), max(taken) + 1), budget)
    if remaining:
        last = placements[-1]
        short = _with_layers(last, sizes, remaining, budget).total - last.device.usable
        raise _does_not_fit(plan, sizes, remaining, short)
    return plan


def plan_for_files(model_gf, mmproj_path=None, device: str = "auto", device_map: str | None = None,
                   budget: Budget = Budget(), machine: Machine | None = None, draft_path=None) -> DevicePlan:
    """The plan for an open model GGUF (+ projector file, + a draft model's file) on this
    machine: `device` "cpu" keeps to the CPU, "auto" / "cuda" plan over the GPUs and the CPU;
    `device_map` is a manual map. A projector that cannot be read is left out (loading it
    reports why); a draft that cannot be read is an EngineError naming it (it was asked for)."""
    from ..gguf import GGUFError, open_gguf
    from ..mistral3.config import read_config

    if device.startswith("cuda"):
        from ..mistral3.text import resolve_device

        resolve_device(device)  # a clear error when no GPU is there
    machine = machine or detect_machine()
    if device == "cpu":
        machine = Machine((), machine.cpu)
    mm = None
    if mmproj_path is not None:
        try:
            mm = open_gguf(mmproj_path)
            read_config(mm)
        except (GGUFError, EngineError, OSError):
            if mm is not None:
                mm.close()
            mm = None
    try:
        sizes = sizes_of_files(model_gf, mm)
    finally:
        if mm is not None:
            mm.close()
    draft = None
    if draft_path is not None:
        with open_gguf(draft_path) as dgf:
            draft = sizes_of_files(dgf)
    return plan_devices(sizes, machine, budget, parse_device_map(device_map) if device_map else None, draft)


def _holds_head(p: Placement, sizes: ModelSizes, budget: Budget) -> bool:
    trial = _copy(p)
    trial.parts["output head + norm"] = sizes.head_bytes
    return _with_layers(trial, sizes, [sizes.n_layers - 1], budget).total <= p.device.usable


def _copy(p: Placement) -> Placement:
    return replace(p, parts=dict(p.parts))


def _with_layers(p: Placement, sizes: ModelSizes, layers: Sequence[int], budget: Budget) -> Placement:
    """p as it would be holding `layers` too (a trial: p is unchanged)."""
    return _fill(_copy(p), sizes, range(min(layers), max(layers) + 1), budget)


def _fill(p: Placement, sizes: ModelSizes, layers: range, budget: Budget) -> Placement:
    kind = p.device.kind
    p.layers = layers
    p.weights = sum(sizes.layer_bytes[i] for i in layers)
    p.kv = len(layers) * kv_bytes_per_layer(sizes, budget, p.device)
    p.activations = activation_bytes(sizes, budget, p.device) if layers else 0
    if not layers:
        return p
    logits = p.parts.get("output head + norm", 0) or p.parts.get("output norm", 0)
    logits_bytes = mem.logits_bytes(sizes.vocab) if logits else 0
    p.prefill_scratch = prefill_scratch_bytes(sizes, budget, p.device) + logits_bytes
    if kind == "cuda":
        _add_runtime(p)
        p.decode_scratch = 0  # inside the CUDA graph pool
        p.load_scratch = max(sizes.layer_bytes[i] for i in layers)  # a fused copy while loading
    else:
        bucket = context_of(sizes, budget)
        p.decode_scratch = mem.decode_scratch_bytes(sizes.n_heads, bucket, sizes.vocab if logits else 0,
                                                    sizes.row_width, p.device.value_bytes)
    return p


def _add_runtime(p: Placement, graphs: bool = True) -> None:
    """What a GPU running matmuls holds besides tensors: cuBLAS's workspace, and where layers
    run, the decode graphs' pool (captured at load)."""
    p.parts.setdefault("cuBLAS workspace", mem.CUBLAS_WORKSPACE_BYTES)
    if graphs:
        p.parts.setdefault("CUDA graph pool", mem.GRAPH_POOL_BYTES)


def _add_embedding_and_head(embed_p: Placement, head_p: Placement, sizes: ModelSizes) -> None:
    embed_p.parts["token embedding"] = sizes.embedding_bytes
    if sizes.tied and embed_p is head_p:  # one table serves both
        head_p.parts["output norm"] = sizes.head_bytes - sizes.embedding_bytes
    else:
        head_p.parts["output head + norm"] = sizes.head_bytes


def vision_tower_bytes(sizes: ModelSizes, device_kind: str, cpu_bf16: bool = False, gpu_bf16: bool = True) -> int:
    """The tower's weights as kept there. On a CPU whose tower runs the bf16 path (`cpu_bf16`,
    see cpu_tower_runs_bf16) every matmul matrix dequantized / converted once to bf16, 2 bytes a
    value, the file's pages given back, plus the row-reordered copies the loader keeps for exact
    mode; on another CPU, or a file that keeps float32 there, the file's bytes (its float32 and
    int8 paths read the weights in place); on a GPU float matrices in the tower's dtype: bf16
    where the GPU has it (`gpu_bf16`, see gpu_tower_runs_bf16), else float32 (vision.tower_dtype)."""
    if device_kind == "cpu":
        if not (cpu_bf16 and sizes.vision_bf16_values):
            return sizes.vision_bytes
        return mem.vision_tower_bytes(sizes.vision_bytes, sizes.vision_bf16_values, sizes.vision_bf16_bytes,
                                      BF16_BYTES) + sizes.vision_copied_bytes
    return mem.vision_tower_bytes(sizes.vision_bytes, sizes.vision_float_values, sizes.vision_float_bytes,
                                  BF16_BYTES if gpu_bf16 else F32_BYTES)


def cpu_tower_runs_bf16(device: DeviceInfo) -> bool:
    """Whether the vision tower loaded on `device` takes the CPU's bf16 path: a CPU with bf16 dot
    products, outside exact mode (the loader's default, VisionTower.load)."""
    from ...kernels.linear import is_cpu_exact  # torch: only once a tower is planned

    return device.kind == "cpu" and device.bf16_dot and not is_cpu_exact()


def gpu_tower_runs_bf16(device: DeviceInfo) -> bool:
    """Whether the vision tower loaded on GPU `device` multiplies in bf16: the question
    vision.tower_dtype asks of the GPU itself (host.cuda_has_bf16), asked of its capability;
    a GPU whose capability is not known (simulated) is taken to have bf16."""
    return device.kind == "cuda" and (device.capability is None or host.cuda_has_bf16(device.capability))


def _add_vision(p: Placement, sizes: ModelSizes, budget: Budget) -> Placement:
    p.parts["vision tower"] = vision_tower_bytes(sizes, p.device.kind, cpu_tower_runs_bf16(p.device),
                                                 gpu_tower_runs_bf16(p.device))
    p.vision_activations = vision_activation_bytes(sizes, budget, p.device.kind)
    if p.device.kind == "cuda":
        _add_runtime(p, graphs=False)
    return p


def draft_parts(draft: ModelSizes, context: int, device: DeviceInfo) -> dict[str, int]:
    """What a draft model keeps on `device` (runtime/draft.py's DraftModel.load): its weights as
    stored, a KV pool of `context` positions (the target's context: the loader's `positions`),
    and on a GPU the decode graphs its pool captures."""
    kv = mem.kv_bytes(context, draft.kv_width, draft.n_layers, kv_value_bytes(device, DRAFT_KV_TYPE))
    head = draft.head_bytes - (draft.embedding_bytes if draft.tied else 0)  # a tied table is held once
    parts = {"draft model": sum(draft.layer_bytes) + draft.embedding_bytes + head, "draft KV": kv}
    if device.kind == "cuda":
        parts["draft CUDA graph pool"] = mem.GRAPH_POOL_BYTES
    return parts


def draft_scratch_bytes(draft: ModelSizes, context: int, device: DeviceInfo) -> int:
    """The draft's own pass at its peak: a prompt chunk (rows and attention state; draft.py asks
    no logits of it) or a decode step (a row, the scores, the logits), whichever is larger."""
    rows = mem.prefill_rows(context, device.kind)
    prefill = (mem.prefill_activation_bytes(rows, draft.row_width, device.value_bytes)
               + mem.attention_scratch_bytes(rows, draft.n_heads, draft.head_dim))
    decode = mem.decode_scratch_bytes(draft.n_heads, context, draft.vocab, draft.row_width, device.value_bytes)
    return max(prefill, decode)


def _with_draft(p: Placement, draft: ModelSizes, context: int) -> Placement:
    p.parts.update(draft_parts(draft, context, p.device))
    p.draft_scratch = draft_scratch_bytes(draft, context, p.device)
    if p.device.kind == "cuda":
        _add_runtime(p, graphs=False)
    return p


def _place_draft(plan: DevicePlan, sizes: ModelSizes, draft: ModelSizes, machine: Machine) -> None:
    """The draft model whole on one device, after the target is placed (the target's layers come
    first on a GPU): beside the output head (its drafts are read there) when it fits, else the
    CPU (added to the plan if it held nothing). Neither: PlanError naming both models (a manual
    map: a warning, as for its layers)."""
    context = plan.context_length
    order = [p for p in plan.placements if p.name == plan.head_device]
    cpu = next((p for p in plan.placements if p.device.kind == "cpu"), None)
    if cpu is None and machine.cpu is not None and machine.cpu in machine.devices:
        cpu = Placement(machine.cpu)
    if cpu is not None and cpu not in order:
        order.append(cpu)
    for p in order:
        trial = _with_draft(_copy(p), draft, context)
        if trial.total <= p.device.usable or (plan.manual and p is order[-1]):
            if trial.total > p.device.usable:
                plan.warnings.append(f"{p.name} is asked to hold {_gib(trial.total)} with the draft model "
                                     f"{draft.name}, more than its {_gib(p.device.usable)} usable: "
                                     f"loading may run out of memory")
            _with_draft(p, draft, context)
            if p not in plan.placements:
                plan.placements.append(p)
            plan.draft, plan.draft_device = draft.name, p.name
            return
    need = sum(draft_parts(draft, context, order[0].device).values())
    room = ", ".join(f"{p.name} {_gib(max(p.device.usable - p.total, 0))}" for p in order)
    raise PlanError(f"the draft model {draft.name} does not fit beside {sizes.name} with a {context}-token "
                    f"context: it needs {_gib(need)} (weights and KV) and the devices have {room} left; "
                    f"use a smaller draft or quantization, lower the context length, or turn the draft off")


def _does_not_fit(plan: DevicePlan, sizes: ModelSizes, remaining: Sequence[int], short: int) -> PlanError:
    where = " + ".join(f"{p.name} {_gib(p.device.usable)}" for p in plan.placements)
    what = (f"{len(remaining)} of {sizes.n_layers} layers ({_gib(short)} short) are left over"
            if remaining else f"it needs {_gib(short)} more")
    return PlanError(f"{sizes.name} does not fit this machine with a {plan.context_length}-token context: "
                     f"{what} after filling every device (usable: {where}); use a smaller quantization, "
                     f"or lower the context length (max_seq_len {plan.budget.max_seq_len})")


def _manual_plan(sizes: ModelSizes, machine: Machine, budget: Budget,
                 manual: Sequence[tuple[str, int]]) -> DevicePlan:
    counts = [(canonical_device(d), int(c)) for d, c in manual]
    text = ",".join(f"{d}={c}" for d, c in counts)
    if sum(c for _, c in counts) != sizes.n_layers:
        raise PlanError(f"device map '{text}' places {sum(c for _, c in counts)} layers; "
                        f"{sizes.name} has {sizes.n_layers}")
    placements, start = [], 0
    for name, count in counts:
        dev = machine.find(name)
        if dev is None:
            raise PlanError(f"device map '{text}': this machine has no {name} "
                            f"(devices: {', '.join(d.name for d in machine.devices)})")
        placements.append(Placement(dev))
        start += count
    with_layers = [i for i, (_, c) in enumerate(counts) if c] or [0]
    embed_p, head_p = placements[with_layers[0]], placements[with_layers[-1]]  # no boundary beyond the layers' own
    _add_embedding_and_head(embed_p, head_p, sizes)
    start = 0
    for p, (_, count) in zip(placements, counts):
        _fill(p, sizes, range(start, start + count), budget)
        start += count
    vision_p = None
    if sizes.has_vision:
        vision_p = next((p for p in placements if p.device.kind == "cuda"
                         and _add_vision(_copy(p), sizes, budget).total <= p.device.usable), placements[-1])
        _add_vision(vision_p, sizes, budget)
    plan = DevicePlan(sizes.name, sizes.n_layers, budget, placements, embed_p.name, head_p.name,
                      vision_p.name if vision_p else None, manual=True, context_length=context_of(sizes, budget))
    for p in placements:
        if p.total > p.device.usable:
            plan.warnings.append(f"{p.name} is asked to hold {_gib(p.total)}, more than its "
                                 f"{_gib(p.device.usable)} usable: loading may run out of memory")
    return plan


__all__ = ["Budget", "DeviceInfo", "Machine", "ModelSizes", "Placement", "DevicePlan", "PlanError",
           "detect_machine", "model_sizes", "sizes_of_files", "plan_devices", "plan_for_files", "parse_device_map",
           "gpu_layers_map", "kv_bytes_per_layer", "kv_value_bytes", "vision_tower_bytes", "cpu_tower_runs_bf16", "gpu_tower_runs_bf16",
           "activation_bytes", "draft_parts", "draft_scratch_bytes",
           "vision_activation_bytes", "image_patches", "context_of", "prefill_scratch_bytes", "STAGES"]
