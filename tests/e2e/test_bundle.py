"""The frozen bundle, exercised as a user would: every runtime path that imports something
(the self-test's chat turns, each quantization's kernels, the hub download, a remote server, the
window) run through the built executables, so a module the bundle lacks fails here, in CI.

Runs only when TRAMONTANE_BUNDLE names a built bundle folder (dist/tramontane);
scripts/package_smoke.sh builds one and runs this file against it (CI: .ci/run). Each test
starts the executables as subprocesses, offscreen, with a throw-away data dir."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BUNDLE = os.environ.get("TRAMONTANE_BUNDLE")
pytestmark = pytest.mark.skipif(not BUNDLE, reason="TRAMONTANE_BUNDLE=<dist/tramontane> not set "
                                "(scripts/package_smoke.sh builds a bundle and sets it)")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TINY = FIXTURES / "mistral3_tiny-f32.gguf"
TINY_MMPROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"
IMAGE = FIXTURES / "ref_image_112x84.png"
SELF_TEST_STEPS = ("version", "model", "kernels", "vision", "turn1", "turn2", "stop", "new-chat",
                   "regenerate", "store", "gui")


@pytest.fixture
def env(tmp_path) -> dict:
    e = dict(os.environ, QT_QPA_PLATFORM="offscreen", TRAMONTANE_DATA_DIR=str(tmp_path / "data"),
             TRAMONTANE_SELFTEST_TRACEBACK="1", HOME=str(tmp_path / "home"))
    e.pop("TRITON_INTERPRET", None)
    return e


def exe(name: str) -> str:
    path = Path(BUNDLE) / name
    assert path.exists(), f"{path}: not in the bundle"
    return str(path)


def run(name: str, *args: str, env: dict, timeout: float = 300, ok: bool = True):
    res = subprocess.run([exe(name), *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=timeout)
    if ok:
        assert res.returncode == 0, f"{name} {' '.join(map(str, args))}: exit {res.returncode}\n" \
                                    f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    return res


def step_lines(text: str) -> dict[str, str]:
    """'  turn2      ok   follow-up: ...' -> {'turn2': 'ok   follow-up: ...'}"""
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+) +(ok .*|FAILED.*|skipped.*)$",
                                                        text, re.M)}


# -- the self-test: a user's first minutes ------------------------------------------------------
def test_gui_self_test_runs_every_step_frozen(env):
    res = run("tramontane", "--self-test", env=env)
    print(res.stdout)
    assert ", frozen)" in res.stdout.splitlines()[0]  # the bundle's interpreter, not a venv's
    steps = step_lines(res.stdout)
    for step in SELF_TEST_STEPS:
        assert steps.get(step, "").startswith("ok "), (step, res.stdout)
    cached = re.search(r"follow-up: (\d+) of (\d+) prompt tokens cached", steps["turn2"])
    assert cached and int(cached.group(1)) > 0, steps["turn2"]
    assert "image tokens" in steps["vision"] and "image + question" in steps["turn1"]
    assert res.stdout.rstrip().endswith("OK")


def test_cli_self_test_frozen(env):
    res = run("tramontane-cli", "self-test", env=env)
    steps = step_lines(res.stdout)
    assert "gui" not in steps and steps["regenerate"].startswith("ok "), res.stdout


# -- the command line on every weight format the engine has kernels for -----------------------
@pytest.mark.parametrize("model", sorted(p.name for p in FIXTURES.glob("mistral3_*.gguf")
                                         if "gelu" not in p.name))
def test_cli_runs_each_quantization(env, model):
    res = run("tramontane-cli", "run", "--model", FIXTURES / model, "--prompt", "Hello",
              "--max-tokens", 3, "--ignore-eos", "--temperature", 0, "--json", env=env)
    out = json.loads(res.stdout)
    assert len(out["token_ids"]) == 3, out


def test_cli_image_prompt_with_every_sampler(env):
    res = run("tramontane-cli", "run", "--model", TINY, "--mmproj", TINY_MMPROJ, "--image", IMAGE,
              "--prompt", "Describe it.", "--max-tokens", 6, "--ignore-eos", "--seed", 1,
              "--temperature", 0.8, "--top-k", 20, "--top-p", 0.9, "--min-p", 0.05,
              "--repetition-penalty", 1.1, "--system", "Be brief.", env=env)
    assert "6 generated" in res.stderr, res.stderr


def test_cli_info_tokenize_perplexity_bench(env, tmp_path):
    info = json.loads(run("tramontane-cli", "info", "--json", TINY, env=env).stdout)
    assert info["architecture"] == "mistral3"
    run("tramontane-cli", "tokenize", "--model", TINY, "Hello world", env=env)
    text = tmp_path / "text.txt"
    text.write_text("The north wind blows over the sea. " * 20)
    run("tramontane-cli", "perplexity", "--model", TINY, "--file", text, "--context-length", 128,
        env=env)
    run("tramontane-cli", "bench", "--model", TINY, "--mmproj", TINY_MMPROJ, "--image", IMAGE,
        "--prompt-tokens", 16, "--gen-tokens", 4, "--json", env=env)


# -- the network paths, against loopback fakes ----------------------------------------------------
def test_models_download_list_verify_and_run(env, tmp_path):
    from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos

    repo = "tiny-org/Tiny-Vision-GGUF"
    models = tmp_path / "models"
    with FakeHub(tiny_repos(tmp_path / "src")) as hub:
        hub_args = ("--endpoint", hub.endpoint, "--dir", models)
        found = run("tramontane-cli", "models", "search", "tiny", "--endpoint", hub.endpoint, env=env)
        assert repo in found.stdout
        run("tramontane-cli", "models", "search", "--repo", repo, "--json", "--endpoint",
            hub.endpoint, env=env)
        got = run("tramontane-cli", "models", "download", repo, "--quant", "Q8_0", "--quiet",
                  *hub_args, env=env)
    model, mmproj = map(Path, got.stdout.split())
    assert model.name == MODEL_FILE and mmproj.name == PROJ_FILE and model.is_file()
    listed = json.loads(run("tramontane-cli", "models", "list", "--json", "--dir", models,
                            env=env).stdout)
    assert len(listed["files"]) == 2
    assert run("tramontane-cli", "models", "verify", "--dir", models, env=env).stdout.count("sha256 ok") == 2
    info = json.loads(run("tramontane-cli", "info", "--json", model, env=env).stdout)
    assert Path(info["projector_found"]).name == mmproj.name, info  # (the fake files do not run)


def test_remote_server_chat(env):
    from support.fakevllm import FakeVLLM

    with FakeVLLM(models=["small"], reply="Hello there") as server:
        res = run("tramontane-cli", "run", "--server", server.url, "--model", "small",
                  "--image", IMAGE, "--prompt", "Hi", env=env)
    assert "Hello there" in res.stdout


# -- the window ---------------------------------------------------------------------------------
def test_window_start_time(env):
    env["TRAMONTANE_LAUNCH_TIME"] = f"{time.time():.3f}"
    res = run("tramontane", env=env, timeout=120)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("startup:")), None)
    assert line, res.stdout + res.stderr
    print(line)
