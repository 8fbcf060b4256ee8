"""The ahead-of-time kernel loader (kernels/aot.py), without a GPU and without a C compiler.

Real artifacts are compiled once for the module (Triton's compiler and ptxas, in a child process:
the build machine's side); everything after that runs the user's side with PATH stripped, CC
unset and every way of starting a program patched to fail: target choice by compute capability,
the manifest, the choice of specialization for real launches of qmatmul's call sites, the
argument packing checked against the compiled entry's PTX parameters, the one fallback line.
Only the final cuLaunchKernel is replaced (a recording fake driver): there is no GPU here.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from support.quant_bytes import random_quant_bytes
from support.triton_toolchain import nvidia_backend
from tramontane.kernels import aot, ggml_types as gt, qmatmul, triton_compat
from tramontane.kernels.linear import QWeight

BUILD = r'''
import sys
from pathlib import Path
from tramontane.kernels import aot, aot_build, ggml_types as gt
# Q6_K, bf16: dequant and the one-row decode (float32 partials), each with aligned and
# unaligned weight rows (the model shapes have both)
specs = [s for s in aot_build.collect_specs(("qmatmul",))["qmatmul"]
         if s.constexprs.get("QTYPE") == gt.Q6_K and s.applies_to(90)
         and ((aot.kernel_id(s.kernel) == "qmatmul._dequant_kernel" and s.types["out_ptr"] == "*bf16")
              or (aot.kernel_id(s.kernel) == "qmatmul._decode_dot_kernel" and s.types["x_ptr"] == "*bf16"
                  and s.types["part_ptr"] == "*fp32"))]
kinds = {(aot.kernel_id(s.kernel), "w_ptr" in s.divisible) for s in specs}
assert len(kinds) == 4, specs
res = aot_build.build(Path(sys.argv[1]), [80, 90], jobs=2, specs={"qmatmul": specs})
assert not res["errors"], res["errors"]
'''


needs_compiler = pytest.mark.skipif(not nvidia_backend(), reason="Triton's NVIDIA backend (ptxas) not installed")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("aot") / "cubins"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


class FakeDriver:
    """Records what would go to the driver; reads the packed parameters back from memory."""

    def __init__(self):
        self.loaded, self.launches = [], []

    def load(self, art, device):
        assert art.path.read_bytes()[:4] == b"\x7fELF"  # a cubin
        self.loaded.append((art, device))
        return 0x1000 + len(self.loaded)  # a function handle

    def launch(self, fn, grid, num_warps, shared, stream, params):
        art = self.loaded[fn - 0x1001][0]
        kinds = [*art.types.values(), "*scratch", "*profile"]
        values = [ctypes.cast(params[i], ctypes.POINTER(aot.ctypes_of(t))).contents.value
                  for i, t in enumerate(kinds)]
        self.launches.append({"grid": grid, "num_warps": num_warps, "shared": shared,
                              "stream": stream, "values": values, "art": art})


def _forbid(*_a, **_k):
    raise AssertionError("the ahead-of-time path started a program")


@pytest.fixture
def no_compiler(monkeypatch, tmp_path, built):
    """The user's machine: no C compiler, no PATH, nothing may be executed; AOT from `built`."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, _forbid)
    monkeypatch.setattr(shutil, "which", _forbid)
    monkeypatch.setattr(os, "system", _forbid)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("TRAMONTANE_TRITON_AOT", "1")
    monkeypatch.setenv("TRAMONTANE_TRITON_AOT_DIR", str(built))
    monkeypatch.setattr(aot, "_launchers", {})
    monkeypatch.setattr(aot, "_reported", set())
    monkeypatch.setattr(aot, "_available", {})
    driver = FakeDriver()
    monkeypatch.setattr(aot, "_driver", lambda: driver)
    monkeypatch.setattr(aot, "current_device_and_stream", lambda: (0, 0x5157))
    # the tensors live on the CPU: launch options as qmatmul passes them on CUDA
    monkeypatch.setattr(qmatmul, "_launch_opts", lambda device, fp_fusion: {"enable_fp_fusion": fp_fusion})
    return driver


def _cc(monkeypatch, cc: int) -> None:
    monkeypatch.setattr(aot, "device_cc", lambda device: cc)


def _q6k(n: int, k: int, seed: int = 0) -> QWeight:
    raw = random_quant_bytes(gt.Q6_K, (n, k), np.random.default_rng(seed))
    return QWeight.from_raw(torch.from_numpy(raw.reshape(n, -1)), gt.Q6_K, (n, k))


# ----------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize("cc, built_ccs, want", [
    (90, {75, 80, 86, 89, 90, 100, 120}, 90),
    (86, {80, 86}, 86),
    (87, {80, 86, 89}, 86),   # Orin: the highest lower minor of the same major
    (89, {80, 86}, 86),
    (86, {80}, 80),
    (75, {75, 80}, 75),
    (70, {75, 80}, None),     # never a newer target, never across majors
    (80, {75, 86}, None),
    (103, {90, 100, 120}, None),  # sm_100a / sm_120a / sm_90a run on exactly their cc
    (121, {90, 100, 120}, None),
    (100, {90, 100}, 100),
    (90, {80, 86, 89}, None),
])
def test_target_rule(cc, built_ccs, want):
    assert aot.select_target(cc, built_ccs) == want


def test_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(aot.AotError, match=r"manifest.json: no manifest"):
        aot.parse_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(aot.AotError, match=r"manifest.json: unreadable"):
        aot.parse_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99, "artifacts": []}))
    with pytest.raises(aot.AotError, match=r"not a format-1 manifest"):
        aot.parse_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "artifacts": [{"kernel": "k"}]}))
    with pytest.raises(aot.AotError, match=r"artifact 0 lacks \['cc'"):
        aot.parse_manifest(tmp_path)


def test_no_compiler_means_aot(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("TRAMONTANE_TRITON_AOT", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    triton_compat._c_compiler_found.cache_clear()
    try:
        assert not triton_compat._c_compiler_found()
        assert triton_compat.aot_mode()
        monkeypatch.setenv("TRAMONTANE_TRITON_AOT", "0")
        assert not triton_compat.aot_mode()  # forced JIT
        monkeypatch.setenv("TRAMONTANE_TRITON_AOT", "1")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert not triton_compat.aot_mode()  # the interpreter is never AOT
    finally:
        triton_compat._c_compiler_found.cache_clear()


# ----------------------------------------------------------------------------- real artifacts


@needs_compiler
def test_manifest_of_a_build(built):
    arts = aot.parse_manifest(built)
    assert {a.cc for a in arts} == {80, 90}
    assert len(arts) >= 8 and len(arts) % 2 == 0
    for a in arts:
        aot.check_layout(a)  # our packing == the compiled entry's PTX parameters
        assert a.path.is_file() and a.name == a.kernel.split(".")[1]
        assert a.regs > 0 and a.num_warps in (1, 2, 4, 8)
    bad = arts[0]
    bad.ptx_params = bad.ptx_params[:-1]
    with pytest.raises(aot.AotError, match="takes parameters"):
        aot.check_layout(bad)


@needs_compiler
def test_dequant_launch_without_compiler(no_compiler, monkeypatch):
    """qmatmul.dequantize_triton's own launch, packed for the sm_90 cubin: Q6_K at K=5120 has
    4200-byte rows (not a multiple of 16) and must get the build without the alignment claim;
    at K=32768 (26880 bytes) the aligned one."""
    _cc(monkeypatch, 90)
    assert triton_compat.aot_mode() and triton_compat.triton_usable(torch.device("cuda"))
    for k, aligned in ((5120, False), (32768, True)):
        w = _q6k(32, k)
        qmatmul.dequantize_triton(w, torch.bfloat16)
        rec = no_compiler.launches[-1]
        art = rec["art"]
        assert art.kernel == "qmatmul._dequant_kernel" and art.cc == 90
        assert ("row_bytes" in art.divisible) == aligned and ("w_ptr" in art.divisible) == aligned
        row_bytes = w.data.shape[1]
        assert row_bytes == {5120: 4200, 32768: 26880}[k]
        vals = rec["values"]
        assert vals[0] == w.data.data_ptr()
        assert vals[3:7] == [32, k, row_bytes, k // 256]  # N, K, row_bytes, n_blocks
        assert vals[7:] == [None, None]  # Triton's scratch pointers: none needed
        assert rec["grid"] == (4, k // 256, 1) and rec["num_warps"] == 4
        assert rec["shared"] == art.shared and rec["stream"] == 0x5157


@needs_compiler
def test_decode_launch_without_compiler(no_compiler, monkeypatch):
    """linear_decode of one bf16 row on Q6_K: the scale-after-dot kernel, its f2p23 constant
    and the grid the host computed; the sm_80 build serves an 8.6 device."""
    _cc(monkeypatch, 86)
    asked = []  # torch's current device and stream: one call into torch each, asked once a launch
    monkeypatch.setattr(aot, "current_device_and_stream", lambda: (asked.append(1), (0, 0x5157))[1])
    w = _q6k(64, 5120, seed=1)
    x = torch.randn(1, 5120).to(torch.bfloat16)
    qmatmul.linear_decode(x, w)
    assert len(asked) == len(no_compiler.launches) >= 1
    rec = no_compiler.launches[-1]
    art = rec["art"]
    assert art.kernel == "qmatmul._decode_dot_kernel" and art.cc == 80
    assert art.constexprs["X_BF16"] is True and "w_ptr" not in art.divisible
    names = list(art.types)
    vals = dict(zip(names, rec["values"]))
    assert vals["x_ptr"] == x.data_ptr() and vals["w_ptr"] == w.data.data_ptr()
    assert vals["f2p23"] == qmatmul.F32_BITS_2P23 and vals["K"] == 5120 and vals["row_bytes"] == 4200
    bn, _, split_k, warps = qmatmul.decode_config(64, 5120, 1, x.device, gt.Q6_K)
    assert rec["grid"] == (64 // bn, split_k, 1) and rec["num_warps"] == warps


@needs_compiler
def test_no_build_for_a_launch_is_one_clear_error(no_compiler, monkeypatch):
    _cc(monkeypatch, 90)
    w = _q6k(32, 5120)
    with pytest.raises(aot.AotError, match=r"no ahead-of-time build of qmatmul._dequant_kernel for sm_90 .*COMPILE_SPECS"):
        qmatmul.dequantize_triton(w, torch.float16)  # only bf16 was built here


@needs_compiler
def test_nothing_fits_one_line_then_torch(no_compiler, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="tramontane.kernels")
    for cc in (103, 103, 70):
        _cc(monkeypatch, cc)
        aot._available.clear()  # as another GPU of that capability
        assert not triton_compat.triton_usable(torch.device("cuda"))
    from tramontane.engine.mistral3 import text

    assert not text.flash_attention_on(torch.device("cuda"))  # attention: the torch path too
    lines = [r for r in caplog.records if r.name == "tramontane.kernels"]
    assert len(lines) == 2, [r.getMessage() for r in lines]  # one per capability, not per call
    assert "compute capability 10.3 (built: sm_80, sm_90)" in lines[0].getMessage()
    assert "torch path" in lines[0].getMessage() and "7.0" in lines[1].getMessage()
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert no_compiler.loaded == []


def test_unreadable_build_is_one_line(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tramontane.kernels")
    monkeypatch.setattr(aot, "_launchers", {})
    monkeypatch.setattr(aot, "_reported", set())
    assert aot.launcher_for(90, tmp_path) is None
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "tramontane.kernels"]
    assert "manifest.json: no manifest" in msg and "torch path" in msg


@needs_compiler
def test_a_driver_refusing_the_cubins_is_one_line(no_compiler, monkeypatch, caplog):
    """An older driver may not load a newer ptxas's cubins: found before any kernel runs."""
    caplog.set_level(logging.WARNING, logger="tramontane.kernels")

    def refuse(art, device):
        raise aot.AotError(f"loading {art.path.name}: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)")

    monkeypatch.setattr(no_compiler, "load", refuse)
    _cc(monkeypatch, 90)
    assert not triton_compat.triton_usable(torch.device("cuda"))
    assert not triton_compat.triton_usable(torch.device("cuda"))
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "tramontane.kernels"]
    assert "driver does not load" in msg and "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in msg and "torch path" in msg
