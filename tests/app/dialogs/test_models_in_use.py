"""Issue 35, items 8 and 10, in the Models dialog: the loaded model's row shows the projector it
runs with (an f32 picked by hand), not the f16 its name pairs it with; a long folder keeps its
end ('…/data/llamacpp/models', not 'opene…tures'), the whole path in the tooltip; Ministral's
"+ projector" has its size, the publisher's."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QStyleOptionViewItem  # noqa: E402

from support import FIXTURES  # noqa: E402
from tramontane.app.dialogs.models import ModelManagerDialog  # noqa: E402
from tramontane.engine.library.catalog import load_catalog  # noqa: E402
from tramontane.engine.library.fit import catalog_bytes  # noqa: E402
from tramontane.engine.library.hub import Hub  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def column(table, row: int, title: str) -> int:
    return [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())].index(title)


def pair_in(folder):
    """The tiny model with both its projectors beside it: the f16 is the one the name rule pairs."""
    folder.mkdir(parents=True)
    for name in ("mistral3_tiny-f32.gguf", "mmproj-mistral3_tiny-f16.gguf", "mmproj-mistral3_tiny-f32.gguf"):
        shutil.copyfile(FIXTURES / name, folder / name)
    return folder / "mistral3_tiny-f32.gguf", folder / "mmproj-mistral3_tiny-f16.gguf", folder / "mmproj-mistral3_tiny-f32.gguf"


def open_dialog(qtbot, models, **kw):
    dlg = ModelManagerDialog(models, hub=Hub(endpoint="http://127.0.0.1:9", token=False), catalog=[], **kw)
    qtbot.addWidget(dlg)
    dlg.show()
    return dlg


def test_the_loaded_models_row_shows_the_projector_in_use(qtbot, tmp_path):
    model, f16, f32 = pair_in(tmp_path / "models")
    dlg = open_dialog(qtbot, tmp_path / "models")
    t = dlg.local_table
    (row,) = [r for r in range(t.rowCount()) if t.item(r, 0).text().startswith(model.name)]
    assert t.item(row, column(t, row, "Projector")).text() == f16.name  # nothing loaded: the pairing's
    dlg.set_loaded_model(str(model), str(f32))
    (row,) = [r for r in range(t.rowCount()) if t.item(r, 0).text().startswith(model.name)]
    cell = t.item(row, column(t, row, "Projector"))
    assert "(loaded)" in t.item(row, 0).text()
    assert cell.text() == f32.name and str(f32) in cell.toolTip()
    dlg.set_loaded_model(str(model), None)  # loaded text only
    cell = t.item(row, column(t, row, "Projector"))
    assert cell.text() == "none (text only)"
    dlg.close()


def test_the_window_tells_the_dialog_which_projector_is_loaded(qtbot, idle_window, tmp_path):
    window = idle_window
    model, f16, f32 = pair_in(tmp_path / "picked")
    window.model_loading.load_model(str(model), str(f32), check=False)
    qtbot.waitUntil(lambda: window.session.engine_info is not None, timeout=30000)
    window.dialogs.open_model_manager()
    dlg = window.dialogs.model_manager
    t = dlg.local_table
    rows = [r for r in range(t.rowCount()) if "(loaded)" in t.item(r, 0).text()]
    assert len(rows) == 1
    assert t.item(rows[0], column(t, rows[0], "Projector")).text() == f32.name
    dlg.close()


def test_a_long_folder_keeps_its_end(qtbot, tmp_path):
    deep = tmp_path / "models" / ("a-long-folder-name-" * 6) / "data" / "llamacpp" / "models"
    model, _f16, _f32 = pair_in(deep)
    dlg = open_dialog(qtbot, tmp_path / "models")
    t = dlg.local_table
    (row,) = [r for r in range(t.rowCount()) if t.item(r, 0).text().startswith(model.name)]
    col = column(t, row, "Folder")
    index = t.model().index(row, col)
    option = QStyleOptionViewItem()
    t.itemDelegateForColumn(col).initStyleOption(option, index)
    assert option.textElideMode == Qt.TextElideMode.ElideLeft
    # what the cell shows at its width: the end of the path, after "…"
    shown = option.fontMetrics.elidedText(option.text, option.textElideMode, 200)
    assert shown.startswith("…") and shown.endswith("llamacpp/models")
    assert str(model) in t.item(row, col).toolTip()
    dlg.close()


def test_ministral_projectors_have_their_published_sizes():
    """The BF16 projectors of Mistral AI's Ministral 3 GGUF repositories, in bytes as listed
    there: 841,501,856 (3B), 858,283,168 (8B) and 879,258,784 (14B)."""
    by_id = {e.id: e for e in load_catalog()}
    published = {"ministral-3-3b-instruct": 841_501_856, "ministral-3-8b-instruct": 858_283_168,
                 "ministral-3-14b-instruct": 879_258_784}
    for entry_id, size in published.items():
        e = by_id[entry_id]
        _model, mmproj = catalog_bytes(e, "Q4_K_M")
        assert abs(mmproj - size) <= 500_000, entry_id  # the catalogue's GB have 3 decimals
