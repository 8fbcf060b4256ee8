"""`tramontane --self-test` (app/selftest.py: the engine's steps of engine/cli/selftest.py, then
the store and the window): passes on a working install, and names the failing step and file when
something is broken."""
import io
import os
import re
import shutil
import subprocess
import sys

import pytest

from tramontane.app.selftest import run_self_test
from tramontane.engine.cli import selftest

from support import FIXTURES
MODEL = os.path.join(FIXTURES, selftest.MODEL_NAME)
MMPROJ = os.path.join(FIXTURES, selftest.MMPROJ_NAME)
STEPS = ("version", "model", "kernels", "vision", "turn1", "turn2", "stop", "new-chat",
         "regenerate", "store", "gui")


def run(*args, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    code = run_self_test(*args, out=out, **kwargs)
    return code, out.getvalue()


def test_self_test_passes_with_the_fixture_model(qapp):
    code, text = run(gui=True)
    assert code == 0, text
    lines = text.splitlines()
    assert lines[-1] == "OK"
    for step in STEPS:
        assert any(line.split()[:2] == [step, "ok"] for line in lines), (step, text)
    assert f"{selftest.GEN_TOKENS} generated" in text
    steps = {line.split()[0]: line for line in lines if line.startswith("  ")}
    # The second turn continues the first turn's KV (the prefill after a cached prefix, image
    # included); the stop step really stopped; regenerate came back from the parked chat's KV.
    cached = re.search(r"follow-up: (\d+) of (\d+) prompt tokens cached", steps["turn2"])
    assert cached and int(cached.group(1)) > 0, steps["turn2"]
    assert re.search(rf"reply stopped after \d+ of {selftest.STOP_MAX_TOKENS} tokens", steps["stop"])
    assert re.search(r"stopped reply again: [1-9]\d* of \d+ prompt tokens cached", steps["regenerate"])


def test_each_conversation_step_checks_what_it_claims(monkeypatch):
    """The steps fail, naming why, when the engine does not do what a user relies on."""
    from tramontane.engine.runtime.local import LocalEngine
    from tramontane.engine.runtime.batch import BatchScheduler

    real_chat = LocalEngine.chat

    calls = []

    def no_cache(self, messages, params, on_piece=None, cancel=None, session_key=None):
        calls.append(session_key)
        return real_chat(self, messages, params, on_piece, cancel, session_key)  # the whole chat recomputed

    monkeypatch.setattr(LocalEngine, "chat", no_cache)
    monkeypatch.setattr(BatchScheduler, "_match", lambda self, hashes, keys: ([], 0))  # no block is ever found
    code, text = run(gui=False, gpu=False)
    assert code == 1
    assert text.splitlines()[-1] == ("FAILED: turn2: no prompt token came from the KV cache: "
                                     "the second turn recomputed the whole chat"), text
    assert "  turn1      ok" in text and "stop" not in text

    monkeypatch.undo()  # the cache works again

    def never_stops(self, messages, params, on_piece=None, cancel=None, session_key=None):
        return real_chat(self, messages, params, on_piece, None, session_key)

    monkeypatch.setattr(LocalEngine, "chat", never_stops)
    code, text = run(gui=False, gpu=False)
    assert code == 1
    assert text.splitlines()[-1].startswith("FAILED: stop: the reply was not stopped (finish "
                                            "reason length"), text


def test_gpu_step_reports_and_fails_cleanly_when_cuda_is_broken(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a real GPU: test_gpu_step_on_a_real_gpu covers it")
    code, text = run(gui=False)
    assert code == 0 and "  gpu        skipped (" in text, text
    # torch claims a device it cannot use: the step runs and its failure is reported.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Fake GPU")
    code, text = run(gui=False)
    assert code == 1
    last = text.splitlines()[-1]
    assert last.startswith("FAILED: gpu: "), text
    assert "store" not in text  # later steps are not attempted
    code, text = run(gui=False, gpu=False)
    assert code == 0 and "gpu" not in text


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_step_on_a_real_gpu():
    code, text = run(gui=False)
    assert code == 0, text
    assert any(line.split()[:2] == ["gpu", "ok"] for line in text.splitlines()), text


def test_finds_the_model_in_a_source_checkout():
    model, mmproj = selftest.find_model()
    assert model.name == selftest.MODEL_NAME and model.is_file()
    assert mmproj is not None and mmproj.name == selftest.MMPROJ_NAME


def test_missing_model_fails_with_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    code, text = run(missing, gui=False)
    assert code == 1
    assert text.splitlines()[-1] == f"FAILED: model: {missing}: no such file"
    assert "generate" not in text  # later steps are not attempted


def test_corrupt_model_fails_naming_the_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    code, text = run(bad, gui=False)
    assert code == 1
    last = text.splitlines()[-1]
    assert last.startswith("FAILED: model: ") and str(bad) in last, text
    assert "Traceback" not in text


def test_model_without_projector_fails_at_the_vision_step(tmp_path):
    lone = tmp_path / selftest.MODEL_NAME
    shutil.copy(MODEL, lone)
    code, text = run(lone, gui=False)
    assert code == 1
    assert "model      ok" in text
    assert text.splitlines()[-1] == "FAILED: vision: the model was loaded without a vision projector"


def test_env_override_and_missing_bundle_resources(tmp_path, monkeypatch):
    monkeypatch.setenv(selftest.MODEL_ENV, str(tmp_path / "elsewhere.gguf"))
    code, text = run(gui=False)
    assert code == 1 and "elsewhere.gguf: no such file" in text

    monkeypatch.delenv(selftest.MODEL_ENV)
    monkeypatch.setattr(selftest, "_candidate_dirs", lambda: [tmp_path])
    with pytest.raises(selftest.SelfTestFailure, match=str(tmp_path)):
        selftest.find_model()
    code, text = run(gui=False)
    assert code == 1 and f"FAILED: model: the self-test model {selftest.MODEL_NAME}" in text


@pytest.mark.slow
def test_module_entry_point_exit_codes(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    ok = subprocess.run([sys.executable, "-m", "tramontane.app.selftest", "--no-gui"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[-1] == "OK"
    bad = subprocess.run([sys.executable, "-m", "tramontane.app.selftest", "--no-gui",
                          "--model", str(tmp_path / "x.gguf")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[-1] == f"FAILED: model: {tmp_path / 'x.gguf'}: no such file"


def test_cli_self_test_subcommand(capsys, tmp_path):
    """`tramontane-cli self-test` (the pip-installed console script): the engine's steps (the
    store and the window are the app's), exit 1 with the failing step."""
    from tramontane.engine.cli.main import main

    assert main(["self-test", "--no-gpu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[-1] == "OK"
    for step in STEPS[:-2]:
        assert any(line.split()[:2] == [step, "ok"] for line in lines), (step, out)
    assert "store" not in out and "gui" not in out and "gpu" not in out
    assert main(["self-test", "--model", str(tmp_path / "x.gguf")]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"FAILED: model: {tmp_path / 'x.gguf'}: no such file"


def test_app_entry_flags_choose_the_window_step(monkeypatch):
    """The bundle's `tramontane-cli self-test` passes --no-gui first; a user's --gui after it
    still asks for the window (packaging/README.md), and the pip CLI has no window flag at all."""
    from tramontane.app import selftest as app_selftest
    from tramontane.engine.cli.main import main as cli_main

    asked = []
    monkeypatch.setattr(app_selftest, "run_self_test", lambda model, mmproj, gui, gpu: asked.append(gui) or 0)
    for argv, gui in ((["--no-gui"], False), (["--no-gui", "--gui"], True), ([], None)):
        assert app_selftest.main([*argv, "--no-gpu"]) == 0
        assert asked.pop() is gui, argv
    with pytest.raises(SystemExit):
        cli_main(["self-test", "--gui"])
