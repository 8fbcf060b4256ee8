"""The Models dialog's "Can" chips (issue 36 item 1), on the real dialog: a catalogue row's from the
catalogue's own fields (vision, and its reasoning / tools / coding capabilities); a file found on disk
from what is read from the file (its tokenizer's chat format: [THINK] / [/THINK] control tokens, a
[TOOL_CALLS] token; the projector paired beside it), coding only where the file is a catalogue model's."""
from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QCoreApplication, QEvent  # noqa: E402
from PySide6.QtWidgets import QWidget  # noqa: E402

from tramontane.app.dialogs.models import ModelManagerDialog, cell_chips  # noqa: E402
from tramontane.engine.gguf import open_gguf  # noqa: E402
from tramontane.engine.library.catalog import load_catalog  # noqa: E402
from tramontane.engine.library.hub import Hub  # noqa: E402
from tramontane.engine.mistral3.tokenizer import Tokenizer, read_chat_format  # noqa: E402
from tramontane.engine.runtime.device_map import DeviceInfo, Machine  # noqa: E402

from support import FIXTURES  # noqa: E402
from support.gguf_edit import rewrite_gguf  # noqa: E402

SHOTS = os.environ.get("TRAMONTANE_SHOTS")  # a folder: the two tabs' screenshots are saved there
MACHINE = Machine((), DeviceInfo("cpu", 64 << 30, "simulated"))
TINY = FIXTURES / "mistral3_tiny-f32.gguf"
PROJ = FIXTURES / "mmproj-mistral3_tiny-f32.gguf"


def thinking_copy(dst):
    """The tiny model as a reasoning model's file: slots 32-35 named [ARGS], [CALL_ID], [THINK],
    [/THINK] (control tokens already) and a v13 template, as Magistral's and Ministral 3 Reasoning's."""
    with open_gguf(TINY) as gf:
        tokens = list(gf.kv["tokenizer.ggml.tokens"])
    tokens[32:36] = ["[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"]
    return rewrite_gguf(TINY, dst, set_kv={"tokenizer.ggml.tokens": tokens,
                                           "tokenizer.chat_template": "[ARGS] [THINK]"})


def test_the_file_reading_tells_what_the_tokenizer_tells(tmp_path):
    for path in (TINY, thinking_copy(tmp_path / "thinker.gguf"), FIXTURES / "tekken_240911_tokenizer.gguf"):
        with open_gguf(path) as gf:
            fmt, tok = read_chat_format(gf.kv, str(path)), Tokenizer.from_gguf(gf)
        assert (fmt.version, fmt.can_think, fmt.tool_calls) == (tok.version, tok.can_think, tok.has_control("[TOOL_CALLS]"))
    with open_gguf(tmp_path / "thinker.gguf") as gf:
        assert (read_chat_format(gf.kv, "x").version, read_chat_format(gf.kv, "x").can_think) == (13, True)


@pytest.fixture
def dialog(qtbot, tmp_path):
    models = tmp_path / "models"
    (models / "fixtures").mkdir(parents=True)
    shutil.copyfile(TINY, models / "fixtures" / TINY.name)  # with its projector beside it
    shutil.copyfile(PROJ, models / "fixtures" / PROJ.name)
    thinking_copy(models / "thinker.gguf")
    shutil.copyfile(TINY, models / "Devstral-Small-2507-Q4_K_M.gguf")  # named as the catalogue's Devstral 1.1
    from tramontane.app.widgets.theme import style_sheet

    dlg = ModelManagerDialog(models, hub=Hub(endpoint="http://127.0.0.1:9", token=False, offline=True),
                             machine=MACHINE)
    dlg.setStyleSheet(style_sheet(False))  # the window's, which the dialog (its child) has in the app
    qtbot.addWidget(dlg)
    dlg.show()
    yield dlg
    dlg.close()


def test_catalogue_rows_show_the_catalogues_chips(dialog):
    t = dialog.catalog_table
    assert t.horizontalHeaderItem(1).text() == "Can"
    chips = {t.item(r, 0).data(0x0100)[0].id: cell_chips(t, r) for r in range(t.rowCount())}
    assert len(chips) == len(load_catalog())
    assert chips["magistral-small-1.2-24b"] == ["vision", "reasoning"]  # Unsloth's repository ships its encoder
    assert chips["ministral-3-8b-reasoning"] == ["vision", "reasoning", "tools"]
    assert chips["ministral-3-8b-instruct"] == ["vision", "tools"]
    assert chips["devstral-small-2507-24b"] == ["tools", "coding"]
    assert chips["mistral-small-3.1-24b-instruct"] == ["vision", "tools"]
    if SHOTS:
        dialog.tabs.setCurrentIndex(0)
        dialog.grab().save(os.path.join(SHOTS, "models-recommended-chips.png"))


def test_files_on_disk_show_what_is_read_from_them(qtbot, dialog):
    t = dialog.local_table
    dialog.tabs.setCurrentIndex(2)
    assert t.horizontalHeaderItem(1).text() == "Can"

    def rows():
        return {t.item(r, 0).text(): r for r in range(t.rowCount())}

    qtbot.waitUntil(lambda: "reasoning" in cell_chips(t, rows()["thinker.gguf"]), timeout=30_000)
    r = rows()
    assert cell_chips(t, r["thinker.gguf"]) == ["reasoning", "tools"]
    assert "chat format v13 with [THINK] / [/THINK]" in t.cellWidget(r["thinker.gguf"], 1).toolTip()
    assert cell_chips(t, r[TINY.name]) == ["vision", "tools"]  # its projector is paired beside it
    tip = t.cellWidget(r[TINY.name], 1).toolTip()
    assert "chat format v7" in tip and f"the projector {PROJ.name} is paired" in tip
    assert cell_chips(t, r["Devstral-Small-2507-Q4_K_M.gguf"]) == ["tools", "coding"]
    assert "the catalogue's Devstral Small 1.1" in t.cellWidget(r["Devstral-Small-2507-Q4_K_M.gguf"], 1).toolTip()
    assert cell_chips(t, r[PROJ.name]) == []  # a projector is no model
    # the cells the rows had before the files were read are gone (deleted later, as Qt's event loop
    # does: a test's waiting only processes events)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert len(t.viewport().findChildren(QWidget, "chips")) == 3  # one per model file, none for the projector
    if SHOTS:
        dialog.grab().save(os.path.join(SHOTS, "models-local-chips.png"))
