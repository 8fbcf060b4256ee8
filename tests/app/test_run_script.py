"""scripts/run.sh installs once, then starts at once without the network (issue 26, first run):
run in a copy of the project layout whose .venv/bin/python only records what it is asked."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$LOG"
if [ "$1" = "-c" ] && [ -n "$NO_TORCH" ]; then exit 1; fi  # "import torch" fails: none yet
exit 0
"""
FAKE_APP = """#!/bin/sh
echo "tramontane $*" >> "$LOG"
"""


def make_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run.sh", project / "scripts" / "run.sh")
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    shutil.copy(ROOT / "setup.py", project / "setup.py")
    shutil.copytree(ROOT / "kernels" / "cpu", project / "kernels" / "cpu")
    bin_dir = project / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("tramontane", FAKE_APP)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return project


def run(project: Path, log: Path, *args: str, **extra_env: str) -> tuple[list[str], float]:
    log.write_text("")
    env = dict(os.environ, **extra_env, LOG=str(log), PYTHON=sys.executable,
               # no network: a proxy that does not exist, so any download would fail
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    start = time.perf_counter()
    subprocess.run(["bash", str(project / "scripts" / "run.sh"), *args], env=env, check=True,
                   capture_output=True, timeout=60)
    return log.read_text().splitlines(), time.perf_counter() - start


def test_run_sh_installs_once_then_only_starts(tmp_path):
    project, log = make_project(tmp_path), tmp_path / "calls.log"
    first, _ = run(project, log, "--self-test")
    assert any("-m pip install -q -e ." in c for c in first), first
    assert first[-1] == "tramontane --self-test"

    second, seconds = run(project, log)
    assert second == ["tramontane "] or second == ["tramontane"], second  # no pip, no import check
    assert seconds < 3.0

    (project / "pyproject.toml").write_text((project / "pyproject.toml").read_text() + "\n# changed\n")
    third, _ = run(project, log)
    assert any("-m pip install -q -e ." in c for c in third), third  # a pull changed it: again
    fourth, _ = run(project, log)
    assert not any("pip" in c for c in fourth), fourth


def test_run_sh_takes_torch_from_the_index_asked_for(tmp_path):
    """TRAMONTANE_TORCH_INDEX: one variable for PyTorch's CPU wheels (the default index gives
    the multi-GB CUDA build on Linux)."""
    project, log = make_project(tmp_path), tmp_path / "calls.log"
    index = "https://download.pytorch.org/whl/cpu"
    calls, _ = run(project, log, NO_TORCH="1", TRAMONTANE_TORCH_INDEX=index)
    torch = [c for c in calls if c.endswith(" torch") and "pip" in c]
    assert torch == [f"python -m pip install -q --index-url {index} torch"], calls
    calls, _ = run(project, log, NO_TORCH="1", TRAMONTANE_REINSTALL="1")
    assert [c for c in calls if c.endswith(" torch") and "pip" in c] == ["python -m pip install -q torch"], calls
