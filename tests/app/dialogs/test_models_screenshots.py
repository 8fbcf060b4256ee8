"""Screenshots of the Models dialog (offscreen), light and dark: the shipped catalogue planned for
a simulated 8 GB GPU with 16 GB of system memory, and the local tab with the tiny fixture models
(one loaded, one opened from another folder). Checks what a look at them checks: every header
and every "On this machine" verdict shown whole, the loaded model marked, a "too big" in red.

    TRAMONTANE_SCREENSHOTS_DIR=docs pytest tests/app/dialogs/test_models_screenshots.py

also writes docs/models-{recommended,local}-{light,dark}.png.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.fakehub import FakeHub, tiny_repos  # noqa: E402
from tramontane.app.dialogs.models import ModelManagerDialog  # noqa: E402
from tramontane.app.config import AppSettings  # noqa: E402
from tramontane.app.widgets.theme import apply_color_scheme  # noqa: E402
from tramontane.app.store import Store  # noqa: E402
from tramontane.engine.library.hub import Hub  # noqa: E402
from tramontane.engine.runtime.device_map import DeviceInfo, Machine  # noqa: E402

GiB = 1 << 30
MACHINE = Machine((DeviceInfo("cuda:0", 8 * GiB, "GPU with 8 GB (simulated)"),),
                  DeviceInfo("cpu", 16 * GiB, "system memory (simulated)"))


def _whole(table, row: int, col: int) -> bool:
    """Whether the cell's text fits its column (Qt elides what does not): the text in the item's
    own font, plus the margins the style puts around a cell's text."""
    from PySide6.QtGui import QFontMetrics
    from PySide6.QtWidgets import QStyle

    item = table.item(row, col)
    margin = 2 * (table.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin) + 1)
    return QFontMetrics(item.font()).horizontalAdvance(item.text()) + margin <= table.columnWidth(col)


def _check_table(table) -> None:
    header = table.horizontalHeader()
    for c in range(table.columnCount() - 1):  # the last one stretches
        title = table.horizontalHeaderItem(c).text()
        assert header.fontMetrics().horizontalAdvance(title) + 6 <= header.sectionSize(c), title
    cols = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    fit = cols.index("On this machine")
    for r in range(table.rowCount()):
        assert _whole(table, r, fit) and _whole(table, r, 0), table.item(r, 0).text()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_models_dialog_screenshots(qtbot, tmp_path, scheme):
    app = QApplication.instance()
    apply_color_scheme(app, dark=scheme == "dark")
    models = tmp_path / "models" / "fixtures"
    models.mkdir(parents=True)
    for name in ("mistral3_tiny-f32.gguf", "mmproj-mistral3_tiny-f32.gguf", "mistral3_q256-Q4_K_M.gguf"):
        shutil.copyfile(FIXTURES / name, models / name)
    elsewhere = tmp_path / "Downloads"
    elsewhere.mkdir()
    shutil.copyfile(FIXTURES / "ministral3_tiny-f32.gguf", elsewhere / "ministral3_tiny-f32.gguf")
    store = Store(tmp_path / "data")
    settings = AppSettings(store)
    settings.last_model = (str(elsewhere / "ministral3_tiny-f32.gguf"), "")
    with FakeHub(tiny_repos(tmp_path / "src")) as fake:
        dlg = ModelManagerDialog(tmp_path / "models", hub=Hub(endpoint=fake.endpoint, token=False),
                                 settings=settings, machine=MACHINE,
                                 loaded_model=str(models / "mistral3_tiny-f32.gguf"),
                                 loaded_mmproj=str(models / "mmproj-mistral3_tiny-f32.gguf"))
        qtbot.addWidget(dlg)
        dlg.show()
        cat, local = dlg.catalog_table, dlg.local_table
        qtbot.waitUntil(lambda: all(cat.item(r, 4).text() for r in range(cat.rowCount()))
                        and all(local.item(r, 6).text() for r in range(local.rowCount())
                                if local.item(r, 2).text() == "model")
                        and all(cat.item(r, 3).toolTip() for r in range(cat.rowCount())), timeout=30_000)
        assert dlg.machine_label.text().startswith("This machine: cuda:0 GPU with 8 GB (simulated): 8.59 GB free")
        verdicts = {cat.item(r, 2).text() + " " + cat.item(r, 0).text().split(" (")[0]: cat.item(r, 4)
                    for r in range(cat.rowCount())}
        open_rows = {cat.item(r, 2).text() + " " + cat.item(r, 0).text().split(" (")[0] for r in range(cat.rowCount())
                     if not cat.item(r, 0).data(Qt.ItemDataRole.UserRole)[0].variant(cat.item(r, 2).text()).file}
        # the rows that pin no file (their sizes come from the repository's listing) say "?"
        assert open_rows and all(verdicts[k].text() == "?" for k in open_rows)
        assert {k: v.text() for k, v in verdicts.items() if k not in open_rows} == {
            "Q4_K_M Mistral Small 3.1 24B Instruct": "partly on the CPU",
            "Q8_0 Mistral Small 3.1 24B Instruct": "too big",  # 25 GB > 6.5 GB + 14 GB usable
            "Q4_K_M Ministral 3 3B Instruct": "on the GPU", "Q4_K_M Ministral 3 8B Instruct": "on the GPU",
            "Q4_K_M Ministral 3 14B Instruct": "partly on the CPU",
            "Q4_K_M Mistral Small 3.2 24B Instruct": "partly on the CPU",
            "Q8_0 Mistral Small 3.2 24B Instruct": "too big",
            "Q4_K_M Devstral Small 1.1 24B": "partly on the CPU",
            "Q4_K_M Ministral 3 8B Reasoning": "on the GPU", "Q4_K_M Ministral 3 14B Reasoning": "partly on the CPU"}
        red = verdicts["Q8_0 Mistral Small 3.1 24B Instruct"].foreground().color()
        assert red.red() > 150 and red.green() < 60
        shots = {}
        for index, tab in ((0, "recommended"), (2, "local")):
            dlg.tabs.setCurrentIndex(index)
            qtbot.wait(50)
            _check_table(cat if tab == "recommended" else local)
            shot = dlg.grab()
            path = tmp_path / f"models-{tab}-{scheme}.png"
            assert shot.save(str(path)) and path.stat().st_size > 10_000
            shots[tab] = shot
        loaded = [r for r in range(local.rowCount()) if local.item(r, 0).font().bold()]
        assert [local.item(r, 0).text() for r in loaded] == ["mistral3_tiny-f32.gguf  (loaded)"]
        # the background of the window follows the scheme (a dark grab is mostly dark)
        gray = shots["local"].toImage().pixelColor(5, dlg.height() - 5).lightness()
        assert (gray < 128) == (scheme == "dark")
        out = os.environ.get("TRAMONTANE_SCREENSHOTS_DIR")
        if out:
            for tab, shot in shots.items():
                shot.save(str(Path(out) / f"models-{tab}-{scheme}.png"))
        dlg.close()
    store.close()
    apply_color_scheme(app, dark=False)
