"""The CI compile check: every Triton kernel compiles ahead of time for every target in
aot.TARGETS (sm_75 ... sm_120) with the specializations real launches use - checked without a
GPU, through Triton's compiler and its bundled ptxas (kernels/aot_build.py, the same build the
package runs).

Default: the representative subset (aot_build.subset: every kernel function with each of its
tile configs on every target, every quant type on one target in turn); TRAMONTANE_AOT_FULL=1:
every spec on every target, as the package build does. TRAMONTANE_AOT_TABLE=path writes the
registers / spills / shared-memory table there (docs/PERFORMANCE.md shows one).

Also: the specs are the ones real launches use - the host code of qmatmul and attention is run
(launches recorded, not executed) for Mistral-Small-3.1-24B shapes on simulated GPUs, and every
launch must find a spec whose types, constexprs, warps, options and divisibility claims fit.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from tramontane.kernels import aot, aot_build, ggml_types as gt, qmatmul, triton_compat
from tramontane.kernels.linear import QWeight
from support.triton_toolchain import nvidia_backend

# kernels on the per-token path: a spill there costs every token
DECODE_KERNELS = ("qmatmul._decode_kernel", "qmatmul._decode_dot_kernel", "attention._attention_kernel")
# Known and reported, bytes per thread allowed: decode attention in fp16 on Turing (sm_75:
# Triton's mma.m16n8k8 layouts; 255 registers and 928 B of local memory with the 16 x 64 tile,
# measured with Triton 3.9). Anything else spilling in a decode kernel fails.
KNOWN_SPILLS = {("attention._attention_kernel", 75): 1024}


@pytest.mark.skipif(not nvidia_backend(), reason="Triton with its NVIDIA backend (bundled ptxas) not installed")
def test_every_kernel_compiles_for_every_target(tmp_path):
    full = os.environ.get("TRAMONTANE_AOT_FULL", "") not in ("", "0")
    out = tmp_path / "cubins"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "tramontane.kernels.aot_build", "--out", str(out),
           "--jobs", str(os.cpu_count() or 1), *([] if full else ["--subset"])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000)
    print(proc.stdout, f"\naot_build wall {time.perf_counter() - t0:.0f} s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    artifacts = aot.parse_manifest(out)
    built = {(a.kernel, a.cc) for a in artifacts}
    specs = aot_build.collect_specs()
    expected = {(aot.kernel_id(s.kernel), cc) for ss in specs.values() for s in ss
                for cc in aot.TARGETS if s.applies_to(cc)}
    assert built == expected  # every kernel on every target it applies to
    if full:
        assert len(artifacts) == sum(s.applies_to(cc) for ss in specs.values() for s in ss for cc in aot.TARGETS)
    for a in artifacts:
        aot.check_layout(a)  # the launcher's packing == the compiled entry's parameters
    spills = [(a.kernel, a.cc, a.constexprs, a.spill_bytes) for a in artifacts
              if a.kernel in DECODE_KERNELS and _is_decode(a) and a.spill_bytes > KNOWN_SPILLS.get((a.kernel, a.cc), 0)]
    assert not spills, f"decode kernels spill registers to local memory: {spills}"
    table = os.environ.get("TRAMONTANE_AOT_TABLE")
    if table:
        shutil.copy(out / "resources.md", table)


def _is_decode(a) -> bool:
    """The one-token specializations: qmatmul's decode kernels (1-8 rows), attention over the
    device position (POS_FROM_PTR, the CUDA-graph decode step)."""
    return a.kernel != "attention._attention_kernel" or bool(a.constexprs.get("POS_FROM_PTR"))


# ----------------------------------------------------------------------------- real launches

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 5120, 32, 8, 128, 32768, 131072  # Mistral-Small-3.1-24B


def _weight(t: int, n: int, k: int) -> QWeight:
    return QWeight.from_raw(torch.empty(n, gt.row_bytes(t, k), dtype=torch.uint8), t, (n, k))


@pytest.fixture
def recorded(monkeypatch):
    """Every launch the kernels' host code makes, recorded and not executed (interpreter-only
    switches off, launch options and SM counts as on a GPU)."""
    launches = []

    seen = set()

    def hook(kernel, grid, args, kwargs):  # one launch per distinct specialization
        key = (aot.kernel_id(kernel), tuple(aot._arg_class(a) for a in args),
               tuple(sorted((k, aot._arg_class(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items())))
        if key not in seen:
            seen.add(key)
            launches.append((kernel, args, dict(kwargs)))
        return True

    monkeypatch.setattr(triton_compat, "_launch_hook", hook)
    # linear_prefill's cuBLAS step is no launch of ours: not computed here (CPU bf16 matmuls)
    monkeypatch.setattr(torch, "matmul", lambda a, b, out=None: out)
    monkeypatch.setattr(qmatmul, "_launch_opts", lambda device, fp_fusion: {"enable_fp_fusion": fp_fusion})
    if hasattr(qmatmul, "interpreting"):
        monkeypatch.setattr(qmatmul, "interpreting", lambda: False)
    return launches


def _uncovered(launches, specs, cc: int) -> list:
    by_kernel = {}
    for s in specs:
        if s.applies_to(cc):
            by_kernel.setdefault(aot.kernel_id(s.kernel), []).append(s)
    missing = []
    for kernel, args, kwargs in launches:
        candidates = by_kernel.get(aot.kernel_id(kernel), [])
        ok = False
        for s in candidates:
            runtime, constexprs, options = aot.split_launch_args(kernel, args, kwargs, s.constexprs)
            warps, stages = options.pop("num_warps", 4), options.pop("num_stages", 3)
            art = aot.Artifact(aot.kernel_id(kernel), cc, dict(s.types), dict(s.constexprs), frozenset(s.divisible),
                               s.num_warps, s.num_stages, dict(s.options), 0, 0, 1, 0, 1, [], "", None)
            if aot.matches(art, runtime, constexprs, warps, options, stages):
                ok = True
                break
        if not ok:
            runtime, constexprs, options = aot.split_launch_args(
                kernel, args, kwargs, candidates[0].constexprs if candidates else ())
            missing.append((aot.kernel_id(kernel), constexprs, options,
                            {n: (aot.triton_type(v), aot._divisible(v)) for n, v in runtime.items()}))
    return missing


@pytest.mark.parametrize("dtype, cc, sms", [(torch.bfloat16, 90, 132), (torch.bfloat16, 86, 28),
                                            (torch.float16, 75, 40), (torch.float32, 75, 40),
                                            (torch.float32, 120, 84)])
def test_specs_cover_real_matmul_launches(recorded, monkeypatch, dtype, cc, sms):
    from tramontane.kernels import linear as lin

    monkeypatch.setattr(qmatmul, "_sm_count", lambda device: sms)
    specs = aot_build.collect_specs(("qmatmul",))["qmatmul"]
    shapes = [(Q_HEADS * HEAD_DIM, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN), (HIDDEN, Q_HEADS * HEAD_DIM),
              (FFN, HIDDEN), (HIDDEN, FFN), (VOCAB, HIDDEN)]
    entry = {"decode": qmatmul.linear_decode, "rows": qmatmul.linear_rows,
             "dense": lambda x, w: qmatmul.linear_prefill(x, w, lin.PREFILL_CHUNK_BYTES)}
    for t in qmatmul.TRITON_TYPES:
        for n, k in shapes:
            w = _weight(t, n, k)
            for m in (1, 2, 3, 5, 8, 16, 100, 256, 512, 600):
                x = torch.empty(m, k, dtype=dtype)
                entry[lin.cuda_kernel_for(m, dtype)](x, w)  # the path `linear` takes on CUDA
    assert recorded
    missing = _uncovered(recorded, specs, cc)
    assert not missing, f"{len(missing)} of {len(recorded)} launches have no COMPILE_SPECS entry, e.g. {missing[:3]}"


@pytest.mark.parametrize("dtype, cc, sms", [(torch.bfloat16, 90, 132), (torch.float16, 75, 40)])
def test_specs_cover_real_attention_launches(recorded, monkeypatch, dtype, cc, sms):
    attention = pytest.importorskip("tramontane.kernels.attention")
    monkeypatch.setattr(attention, "_sm_count", lambda device: sms)
    monkeypatch.setattr(attention, "interpreting", lambda: False)
    specs = aot_build.collect_specs(("attention",))["attention"]
    cache_k = torch.empty(KV_HEADS, 8192, HEAD_DIM, dtype=dtype)
    cache_v = torch.empty(KV_HEADS, 8192, HEAD_DIM, dtype=dtype)
    for T, start in ((1, 0), (7, 0), (129, 100), (600, 3000), (2048, 4096)):
        attention.attention(torch.empty(T, Q_HEADS, HEAD_DIM, dtype=dtype), cache_k, cache_v, start)
    pos = torch.tensor([300], dtype=torch.int64)
    for bucket in (256, 1024, 8192):
        attention.decode_attention(torch.empty(1, Q_HEADS, HEAD_DIM, dtype=dtype), cache_k, cache_v, pos, bucket)
    # the paged forms: a pool of 32-row blocks, one sequence's rows, batched decode at 1-16 rows
    k_pool = torch.empty(300, KV_HEADS, 32, HEAD_DIM, dtype=dtype)
    table = torch.arange(256, dtype=torch.int32)
    for T, start in ((1, 0), (7, 40), (600, 3000), (2048, 4096)):
        attention.paged_attention(torch.empty(T, Q_HEADS, HEAD_DIM, dtype=dtype), k_pool, k_pool, table, start, 32)
    for R in (1, 2, 8, 16):
        for max_keys in (512, 8192):
            attention.paged_decode_attention(torch.empty(R, Q_HEADS, HEAD_DIM, dtype=dtype), k_pool, k_pool,
                                             table.repeat(R, 1), torch.zeros(R, dtype=torch.int32), 32, max_keys)
    assert recorded
    missing = _uncovered(recorded, specs, cc)
    assert not missing, f"{len(missing)} of {len(recorded)} launches have no COMPILE_SPECS entry, e.g. {missing[:3]}"
