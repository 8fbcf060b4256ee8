"""The Models dialog opened from the real window: it knows the loaded model and the window's
settings, lists a file opened from elsewhere, and a double-click there loads it; Settings'
GPU layers reach the engine. The real engine on the tiny fixture model; no network (offline)."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QLabel  # noqa: E402

from support.app_window import MMPROJ, MODEL, load_and_wait  # noqa: E402

TIMEOUT = 30_000


@pytest.fixture
def window(idle_window, tmp_path):
    idle_window.settings.models_dir = str(tmp_path / "models")
    return idle_window


def _row_of(table, name: str) -> int:
    return next(r for r in range(table.rowCount()) if table.item(r, 0).text().startswith(name))


def test_a_file_opened_from_elsewhere_is_listed_marked_and_double_click_loads_it(qtbot, window, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = elsewhere / "mine.gguf"
    shutil.copyfile(MODEL, model)
    window.model_loading.load_model(str(model))  # what File → Open model does once a file is picked
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=TIMEOUT)
    assert window.settings.recent_models[0] == str(model)

    window.dialogs.open_model_manager()
    dialog = window.dialogs.model_manager
    assert dialog.settings is window.settings
    table = dialog.local_table
    row = _row_of(table, "mine.gguf")
    assert table.item(row, 0).text() == "mine.gguf  (loaded)"
    assert table.item(row, 8).text() == f"opened from: {elsewhere.resolve()}"
    qtbot.waitUntil(lambda: table.item(row, 6).text() != "", timeout=TIMEOUT)
    assert table.item(row, 6).text() in ("on the CPU", "on the GPU", "partly on the CPU")

    # another model, then back by a double-click in the dialog
    window.model_loading.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.session.engine_info is not None and window.session.engine_info.model_path == str(MODEL),
                    timeout=TIMEOUT)
    window.dialogs.open_model_manager()
    dialog = window.dialogs.model_manager
    table = dialog.local_table
    row = _row_of(table, "mine.gguf")
    assert table.item(row, 0).text() == "mine.gguf"  # no longer the loaded one
    from PySide6.QtCore import Qt
    rect = table.visualRect(table.model().index(row, 0))
    qtbot.mouseClick(table.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.mouseDClick(table.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: window.session.engine_info is not None and window.session.engine_info.model_path == str(model.resolve()),
                    timeout=TIMEOUT)
    import shiboken6
    assert not shiboken6.isValid(dialog) or not dialog.isVisible()  # loading from it closes the dialog


def test_gpu_layers_setting_reaches_the_engine(qtbot, window):
    window.settings.gpu_layers = 0
    window.model_loading.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=TIMEOUT)
    placement = window.worker.engine.placement
    assert placement["manual"] and placement["gpu_layers"] == 0
    window.settings.gpu_layers = None
    window.model_loading.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.session.engine_info is not None and not window.worker.engine.placement["manual"],
                    timeout=TIMEOUT)


def test_the_running_model_is_not_called_too_big(qtbot, window, tmp_path, monkeypatch):
    """Issue 26, item 11: on a machine whose free memory the loaded model itself takes, the
    dialog judges that model by where it runs (not "too big"), plans the others as if it were
    unloaded, and says the context in use."""
    from tramontane.app.dialogs import models as dialog_module
    from tramontane.engine.library.fit import fit_of_file
    from tramontane.engine.runtime.device_map import Budget, DeviceInfo, Machine

    other = tmp_path / "models" / "other.gguf"
    other.parent.mkdir()
    shutil.copyfile(MODEL, other)
    window.settings.context_length = 256
    window.model_loading.load_model(str(MODEL))
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=TIMEOUT)
    freed = 64 << 20
    import dataclasses

    assert window.session.engine_info.resident_bytes >= 0  # measured by the load (a tiny model: little)
    window.session.engine_info = dataclasses.replace(window.session.engine_info, resident_bytes=freed)
    # Free memory: the planner's 2 GiB headroom and nothing more (the tiny model needs 2.6 MiB
    # beyond it), until the loaded model's RAM counts as free.
    tight = Machine((), DeviceInfo("cpu", 2 << 30, "simulated"))
    assert fit_of_file(MODEL, None, tight, "cpu", Budget(max_seq_len=256)).kind == "too_big"
    roomy = Machine((), DeviceInfo("cpu", (2 << 30) + freed, "simulated"))
    assert fit_of_file(MODEL, None, roomy, "cpu", Budget(max_seq_len=256)).kind == "cpu"
    monkeypatch.setattr(dialog_module, "machine_for_a_switch", lambda: tight)
    window.settings.device = "cpu"

    window.dialogs.open_model_manager(tab=2)
    table = window.dialogs.model_manager.local_table
    loaded, spare = _row_of(table, MODEL.name), _row_of(table, "other.gguf")
    qtbot.waitUntil(lambda: table.item(loaded, 6).text() != "" and table.item(spare, 6).text() != "",
                    timeout=TIMEOUT)
    assert table.item(loaded, 6).text() == "on the CPU" and "Loaded now" in table.item(loaded, 6).toolTip()
    assert table.item(spare, 6).text() == "on the CPU"  # planned with the loaded model's RAM free
    assert "256-token context (the one in use)" in window.dialogs.model_manager.machine_label.text()


def test_models_dialog_chooses_nothing_for_the_user(qtbot, window, tmp_path):
    """Issue 26, item 9 (part): no catalogue row (the first is a 15 GB download) is preselected
    and no button is the default (Enter starts nothing); a file's quant is its name's
    (Q4_K_M, not the header's Q4_K); a message of one tab goes when another is shown."""
    from PySide6.QtWidgets import QPushButton

    from support import FIXTURES

    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    shutil.copyfile(FIXTURES / "mistral3_q256-Q4_K_M.gguf", models / "mistral3_q256-Q4_K_M.gguf")
    window.dialogs.open_model_manager(tab=0)
    dialog = window.dialogs.model_manager
    assert dialog.catalog_table.selectedItems() == [] and not dialog.catalog_download.isEnabled()
    assert not [b.text() for b in dialog.findChildren(QPushButton) if b.isDefault() or b.autoDefault()]
    table = dialog.local_table
    row = _row_of(table, "mistral3_q256-Q4_K_M.gguf")
    assert table.item(row, 4).text() == "Q4_K_M"
    dialog.show_message("The hub could not be asked", error=True)
    dialog.tabs.setCurrentIndex(2)
    assert dialog.message.text() == ""


def test_models_already_on_this_computer_are_found(qtbot, window, tmp_path, monkeypatch):
    """Issue 26, item 9: a GGUF in Downloads, one in the Hugging Face cache (a snapshot's link
    to its blob) and an Ollama blob (no .gguf name, a GGUF inside) are listed without being
    opened first, each once, with where it was found; a non-GGUF blob is not."""
    import os

    from tramontane.app.model_places import usual_places

    home = tmp_path / "home"
    downloads = home / "Downloads"
    downloads.mkdir(parents=True)
    shutil.copyfile(MODEL, downloads / "tiny-from-the-browser.gguf")
    snapshot = home / ".cache" / "huggingface" / "hub" / "models--org--tiny" / "snapshots" / "abc"
    blobs = snapshot.parents[1] / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    shutil.copyfile(MODEL, blobs / "0123")
    os.symlink(blobs / "0123", snapshot / "tiny-Q8_0.gguf")
    ollama = home / ".ollama" / "models" / "blobs"
    ollama.mkdir(parents=True)
    shutil.copyfile(MODEL, ollama / "sha256-4f2a")
    (ollama / "sha256-manifest").write_text('{"not": "a model"}')
    places = [p for _what, p in usual_places(home=home, env={})]
    monkeypatch.setenv("TRAMONTANE_MODEL_PLACES", os.pathsep.join(map(str, places)))

    window.dialogs.open_model_manager(tab=2)
    table = window.dialogs.model_manager.local_table
    qtbot.waitUntil(lambda: table.rowCount() == 3, timeout=TIMEOUT)
    names = sorted(table.item(r, 0).text() for r in range(table.rowCount()))
    assert names == ["sha256-4f2a", "tiny-Q8_0.gguf", "tiny-from-the-browser.gguf"]
    where = table.item(_row_of(table, "tiny-from-the-browser.gguf"), 8).text()
    assert where.startswith("found in ") and str(downloads) in where


def test_help_lists_the_shortcuts_and_about_says_where_things_are(qtbot, window):
    load_and_wait(qtbot, window, MODEL, MMPROJ)  # About names the loaded model
    dialog = window.dialogs.show_shortcuts()
    text = dialog.findChild(QLabel).text()
    for keys, what in (("Ctrl+N", "New chat"), ("Ctrl+R", "Regenerate the last reply"), ("F1", "Keyboard shortcuts")):
        assert keys in text and what in text
    dialog.close()
    dialog = window.dialogs.show_about()
    text = dialog.findChild(QLabel).text()
    assert str(window.store.data_dir) in text and MODEL.name in text and "Apache-2.0" in text
    dialog.close()
