"""Settings' "GPU layers: N" reaches the engine: the worker turns it into the planner's manual
map for the file it loads (a real worker thread, the tiny fixture model, this CPU machine)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from support.app_window import MODEL  # noqa: E402


def _layers() -> int:
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.mistral3.config import text_config

    with open_gguf(MODEL) as gf:
        return text_config(gf).n_layers


def test_gpu_layers_zero_is_a_manual_all_cpu_map(qtbot, worker):
    with qtbot.waitSignal(worker.loaded, timeout=30000):
        worker.load(MODEL, None, "auto", None, gpu_layers=0)
    placement = worker.engine.placement
    assert placement["manual"] and placement["cpu_layers"] == _layers() == placement["n_layers"]


def test_auto_is_the_planners_own_choice(qtbot, worker):
    with qtbot.waitSignal(worker.loaded, timeout=30000):
        worker.load(MODEL, None, "auto")
    assert not worker.engine.placement["manual"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_layers_on_a_machine_without_gpu_says_so(qtbot, worker):
    with qtbot.waitSignal(worker.loadFailed, timeout=30000) as failed:
        worker.load(MODEL, None, "auto", None, gpu_layers=1)
    assert "no cuda:0" in failed.args[0]
    assert worker.engine is None
