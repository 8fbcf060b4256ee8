"""Compile every Triton kernel ahead of time: each spec of the kernel modules' COMPILE_SPECS for
each target in aot.TARGETS, with Triton's compiler and its bundled ptxas (no GPU needed).

    python -m tramontane.kernels.aot_build --out DIR [--targets 80,90] [--jobs N] [--subset]

writes DIR/sm_<cc>/<kernel>-<hash>.cubin, DIR/manifest.json (what kernels/aot.py loads) and
DIR/resources.md (registers, local memory = spills, shared memory per kernel and target, read
from the cubins with Triton's cuobjdump). Packaging runs it (packaging/tramontane.spec); CI runs
--subset (tests/kernels/test_compile.py). Compiles in parallel processes; Triton's own cache
(TRITON_CACHE_DIR) makes a second run fast. Must run without TRITON_INTERPRET (the kernels have
to be decorated for the compiler, not the interpreter); the command line removes it.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL_MODULES = ("qmatmul", "attention")
PACKAGE = __package__ or "tramontane.kernels"


# ----------------------------------------------------------------------------- specs


def collect_specs(modules=KERNEL_MODULES) -> dict[str, list]:
    """module name -> its KernelSpecs (COMPILE_SPECS: KernelSpec objects or dicts of its fields)."""
    import triton  # noqa: F401 - first: triton_compat then decorates the kernels for Triton

    from .aot import KernelSpec

    out = {}
    for name in modules:
        try:
            mod = importlib.import_module(f"{PACKAGE}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{PACKAGE}.{name}":
                raise
            continue  # that kernel module does not exist (yet)
        specs = getattr(mod, "COMPILE_SPECS", None)
        if specs is None:
            raise SystemExit(f"aot_build: {mod.__file__} has Triton kernels but no COMPILE_SPECS")
        out[name] = [KernelSpec.of(s) for s in specs]
    return out


def subset(specs: list, targets) -> list[tuple]:
    """The CI subset, as (spec, cc) pairs: on every target, every kernel function with each of
    its constexpr tile configs (QTYPE aside) once; and every (kernel, QTYPE) once, on the
    targets in turn. The package build compiles everything (specs x targets)."""
    from .aot import kernel_id

    out, seen = [], set()
    for cc in targets:
        for s in specs:
            if not s.applies_to(cc):
                continue
            key = (cc, kernel_id(s.kernel), tuple(sorted((k, v) for k, v in s.constexprs.items() if k != "QTYPE")))
            if key not in seen:
                seen.add(key)
                out.append((s, cc))
    turn = 0
    for s in specs:
        key = (kernel_id(s.kernel), s.constexprs.get("QTYPE"))
        if key in seen:
            continue
        usable = [cc for cc in targets if s.applies_to(cc)]
        if usable:
            seen.add(key)
            cc = usable[turn % len(usable)]
            turn += 1
            if not any(x is s and c == cc for x, c in out):
                out.append((s, cc))
    return out


# ----------------------------------------------------------------------------- one compile


_PARAM = re.compile(r"\.param\s+\.(\w+)")


def ptx_params(ptx: str, name: str) -> list[str]:
    """Parameter types of the PTX entry `name` ("u64", "u32", ...), in order."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise RuntimeError(f"no .entry {name} in the PTX")
    return _PARAM.findall(m.group(1))


def resource_usage(cubin: bytes) -> dict:
    """{"regs", "spill_bytes", "shared_static"} of the cubin's one function, from Triton's cuobjdump
    (local memory: per-thread bytes; Triton kernels have no local arrays, so it is spills)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out))
    return {"regs": int(fields.get("REG", -1)), "spill_bytes": int(fields.get("LOCAL", 0)) + int(fields.get("STACK", 0)),
            "shared_static": int(fields.get("SHARED", 0))}


def compile_spec(spec, cc: int) -> dict:
    """Compile one spec for one target: the manifest entry (without "file") and the cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .aot import HIDDEN_POINTER_PARAMS, full_signature, kernel_id, spec_key

    kernel = spec.kernel
    sig = full_signature(kernel, spec)
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in spec.divisible}
    src = ASTSource(kernel, sig, constexprs=dict(spec.constexprs), attrs=attrs)
    t0 = time.perf_counter()
    k = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                       options={"num_warps": spec.num_warps, "num_stages": spec.num_stages, **spec.options})
    seconds = time.perf_counter() - t0
    md = k.metadata
    if md.num_ctas != 1 or md.launch_pdl or md.launch_cooperative_grid:
        raise RuntimeError(f"{kernel_id(kernel)}: clusters / PDL / cooperative launches are not supported "
                           "by the ahead-of-time launcher")
    params = ptx_params(k.asm["ptx"], md.name)
    if len(params) != len(spec.types) + len(HIDDEN_POINTER_PARAMS):
        raise RuntimeError(f"{kernel_id(kernel)}: the compiled entry has {len(params)} parameters, expected "
                           f"{len(spec.types)} arguments + {len(HIDDEN_POINTER_PARAMS)} scratch pointers")
    cubin = k.asm["cubin"]
    k.module = None  # never loaded: keeps CompiledKernel.__del__ (Triton 3.9) from failing noisily
    # the runtime arguments as [name, type] pairs: their order is the kernel's parameter order
    return {**spec_key(spec), "types": [[n, sig[n]] for n in names if sig[n] != "constexpr"], "cc": cc,
            "name": md.name, "hash": md.hash, "shared": md.shared,
            "global_scratch_size": md.global_scratch_size, "global_scratch_align": md.global_scratch_align,
            "profile_scratch_size": md.profile_scratch_size, "profile_scratch_align": md.profile_scratch_align,
            "ptx_params": params, "triton": triton.__version__, "seconds": round(seconds, 2),
            **resource_usage(cubin), "cubin": cubin}


def _portable(spec) -> tuple:
    """(module, kernel name, fields): a spec as plain data for a worker process."""
    fn = getattr(spec.kernel, "fn", spec.kernel)
    fields = {k: getattr(spec, k) for k in ("types", "constexprs", "divisible", "num_warps", "num_stages",
                                             "options", "min_cc", "max_cc")}
    return fn.__module__, fn.__name__, fields


def _worker_compile(item: tuple, cc: int) -> dict:
    import triton  # noqa: F401 - before the kernel modules (see collect_specs)

    from .aot import KernelSpec, spec_key

    module, name, fields = item
    spec = KernelSpec(getattr(importlib.import_module(module), name), **fields)
    try:
        return compile_spec(spec, cc)
    except Exception as exc:  # noqa: BLE001 - reported per spec, the build fails at the end
        return {**spec_key(spec), "cc": cc, "error": f"{type(exc).__name__}: {exc}"[-3000:]}


# ----------------------------------------------------------------------------- the build


def build(out: Path, targets, jobs: int, use_subset: bool = False, modules=KERNEL_MODULES,
          specs: dict | None = None) -> dict:
    """Compile everything (or `specs`: module -> KernelSpecs) into out/, replacing what was
    there. Returns a summary."""
    from .aot import FORMAT, MANIFEST, kernel_id

    os.environ.pop("TRITON_INTERPRET", None)
    # Triton 3.9's default (fusion on) made explicit: it warns on every compile otherwise; a
    # spec that wants otherwise says enable_fp_fusion in its options, as its launch does
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    specs = specs if specs is not None else collect_specs(modules)
    work = []
    for module_specs in specs.values():
        pairs = (subset(module_specs, targets) if use_subset
                 else [(s, cc) for s in module_specs for cc in targets if s.applies_to(cc)])
        work += [(_portable(s), cc) for s, cc in pairs]
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        results = list(pool.map(_worker_compile, *zip(*work), chunksize=2)) if work else []
    wall = time.perf_counter() - t0
    errors = [r for r in results if "error" in r]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    entries = []
    for r in results:
        if "error" in r:
            continue
        folder = out / f"sm_{r['cc']}"
        folder.mkdir(exist_ok=True)
        file = f"sm_{r['cc']}/{r['kernel']}-{r['hash'][:16]}.cubin"
        (out / file).write_bytes(r.pop("cubin"))
        entries.append({**r, "file": file})
    # kernels with no spec at all for a target (e.g. a bf16 tl.dot kernel below sm_80)
    covered = {(kernel_id(s.kernel), cc) for ss in specs.values() for s in ss for cc in targets if s.applies_to(cc)}
    skipped = sorted({(kernel_id(s.kernel), cc) for ss in specs.values() for s in ss
                      for cc in targets} - covered)
    import triton
    manifest = {"format": FORMAT, "triton": triton.__version__, "targets": list(targets),
                "subset": use_subset, "artifacts": entries}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    (out / "resources.md").write_text(resource_table(entries), encoding="utf-8")
    return {"compiles": len(results), "errors": errors, "wall_s": wall, "jobs": jobs,
            "cpu_s": sum(r.get("seconds", 0) for r in results), "not_applicable": skipped}


def _label(e: dict) -> str:
    c = e["constexprs"]
    parts = [f"{k}={v}" for k, v in c.items() if k != "QTYPE"]
    dts = [f"{n.removesuffix('_ptr')}:{t[1:]}" for n, t in dict(e["types"]).items() if t.startswith("*") and t != "*u8"]
    unaligned = "" if "w_ptr" in e["divisible"] or "w_ptr" not in dict(e["types"]) else " w unaligned"
    return " ".join(parts + dts) + f" {e['num_warps']}w{unaligned}"


def _type_name(q) -> str:
    if q is None:
        return "-"
    from .ggml_types import type_name
    return type_name(q)


def resource_table(entries: list[dict]) -> str:
    """Markdown: one row per kernel specialization, per target registers / spilled bytes / shared
    memory (static + dynamic bytes) as `regs/spill/smem`."""
    targets = sorted({e["cc"] for e in entries})
    rows: dict[tuple, dict] = {}
    for e in entries:
        key = (e["kernel"], _type_name(e["constexprs"].get("QTYPE")), _label(e))
        rows.setdefault(key, {})[e["cc"]] = e
    lines = ["| kernel | type | specialization | " + " | ".join(f"sm_{t}" for t in targets) + " |",
             "|---|---|---|" + "---|" * len(targets)]
    for (kernel, qtype, label), by_cc in sorted(rows.items()):
        cells = []
        for t in targets:
            e = by_cc.get(t)
            cells.append(f"{e['regs']}/{e['spill_bytes']}/{e['shared'] + e['shared_static']}" if e else "n/a")
        lines.append(f"| {kernel} | {qtype} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_table(entries: list[dict]) -> str:
    """Markdown: per kernel and target, specializations, register range, spilled bytes, shared max."""
    targets = sorted({e["cc"] for e in entries})
    kernels = sorted({e["kernel"] for e in entries})
    lines = ["| kernel | " + " | ".join(f"sm_{t}" for t in targets) + " |", "|---|" + "---|" * len(targets)]
    for k in kernels:
        cells = []
        for t in targets:
            es = [e for e in entries if e["kernel"] == k and e["cc"] == t]
            if not es:
                cells.append("n/a")
                continue
            regs = [e["regs"] for e in es]
            cells.append(f"{len(es)} specs, {min(regs)}-{max(regs)} regs, {sum(e['spill_bytes'] for e in es)} B spilled, "
                         f"smem <= {max(e['shared'] + e['shared_static'] for e in es)} B")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .aot import TARGETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--targets", default=",".join(map(str, TARGETS)))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--subset", action="store_true", help="the representative CI subset")
    a = p.parse_args(argv)
    targets = [int(t) for t in a.targets.split(",") if t]
    res = build(a.out, targets, a.jobs, a.subset)
    entries = json.loads((a.out / "manifest.json").read_text())["artifacts"]
    print(summary_table(entries))
    for k, cc in res["not_applicable"]:
        print(f"not built (spec does not apply): {k} for sm_{cc}")
    print(f"aot_build: {res['compiles']} compiles ({len(res['errors'])} failed) for {targets} in "
          f"{res['wall_s']:.0f} s wall, {res['cpu_s']:.0f} s compiling, {res['jobs']} processes -> {a.out}")
    for e in res["errors"]:
        print(f"FAILED {e['kernel']} sm_{e['cc']} {e['constexprs']}: {e['error']}", file=sys.stderr)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
