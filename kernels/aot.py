"""Triton kernels compiled ahead of time, launched without a C compiler.

Triton's own launcher is a C extension it builds at the first launch with the system C compiler
and Python.h, which a user's machine (or the bundle) may not have. Here the kernels are compiled
at package time (kernels/aot_build.py: every spec of every kernel module's COMPILE_SPECS, for
each target in TARGETS) into cubins plus a manifest, and launched through the CUDA driver API
(libcuda, loaded with ctypes: cuModuleLoadData, cuModuleGetFunction, cuFuncSetAttribute,
cuLaunchKernel on torch's current stream). The driver's C ABI is stable across driver versions,
so no binding pinned to one CUDA major version is needed. Nothing here runs a compiler.

A spec is one specialization a real launch uses: the runtime arguments' Triton types ("*bf16",
"*u8", "i32", "fp32"), the constexpr values, the arguments that are multiples of 16 (pointers:
16-byte aligned; ints: divisible by 16 - only where every launch of that spec has it), num_warps
and compile options. A launch uses an artifact whose types, constexprs, num_warps and options
are equal and whose divisibility claims all hold for the actual arguments (the most claims
wins); a claim that does not hold is never used, so an artifact is never run on arguments it
was not compiled for.

Which target serves a device (compute capability major.minor, cc = 10*major + minor):
  * the exact cc when it was built;
  * else, below 9.0 only, the highest built cc of the same major that is lower (SASS of sm_80
    runs on 8.6/8.7/8.9, sm_86 on 8.9; never across majors);
  * from 9.0 on, exact only: Triton builds the arch-specific sm_90a / sm_100a / sm_120a, which
    run on exactly that cc (so 10.3 or 12.1 get no artifact).
Nothing fits (or the driver rejects the cubins): one log line, and `linear` takes the torch path.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..env import read_env

log = logging.getLogger("tramontane.kernels")

# compute capabilities built at package time and in CI (GPUTarget("cuda", cc, 32))
TARGETS = (75, 80, 86, 89, 90, 100, 120)
MANIFEST = "manifest.json"
FORMAT = 1
DEFAULT_DIR = Path(__file__).resolve().parent / "aot_cubins"  # where the bundle puts them

# Triton's NVIDIA backend appends two pointer parameters to every kernel (this Triton: 3.x,
# backends/nvidia/driver.py passes global_scratch and profile_scratch after the user's args).
HIDDEN_POINTER_PARAMS = ("global_scratch", "profile_scratch")

_TORCH_TO_TRITON = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
    torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.bool: "i1",
}
# scalar argument types -> (ctypes type, PTX parameter type)
# (only the widths whose fit _arg_class below decides: launches are cached by it)
_SCALARS = {
    "i1": (ctypes.c_int8, "u8"),
    "i32": (ctypes.c_int32, "u32"), "u32": (ctypes.c_uint32, "u32"),
    "i64": (ctypes.c_int64, "u64"), "u64": (ctypes.c_uint64, "u64"),
    "fp32": (ctypes.c_float, "f32"), "f32": (ctypes.c_float, "f32"), "fp64": (ctypes.c_double, "f64"),
}
_INT_RANGES = {"i32": (-(1 << 31), 1 << 31), "u32": (0, 1 << 32), "i64": (-(1 << 63), 1 << 63),
               "u64": (0, 1 << 64), "i1": (0, 2)}


class AotError(RuntimeError):
    """An artifact cannot be used (missing, malformed, rejected by the driver)."""


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class KernelSpec:
    """One specialization of one kernel, as its module's COMPILE_SPECS lists it.

    kernel: the @triton.jit function (or "module:name"); types: Triton type of every runtime
    argument (name -> "*bf16" / "i32" / ...); constexprs: value of every constexpr argument;
    divisible: arguments that are multiples of 16 in EVERY launch this spec serves; min_cc /
    max_cc: the targets it applies to (e.g. bf16 tl.dot needs 80)."""
    kernel: object
    types: dict
    constexprs: dict
    divisible: tuple = ()
    num_warps: int = 4
    num_stages: int = 3
    options: dict = field(default_factory=dict)
    min_cc: int = 0
    max_cc: int = 10_000

    def applies_to(self, cc: int) -> bool:
        return self.min_cc <= cc <= self.max_cc

    @classmethod
    def of(cls, d) -> "KernelSpec":
        """A KernelSpec from a COMPILE_SPECS entry: a KernelSpec, or a dict with kernel,
        constexprs, either types (runtime arguments) or signature (every argument, constexprs
        as "constexpr"), either divisible or aligned, and optionally num_warps, num_stages,
        options, min_cc, max_cc (name: a label, ignored). Specs with a bf16 argument default to
        min_cc 80: the engine computes in fp16 below sm_80 (no bf16 units there)."""
        if isinstance(d, cls):
            return d
        d = dict(d)
        d.pop("name", None)
        if "signature" in d:
            d["types"] = {n: t for n, t in d.pop("signature").items() if t != "constexpr"}
        if "aligned" in d:
            d["divisible"] = d.pop("aligned")
        d["divisible"] = tuple(d.get("divisible", ()))
        if "min_cc" not in d and any("bf16" in t for t in d["types"].values()):
            d["min_cc"] = 80
        return cls(**d)


def kernel_id(kernel) -> str:
    """'qmatmul._decode_kernel': the module's last component and the function name (the same
    whether the package is imported as tramontane.kernels or from a bundle)."""
    if isinstance(kernel, str):
        return kernel
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


def arg_names(kernel) -> list[str]:
    names = getattr(kernel, "arg_names", None)
    if names is not None:
        return list(names)
    return list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)


def full_signature(kernel, spec: KernelSpec) -> dict[str, str]:
    """Every argument in the kernel's order: its type, or "constexpr". Checks the spec names
    each argument exactly once."""
    names = arg_names(kernel)
    unknown = (set(spec.types) | set(spec.constexprs)) - set(names)
    both = set(spec.types) & set(spec.constexprs)
    missing = [n for n in names if n not in spec.types and n not in spec.constexprs]
    bad_div = set(spec.divisible) - set(spec.types)
    if unknown or both or missing or bad_div:
        raise ValueError(f"COMPILE_SPECS entry for {kernel_id(kernel)} does not match its arguments: "
                         f"unknown {sorted(unknown)}, both typed and constexpr {sorted(both)}, "
                         f"missing {missing}, divisible but not a runtime argument {sorted(bad_div)}")
    return {n: spec.types.get(n, "constexpr") for n in names}


def spec_key(spec: KernelSpec) -> dict:
    """The JSON-able identity of a spec (what the manifest stores and launches match on)."""
    return {"kernel": kernel_id(spec.kernel), "types": dict(spec.types),
            "constexprs": dict(spec.constexprs), "divisible": sorted(spec.divisible),
            "num_warps": spec.num_warps, "num_stages": spec.num_stages, "options": dict(spec.options)}


# ----------------------------------------------------------------------------- manifest


@dataclass
class Artifact:
    """One compiled kernel for one target, as the manifest describes it."""
    kernel: str
    cc: int
    types: dict           # runtime argument name -> Triton type, in the kernel's order
    constexprs: dict
    divisible: frozenset
    num_warps: int
    num_stages: int
    options: dict
    shared: int           # dynamic shared memory bytes to launch with
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    ptx_params: list      # PTX parameter types of the compiled entry ("u64", "u32", ...)
    name: str             # the entry's symbol in the cubin
    path: Path
    regs: int | None = None
    spill_bytes: int | None = None

    @property
    def param_types(self) -> list[str]:
        return list(self.types.values())


_REQUIRED = ("kernel", "cc", "types", "constexprs", "divisible", "num_warps", "options", "shared",
             "global_scratch_size", "profile_scratch_size", "ptx_params", "name", "file")


def parse_manifest(folder: Path) -> list[Artifact]:
    """The artifacts listed in folder/manifest.json. A malformed manifest is one AotError naming
    the file and what is wrong."""
    path = Path(folder) / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AotError(f"{path}: no manifest (the ahead-of-time kernels were not built)") from None
    except (OSError, ValueError) as exc:
        raise AotError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("artifacts"), list):
        raise AotError(f"{path}: not a format-{FORMAT} manifest of ahead-of-time Triton kernels")
    out = []
    for i, e in enumerate(doc["artifacts"]):
        missing = [k for k in _REQUIRED if not isinstance(e, dict) or k not in e]
        if missing:
            raise AotError(f"{path}: artifact {i} lacks {missing}")
        if not isinstance(e["types"], list):  # [name, type] pairs: the kernel's parameter order
            raise AotError(f"{path}: artifact {i} ({e['kernel']}): types must be a list of [name, type]")
        for _, t in e["types"]:
            if not (t.startswith("*") or t in _SCALARS):
                raise AotError(f"{path}: artifact {i} ({e['kernel']}) has an argument of type {t!r}, "
                               "which this launcher cannot pass")
        out.append(Artifact(
            kernel=e["kernel"], cc=int(e["cc"]), types=dict(e["types"]), constexprs=dict(e["constexprs"]),
            divisible=frozenset(e["divisible"]), num_warps=int(e["num_warps"]),
            num_stages=int(e.get("num_stages", 3)), options=dict(e["options"]),
            shared=int(e["shared"]), global_scratch_size=int(e["global_scratch_size"]),
            global_scratch_align=int(e.get("global_scratch_align", 1)),
            profile_scratch_size=int(e["profile_scratch_size"]),
            profile_scratch_align=int(e.get("profile_scratch_align", 1)),
            ptx_params=list(e["ptx_params"]), name=e["name"], path=Path(folder) / e["file"],
            regs=e.get("regs"), spill_bytes=e.get("spill_bytes")))
    return out


def select_target(cc: int, built) -> int | None:
    """The built target that runs on a device of compute capability cc (rule: module docstring)."""
    built = set(built)
    if cc in built:
        return cc
    if cc >= 90:
        return None
    same_major = [t for t in built if t // 10 == cc // 10 and t < cc]
    return max(same_major) if same_major else None


# ----------------------------------------------------------------------------- argument packing


def triton_type(value) -> str | None:
    """The Triton type a launch argument gets (as Triton's JIT types it)."""
    if isinstance(value, torch.Tensor):
        t = _TORCH_TO_TRITON.get(value.dtype)
        return "*" + t if t else None
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(1 << 31) <= value < (1 << 31) else "i64" if value < (1 << 63) else "u64"
    if isinstance(value, float):
        return "fp32"
    return None


def _fits(t: str, value) -> bool:
    """Can this runtime value be passed as an argument of Triton type t?"""
    if t.startswith("*"):
        return isinstance(value, torch.Tensor) and triton_type(value) == t
    if t in ("fp32", "f32", "fp64"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, bool):
        return t == "i1"
    lo, hi = _INT_RANGES.get(t, (0, 0))
    return isinstance(value, int) and lo <= value < hi


def _divisible(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def matches(art: Artifact, args: dict, constexprs: dict, num_warps: int, options: dict,
            num_stages: int = 3) -> bool:
    """May this artifact run this launch? (types, constexprs, warps, stages, options equal; every
    divisibility claim true for the actual argument)"""
    if (art.num_warps != num_warps or art.num_stages != num_stages or art.constexprs != constexprs
            or art.options != options):
        return False
    if set(art.types) != set(args):
        return False
    return (all(_fits(t, args[n]) for n, t in art.types.items())
            and all(_divisible(args[n]) for n in art.divisible))


def _arg_class(v) -> tuple:
    """Everything `matches` asks of an argument (type, which int widths it fits, multiple of
    16): launches with equal classes pick the same artifact, so the pick is cached by them."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    if isinstance(v, bool):
        return ("b",)
    if isinstance(v, int):
        return ("i", -(1 << 31) <= v < (1 << 31), v >= 0, v < (1 << 32), v < (1 << 63), v % 16 == 0)
    return (type(v),)


def ctypes_of(t: str):
    return ctypes.c_void_p if t.startswith("*") else _SCALARS[t][0]


def ptx_param_of(t: str) -> str:
    return "u64" if t.startswith("*") else _SCALARS[t][1]


def check_layout(art: Artifact) -> None:
    """The compiled entry takes exactly our arguments then Triton's hidden pointers (the packing
    is checked against the kernel itself, not against what we assume Triton does)."""
    expected = [ptx_param_of(t) for t in art.param_types] + ["u64"] * len(HIDDEN_POINTER_PARAMS)
    if expected != art.ptx_params:
        raise AotError(f"{art.path.name}: the compiled {art.kernel} takes parameters {art.ptx_params}, "
                       f"the launcher would pass {expected}")


def pack_args(art: Artifact, args: dict, scratch: tuple = (None, None)) -> tuple[list, ctypes.Array]:
    """ctypes values for each kernel parameter (user arguments in the kernel's order, then the
    scratch pointers) and the void* array cuLaunchKernel takes. Returns both: the values must
    stay alive until the launch call returns."""
    values = []
    for name, t in art.types.items():
        v = args[name]
        if t.startswith("*"):
            values.append(ctypes.c_void_p(v.data_ptr()))
        else:
            values.append(ctypes_of(t)(v))
    for ptr in scratch:
        values.append(ctypes.c_void_p(ptr or 0))
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    return values, params


# ----------------------------------------------------------------------------- driver


_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class _Driver:
    """The few CUDA driver calls the launcher makes, through libcuda (ctypes: no compiler)."""

    def __init__(self):
        name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise AotError(f"the CUDA driver library {name} cannot be loaded ({exc})") from None
        p, i, u, vp = ctypes.POINTER, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
        for fn, args in {
            "cuGetErrorName": [i, p(ctypes.c_char_p)],
            "cuCtxGetCurrent": [p(vp)], "cuCtxSetCurrent": [vp],
            "cuDeviceGet": [p(i), i], "cuDevicePrimaryCtxRetain": [p(vp), i],
            "cuDeviceGetAttribute": [p(i), i, i],
            "cuModuleLoadData": [p(vp), ctypes.c_char_p], "cuModuleGetFunction": [p(vp), vp, ctypes.c_char_p],
            "cuFuncGetAttribute": [p(i), i, vp], "cuFuncSetAttribute": [vp, i, i],
            "cuLaunchKernel": [vp, u, u, u, u, u, u, u, vp, p(vp), p(vp)],
        }.items():
            f = getattr(lib, fn)
            f.argtypes, f.restype = args, ctypes.c_int
        self.lib = lib

    def check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            raise AotError(f"{what}: {(name.value or b'CUDA error').decode()} ({result})")

    def ensure_context(self, device: int) -> None:
        """torch makes the device's primary context current; Triton's launcher checks the same."""
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load(self, art: Artifact, device: int) -> int:
        """The CUfunction of the artifact's entry, in the device's context, its shared memory set."""
        self.ensure_context(device)
        image = art.path.read_bytes()
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), f"loading {art.path.name}")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, art.name.encode()),
                   f"{art.path.name}: entry {art.name}")
        if art.shared > 48 * 1024:  # above 48 KB a kernel must opt in to its dynamic shared memory
            optin, static = ctypes.c_int(), ctypes.c_int()
            self.check(self.lib.cuDeviceGetAttribute(
                ctypes.byref(optin), _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device), "shared memory")
            self.check(self.lib.cuFuncGetAttribute(ctypes.byref(static), _CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                       "shared memory")
            if art.shared + static.value > optin.value:
                raise AotError(f"{art.kernel} needs {art.shared} bytes of shared memory, the device has {optin.value}")
            self.check(self.lib.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   optin.value - static.value), "shared memory")
        return fn.value

    def launch(self, fn: int, grid: tuple, num_warps: int, shared: int, stream: int, params) -> None:
        self.check(self.lib.cuLaunchKernel(fn, grid[0], grid[1], grid[2], 32 * num_warps, 1, 1, shared,
                                           stream, params, None), "cuLaunchKernel")


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver:
    return _Driver()


# ----------------------------------------------------------------------------- the launcher


def artifact_dir() -> Path:
    return read_env().triton_aot_dir or DEFAULT_DIR


class Launcher:
    """The artifacts of one folder for one target; picks and launches them."""

    def __init__(self, artifacts: list[Artifact], cc: int):
        self.cc = cc
        self.by_kernel: dict[str, list[Artifact]] = {}
        for art in artifacts:
            if art.cc == cc:
                check_layout(art)
                self.by_kernel.setdefault(art.kernel, []).append(art)
        self._functions: dict[tuple, int] = {}  # (cubin path, entry, device) -> its loaded CUfunction
        self._picked: dict[tuple, Artifact] = {}

    def driver_accepts(self, device: int) -> bool:
        """Does this device's driver load our cubins? Tried once with one of them before any
        kernel runs (an older driver may refuse a newer ptxas's cubins): else one log line, and
        the caller takes the torch path instead of failing mid-reply."""
        art = next((a for arts in self.by_kernel.values() for a in arts), None)
        if art is None:
            return False
        try:
            self._functions[(art.path, art.name, device)] = _driver().load(art, device)
        except AotError as exc:
            _report_once(("load", self.cc, device), f"tramontane: the GPU driver does not load the ahead-of-time "
                                                    f"kernels for sm_{self.cc} ({exc}); quantized matmuls use the "
                                                    "slower torch path")
            return False
        return True

    def pick(self, kernel, args: dict, constexprs: dict, num_warps: int, options: dict,
             num_stages: int = 3) -> Artifact:
        kid = kernel_id(kernel)
        key = (kid, tuple((n, _arg_class(v)) for n, v in args.items()), tuple(constexprs.items()),
               num_warps, num_stages, tuple(sorted(options.items())))
        art = self._picked.get(key)
        if art is None:
            art = self._picked[key] = self._pick(kid, args, constexprs, num_warps, options, num_stages)
        return art

    def _pick(self, kid, args: dict, constexprs: dict, num_warps: int, options: dict, num_stages: int) -> Artifact:
        candidates = [a for a in self.by_kernel.get(kid, ())
                      if matches(a, args, constexprs, num_warps, options, num_stages)]
        if not candidates:
            shown = {n: (triton_type(v), _divisible(v)) for n, v in args.items()}
            raise AotError(f"no ahead-of-time build of {kid} for sm_{self.cc} with constexprs {constexprs}, "
                           f"num_warps {num_warps}, options {options}, arguments (type, multiple of 16) {shown}: "
                           "its module's COMPILE_SPECS lacks this launch")
        return max(candidates, key=lambda a: len(a.divisible))

    def launch_call(self, kernel, grid, args: tuple, kwargs: dict, device: int, stream: int) -> None:
        """kernel[grid](*args, **kwargs) on `device`'s `stream`, constexprs told apart by the
        manifest's names."""
        built = self.by_kernel.get(kernel_id(kernel))
        if not built:
            raise AotError(f"no ahead-of-time build of {kernel_id(kernel)} for sm_{self.cc}")
        runtime, constexprs, options = split_launch_args(kernel, args, kwargs, built[0].constexprs)
        num_warps, num_stages = options.pop("num_warps", 4), options.pop("num_stages", 3)
        if callable(grid):
            grid = grid({**runtime, **constexprs})
        self.launch(kernel, grid, runtime, constexprs, num_warps, options, num_stages, device, stream)

    def launch(self, kernel, grid, args: dict, constexprs: dict, num_warps: int, options: dict,
               num_stages: int, device: int, stream: int) -> None:
        art = self.pick(kernel, args, constexprs, num_warps, options, num_stages)
        fn = self._functions.get((art.path, art.name, device))
        if fn is None:
            fn = self._functions[(art.path, art.name, device)] = _driver().load(art, device)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if grid[0] * grid[1] * grid[2] == 0:
            return  # nothing to do (as Triton's launcher: the driver rejects an empty grid)
        keep, scratch = [], []
        for size, align in ((art.global_scratch_size, art.global_scratch_align),
                            (art.profile_scratch_size, art.profile_scratch_align)):
            if size:  # per-program scratch, as Triton's launcher allocates it (torch: 256-byte aligned)
                buf = torch.empty(grid[0] * grid[1] * grid[2] * size + align, dtype=torch.uint8, device="cuda")
                keep.append(buf)
                scratch.append(buf.data_ptr() + (-buf.data_ptr()) % align)
            else:
                scratch.append(None)
        values, params = pack_args(art, args, tuple(scratch))
        _driver().launch(fn, grid, art.num_warps, art.shared, stream, params)
        del values, keep


_launchers: dict[int, Launcher | None] = {}
_reported: set = set()


def _report_once(key, message: str) -> None:
    if key not in _reported:
        _reported.add(key)
        log.warning("%s", message)


def launcher_for(cc: int, folder: Path | None = None) -> Launcher | None:
    """The launcher for devices of this compute capability, or None (reported once, one line)."""
    if cc in _launchers:
        return _launchers[cc]
    folder = Path(folder or artifact_dir())
    launcher = None
    try:
        artifacts = parse_manifest(folder)
        target = select_target(cc, {a.cc for a in artifacts})
        if target is None:
            built = ", ".join(f"sm_{t}" for t in sorted({a.cc for a in artifacts})) or "none"
            _report_once(("cc", cc), f"tramontane: no ahead-of-time GPU kernels for compute capability "
                                     f"{cc // 10}.{cc % 10} (built: {built}); quantized matmuls use the "
                                     "slower torch path")
        else:
            launcher = Launcher(artifacts, target)
    except AotError as exc:
        _report_once(("dir", str(folder)), f"tramontane: ahead-of-time GPU kernels unusable ({exc}); "
                                           "quantized matmuls use the slower torch path")
    _launchers[cc] = launcher
    return launcher


def current_device_and_stream() -> tuple[int, int]:
    """The current CUDA device's index and torch's current stream on it (a CUstream handle)."""
    return torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream


@functools.lru_cache(maxsize=None)
def device_cc(index: int) -> int:
    """10 * major + minor of CUDA device `index` (cached: every launch asks)."""
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


_available: dict[int, bool] = {}


def available(device: torch.device) -> bool:
    """Can kernels run ahead-of-time compiled on this CUDA device? (asked per matmul: cached)"""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else current_device_and_stream()[0]
    ok = _available.get(index)
    if ok is None:
        launcher = launcher_for(device_cc(index))
        ok = launcher is not None and launcher.driver_accepts(index)
        _available[index] = ok
    return ok


def split_launch_args(kernel, args: tuple, kwargs: dict, constexpr_names) -> tuple[dict, dict, dict]:
    """(runtime arguments, constexprs, launch options) of a `kernel[grid](*args, **kwargs)` call,
    by the kernel's argument names; num_warps / num_stages are among the options."""
    names = arg_names(kernel)
    if len(args) > len(names):
        raise TypeError(f"{kernel_id(kernel)} takes {len(names)} arguments, {len(args)} given")
    bound = dict(zip(names, args))
    options = {}
    for k, v in kwargs.items():
        (bound if k in names else options)[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"{kernel_id(kernel)}: arguments {missing} not given")
    runtime = {n: bound[n] for n in names if n not in constexpr_names}
    constexprs = {n: bound[n] for n in names if n in constexpr_names}
    return runtime, constexprs, options


def launch(kernel, grid, args: tuple, kwargs: dict) -> None:
    """`kernel[grid](*args, **kwargs)` through the ahead-of-time artifacts of the current device,
    on torch's current stream (both asked once a launch: each is a call into torch)."""
    device, stream = current_device_and_stream()
    launcher = launcher_for(device_cc(device))
    if launcher is None:
        raise AotError("no ahead-of-time kernels for this GPU (callers check triton_usable first)")
    launcher.launch_call(kernel, grid, args, kwargs, device, stream)


def check_folder(folder: Path, targets=TARGETS) -> str:
    """A built folder is complete and loadable: manifest parses, every cubin is there and is
    an ELF image, every launch layout fits its entry, every target has kernels. Returns a
    one-line summary; raises AotError naming the first problem. (scripts/package_smoke.sh
    runs it on the bundle's copy.)"""
    artifacts = parse_manifest(folder)
    for art in artifacts:
        if not art.path.is_file():
            raise AotError(f"{art.path}: listed in the manifest but missing")
        if art.path.read_bytes()[:4] != b"\x7fELF":
            raise AotError(f"{art.path}: not a cubin (ELF) image")
        check_layout(art)
    missing = sorted(set(targets) - {a.cc for a in artifacts})
    if missing:
        raise AotError(f"{folder}: no kernels for {', '.join(f'sm_{t}' for t in missing)}")
    kernels = sorted({a.kernel for a in artifacts})
    return (f"{len(artifacts)} cubins, {len(kernels)} kernels ({', '.join(kernels)}), targets "
            + ", ".join(f"sm_{t}" for t in sorted({a.cc for a in artifacts})))


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="check a folder of ahead-of-time Triton kernels")
    p.add_argument("folder", type=Path)
    p.add_argument("--targets", default=",".join(map(str, TARGETS)))
    a = p.parse_args()
    try:
        print(check_folder(a.folder, [int(t) for t in a.targets.split(",") if t]))
    except AotError as exc:
        print(f"aot check failed: {exc}", file=sys.stderr)
        sys.exit(1)
