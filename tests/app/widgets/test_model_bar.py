"""The model bar on the real window: the quant of the loaded file and a meter of the context
the open chat takes."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

pytest.importorskip("pytestqt")

from support.app_window import send  # noqa: E402
from tramontane.app.engine_info import EngineInfo  # noqa: E402
from tramontane.app.widgets.model_bar import quant_of  # noqa: E402


@pytest.mark.parametrize("name, quant", [("Ministral-3-8B-Instruct-2512-Q4_K_M.gguf", "Q4_K_M"),
                                         ("mistral3_tiny-f32.gguf", "F32"), ("x-IQ4_XS.gguf", "IQ4_XS"),
                                         ("b.BF16.gguf", "BF16"), ("model.gguf", "")])
def test_quant_of_file_names(name, quant):
    assert quant_of(name) == quant


def test_quant_and_context_meter(qtbot, window):
    bar = window.model_bar
    assert bar.quant_label.text() == "F32" and not bar.quant_label.isHidden()
    assert bar.context_meter.isHidden() is False and bar.context_meter.value() == 0
    send(qtbot, window, "Hello")
    status = window.view.widgets[-1].status.text()
    used, size = map(int, re.search(r"context (\d+) / (\d+)", status).groups())
    assert (bar.context_meter.value(), bar.context_meter.maximum()) == (used, size) == (used, 512)
    assert f"{used} of 512" in bar.context_meter.toolTip()
    window.navigation.new_chat()
    assert bar.context_meter.value() == 0


def test_the_bar_says_where_the_layers_run(qtbot, window):
    """The loaded engine's plan reaches the bar: its tooltip names where the layers run."""
    info = window.session.engine_info
    n_layers = window.worker.engine.model.cfg.n_layers
    assert info.placement == f"all {n_layers} layers on the CPU" and not info.split
    assert f"Layers: all {n_layers} layers on the CPU" in window.model_bar.device_label.toolTip()


def test_a_model_split_between_gpu_and_cpu_says_so_in_the_device_line():
    from tramontane.app.widgets.model_bar import device_line, device_tip
    from tramontane.app.engine_info import EngineInfo

    info = EngineInfo("m.gguf on cuda + cpu", False, "/m/m.gguf", device="cuda", memory="9.1 GB GPU",
                      context_size=4096, placement="34 of 40 layers on GPU, 6 on CPU", split=True)
    assert device_line(info).startswith("34 of 40 layers on GPU, 6 on CPU · 9.1 GB GPU")
    assert "Layers: 34 of 40 layers on GPU, 6 on CPU" in device_tip(info)
    whole = EngineInfo("m.gguf on cuda", False, "/m/m.gguf", device="cuda", placement="all 40 layers on cuda:0")
    assert device_line(whole).startswith("cuda")


def test_a_model_loading_shows_nothing_of_the_previous_one(qtbot, window):
    """Issue 35, item 5: while another model loaded the bar still showed the previous one's
    quant, "vision" and device line."""
    from support.app_window import MODEL

    bar = window.model_bar
    assert bar.quant_label.text() == "F32" and bar.projector_label.text() == "vision"
    window.model_loading.load_model(str(MODEL), "", check=False)  # the same file, text only this time
    assert bar.model_label.text().startswith("Loading ")
    for badge in (bar.quant_label, bar.projector_label, bar.context_meter):
        assert badge.isHidden(), badge
    assert bar.device_label.text() == "" and bar.projector_label.toolTip() == ""
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    assert bar.projector_label.text() == "text only" and bar.quant_label.text() == "F32"


def test_at_800_px_the_memory_and_context_figures_stay_whole(qtbot, idle_window):
    """Issue 35, item 10: at 800 px the device line had ~0 px beside the buttons and its
    memory and context were cut away; it now has the bar's whole width under them, and what is
    cut first when even that is short is where it runs, at the line's start."""
    from PySide6.QtWidgets import QLabel

    from tramontane.app.widgets.model_bar import device_line

    window = idle_window
    info = EngineInfo("m", True, "/models/Mistral-Small-3.1-24B-Instruct-2503-UD-Q4_K_XL.gguf",
                      "/models/mmproj-F16.gguf", "cuda", "17.5 GB GPU", 131072,
                      placement="34 of 40 layers on GPU, 6 on CPU", split=True)
    window.resize(800, 600)
    bar = window.model_bar
    whole = replace(info, placement="", split=False)
    window.worker.loaded.emit(whole)
    qtbot.wait(50)
    assert window.width() == 800
    assert QLabel.text(bar.device_label) == device_line(whole) == "cuda · 17.5 GB GPU · context 131072"
    assert "…" in QLabel.text(bar.model_label)  # the name gives the room instead
    window.worker.loaded.emit(info)  # a longer line: its start is cut, the figures stay
    qtbot.wait(50)
    shown = QLabel.text(bar.device_label)
    assert shown.startswith("…") and shown.endswith("on CPU · 17.5 GB GPU · context 131072")
