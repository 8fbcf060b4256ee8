"""The spec bundles the ahead-of-time Triton kernels where kernels/aot.py looks for them
(tramontane/kernels/aot_cubins/), builds them from the staged sources when asked, and refuses a
folder without a manifest. The spec is evaluated with recording stand-ins (no PyInstaller run);
the compile itself is replaced by a recorder here (tests/kernels/test_compile.py compiles)."""
from __future__ import annotations

import json
import subprocess

import pytest

from e2e.test_packaging import evaluate_spec
from tramontane.kernels import aot


def _fake_build(folder):
    (folder / "sm_90").mkdir(parents=True)
    (folder / "sm_90" / "k-0123.cubin").write_bytes(b"\x7fELF")
    (folder / "manifest.json").write_text(json.dumps({"format": aot.FORMAT, "artifacts": []}))
    return folder


def _aot_datas(ns) -> list[tuple[str, str]]:
    return [(src, dst) for src, dst in ns["a"].kwargs["datas"] if "aot_cubins" in dst]


def test_a_given_folder_is_bundled_beside_the_loader(tmp_path, monkeypatch):
    src = _fake_build(tmp_path / "built")
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0", TRAMONTANE_TRITON_AOT_SRC=str(src))
    assert sorted(_aot_datas(ns)) == [
        (str(src / "manifest.json"), "tramontane/kernels/aot_cubins"),
        (str(src / "sm_90" / "k-0123.cubin"), "tramontane/kernels/aot_cubins/sm_90")]
    # the loader's default folder is that one, relative to the bundled kernels package
    assert aot.DEFAULT_DIR.name == "aot_cubins" and aot.DEFAULT_DIR.parent.name == "kernels"


def test_a_folder_without_manifest_is_refused(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no manifest.json"):
        evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0", TRAMONTANE_TRITON_AOT_SRC=str(tmp_path))
    monkeypatch.delenv("TRAMONTANE_TRITON_AOT_SRC")
    with pytest.raises(SystemExit, match="TRAMONTANE_TRITON_AOT_BUILD='sometimes'"):
        evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0", TRAMONTANE_TRITON_AOT_BUILD="sometimes")


def test_cpu_bundle_has_none_by_default(tmp_path, monkeypatch):
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0")
    assert _aot_datas(ns) == []


@pytest.mark.parametrize("mode, triton, subset", [("subset", "0", True), ("auto", "1", False), ("full", "0", False)])
def test_the_build_compiles_the_staged_kernels(tmp_path, monkeypatch, mode, triton, subset):
    if triton == "1":
        pytest.importorskip("triton")
    calls = []
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if "tramontane.kernels.aot_build" not in cmd:
            return real_run(cmd, *args, **kwargs)
        calls.append((cmd, kwargs))
        _fake_build(tmp_path / "work" / "triton-aot")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON=triton, TRAMONTANE_TRITON_AOT_BUILD=mode,
                       TRAMONTANE_TRITON_AOT_JOBS="3")
    (cmd, kwargs), = calls
    stage = tmp_path / "work" / "bundle-src"
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "work" / "triton-aot")
    assert ("--subset" in cmd) == subset and cmd[cmd.index("--jobs") + 1] == "3"
    assert kwargs["env"]["PYTHONPATH"].split(":")[0] == str(stage)  # this checkout's kernels
    assert "TRITON_INTERPRET" not in kwargs["env"]  # compiled, not interpreted
    assert len(_aot_datas(ns)) == 2
