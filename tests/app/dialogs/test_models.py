"""The model manager dialog, driven offscreen against the loopback fake hub."""

import pytest

from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos  # noqa: E402

from tramontane.engine.library.downloads import (DownloadManager, DownloadRequest,  # noqa: E402
                                         DownloadState, final_path, part_path)
from tramontane.engine.library.catalog import parse_catalog  # noqa: E402
from tramontane.engine.library.hub import Hub  # noqa: E402

pytest.importorskip("PySide6")
from tramontane.app.dialogs.models import ModelManagerDialog, describe_progress  # noqa: E402

REPO = "tiny-org/Tiny-Vision-GGUF"
TIMEOUT = 30_000


def qtbot_left():
    from PySide6.QtCore import Qt
    return Qt.LeftButton


@pytest.fixture
def fake(tmp_path):
    with FakeHub(tiny_repos(tmp_path / "src"), tokens={"hf_good"}) as hub:
        yield hub


def tiny_catalog():
    return parse_catalog({"models": [
        {"id": "tiny", "name": "Tiny Vision", "repo_id": REPO, "license": "MIT", "vision": True,
         "variants": [{"quant": "Q8_0", "file": MODEL_FILE, "size_gb": 0.0004, "memory_gb": 1}],
         "mmproj": {"file": PROJ_FILE, "size_gb": 0.0001}},
        {"id": "gated", "name": "Tiny Gated", "repo_id": "tiny-org/Tiny-Gated-GGUF",
         "license": "MIT", "variants": [{"quant": "Q8_0", "file": "Tiny-Gated-Q8_0.gguf"}]},
    ]})


@pytest.fixture
def dialog(qtbot, fake, tmp_path):
    dlg = ModelManagerDialog(tmp_path / "models", hub=Hub(endpoint=fake.endpoint, token=False),
                             catalog=tiny_catalog())
    qtbot.addWidget(dlg)
    dlg.show()
    yield dlg
    dlg.close()


def test_catalogue_download_then_one_click_load(qtbot, dialog, fake, tmp_path):
    models = tmp_path / "models"
    dialog.catalog_table.selectRow(0)
    assert dialog.catalog_download.isEnabled() and not dialog.catalog_load.isEnabled()
    qtbot.mouseClick(dialog.catalog_download, qtbot_left())
    model_key = DownloadRequest(REPO, MODEL_FILE).key
    qtbot.waitUntil(lambda: model_key in dialog._rows and
                    dialog._rows[model_key].load_button.isVisible(), timeout=TIMEOUT)
    assert dialog.catalog_table.item(0, 5).text() == "ready"
    assert dialog.catalog_load.isEnabled()
    with qtbot.waitSignal(dialog.load_requested, timeout=TIMEOUT) as sig:
        qtbot.mouseClick(dialog._rows[model_key].load_button, qtbot_left())
    model = final_path(models, DownloadRequest(REPO, MODEL_FILE))
    proj = final_path(models, DownloadRequest(REPO, PROJ_FILE))
    assert sig.args == [str(model), str(proj)]
    assert model.read_bytes() == fake.repos[REPO].files[MODEL_FILE]
    assert proj.read_bytes() == fake.repos[REPO].files[PROJ_FILE]
    with qtbot.waitSignal(dialog.load_requested, timeout=TIMEOUT) as sig:
        qtbot.mouseClick(dialog.catalog_load, qtbot_left())
    assert sig.args == [str(model), str(proj)]
    # the local tab lists both, paired
    names = {dialog.local_table.item(r, 0).text(): dialog.local_table.item(r, 5).text()
             for r in range(dialog.local_table.rowCount())}
    assert names == {MODEL_FILE: PROJ_FILE, PROJ_FILE: ""}
    dialog.grab().save(str(tmp_path / "catalogue.png"))


def test_search_pick_file_download_and_load_from_local_tab(qtbot, dialog, fake):
    dialog.tabs.setCurrentIndex(1)
    dialog.search_edit.setText("tiny")
    qtbot.mouseClick(dialog.search_button, qtbot_left())
    qtbot.waitUntil(lambda: dialog.results_table.rowCount() == 2, timeout=TIMEOUT)
    assert dialog.results_table.item(0, 0).text() == REPO
    assert "gated" in dialog.results_table.item(1, 2).text()
    dialog.results_table.selectRow(0)
    qtbot.waitUntil(lambda: dialog.files_table.rowCount() == 2, timeout=TIMEOUT)
    row = [dialog.files_table.item(r, 0).text() for r in range(2)].index("Tiny-Vision-Q4_0.gguf")
    assert dialog.files_table.item(row, 1).text() == "Q4_0"
    assert PROJ_FILE in dialog.files_table.item(row, 3).text()
    dialog.files_table.selectRow(row)
    qtbot.mouseClick(dialog.repo_download, qtbot_left())
    key = DownloadRequest(REPO, "Tiny-Vision-Q4_0.gguf").key
    qtbot.waitUntil(lambda: key in dialog._rows and
                    dialog._rows[key].state is DownloadState.DONE, timeout=TIMEOUT)
    dialog.tabs.setCurrentIndex(2)
    qtbot.waitUntil(lambda: dialog.local_table.rowCount() == 2, timeout=TIMEOUT)
    r = [dialog.local_table.item(i, 0).text() for i in range(2)].index("Tiny-Vision-Q4_0.gguf")
    dialog.local_table.selectRow(r)
    assert dialog.local_table.item(r, 3).text() == "Q4_0"
    with qtbot.waitSignal(dialog.load_requested, timeout=TIMEOUT) as sig:
        qtbot.mouseClick(dialog.local_load, qtbot_left())
    assert sig.args[0].endswith("Tiny-Vision-Q4_0.gguf") and sig.args[1].endswith(PROJ_FILE)


def test_pause_resume_cancel_buttons(qtbot, dialog, fake, tmp_path):
    fake.faults.delay_per_chunk_s = 0.03
    hub = dialog.hub
    model = hub.file_info(REPO, MODEL_FILE)
    dialog.start_pair(model, None)
    row = dialog._rows[DownloadRequest(REPO, MODEL_FILE).key]
    qtbot.waitUntil(lambda: row.state is DownloadState.RUNNING and row.bar.value() > 0,
                    timeout=TIMEOUT)
    assert "of" in row.detail.text()
    qtbot.mouseClick(row.pause_button, qtbot_left())
    qtbot.waitUntil(lambda: row.state is DownloadState.PAUSED, timeout=TIMEOUT)
    assert row.pause_button.text() == "Resume" and "paused" in row.detail.text()
    part = part_path(final_path(tmp_path / "models", row.request))
    assert part.exists()
    kept = part.stat().st_size
    assert kept == row.manager.status(row.key).done_bytes > 0
    fake.faults.delay_per_chunk_s = 0.0
    qtbot.mouseClick(row.pause_button, qtbot_left())
    qtbot.waitUntil(lambda: row.state is DownloadState.DONE, timeout=TIMEOUT)
    gets = [h.get("range") for m, p, h in fake.requests if m == "GET" and MODEL_FILE in p]
    assert gets[-1] == f"bytes={kept}-"  # the resume asked only for the rest
    assert final_path(tmp_path / "models", row.request).read_bytes() == \
        fake.repos[REPO].files[MODEL_FILE]
    # cancel a second one mid-way
    fake.faults.delay_per_chunk_s = 0.03
    dialog.start_pair(hub.file_info(REPO, "Tiny-Vision-Q4_0.gguf"), None)
    row2 = dialog._rows[DownloadRequest(REPO, "Tiny-Vision-Q4_0.gguf").key]
    qtbot.waitUntil(lambda: row2.bar.value() > 0, timeout=TIMEOUT)
    qtbot.mouseClick(row2.cancel_button, qtbot_left())
    qtbot.waitUntil(lambda: row2.state is DownloadState.CANCELLED, timeout=TIMEOUT)
    path2 = final_path(tmp_path / "models", row2.request)
    assert not path2.exists() and not part_path(path2).exists()
    assert row2.detail.text() == "cancelled"


def test_gated_error_in_words(qtbot, dialog):
    dialog.catalog_table.selectRow(1)
    qtbot.mouseClick(dialog.catalog_download, qtbot_left())
    key = DownloadRequest("tiny-org/Tiny-Gated-GGUF", "Tiny-Gated-Q8_0.gguf").key
    qtbot.waitUntil(lambda: "token" in dialog.message.text(), timeout=TIMEOUT)
    assert "license" in dialog.message.text()
    # resolve_catalog_entry lists the repo first; the file list of a gated repo is public,
    # so the error comes from the download itself.
    qtbot.waitUntil(lambda: key in dialog._rows and
                    dialog._rows[key].state is DownloadState.FAILED, timeout=TIMEOUT)
    row = dialog._rows[key]
    assert "token" in row.detail.text() and row.pause_button.text() == "Retry"
    dialog.hub.token = "hf_good"  # what the "Hub token…" button does
    qtbot.mouseClick(row.pause_button, qtbot_left())
    qtbot.waitUntil(lambda: row.state is DownloadState.DONE, timeout=TIMEOUT)


def test_unfinished_download_from_an_earlier_session_resumes(qtbot, fake, tmp_path):
    models = tmp_path / "models"
    size = len(fake.repos[REPO].files[MODEL_FILE])
    fake.faults.cut_at[MODEL_FILE] = [size // 2]
    hub = Hub(endpoint=fake.endpoint, token=False)
    first = DownloadManager(models, hub=hub, max_retries=0)
    first.start(DownloadRequest(REPO, MODEL_FILE))
    assert first.wait(DownloadRequest(REPO, MODEL_FILE).key, 30).state is DownloadState.FAILED
    first.shutdown()
    dlg = ModelManagerDialog(models, hub=hub, catalog=tiny_catalog())
    qtbot.addWidget(dlg)
    row = dlg._rows[DownloadRequest(REPO, MODEL_FILE).key]
    assert row.state is DownloadState.PAUSED and row.pause_button.text() == "Resume"
    assert row.bar.value() == 500
    qtbot.mouseClick(row.pause_button, qtbot_left())
    qtbot.waitUntil(lambda: row.state is DownloadState.DONE, timeout=TIMEOUT)
    assert fake.served(MODEL_FILE) == size
    assert final_path(models, row.request).read_bytes() == fake.repos[REPO].files[MODEL_FILE]
    dlg.close()


def test_offline_mode_shows_disk_only(qtbot, fake, tmp_path, monkeypatch):
    from support.fakehub import make_gguf_bytes
    models = tmp_path / "models"
    (models / "mine").mkdir(parents=True)
    make_gguf_bytes(models / "mine" / "own-Q8_0.gguf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dlg = ModelManagerDialog(models, hub=Hub(endpoint=fake.endpoint), catalog=tiny_catalog())
    qtbot.addWidget(dlg)
    assert dlg.tabs.currentIndex() == 2
    assert dlg.local_table.rowCount() == 1 and dlg.local_table.item(0, 3).text() == "Q8_0"
    assert not dlg.search_button.isEnabled() and not dlg.catalog_download.isEnabled()
    dlg.close()
    assert fake.requests == []


def test_describe_progress_words():
    req = DownloadRequest(REPO, MODEL_FILE)
    from tramontane.engine.library.downloads import DownloadStatus
    st = DownloadStatus(req.key, req, DownloadState.RUNNING, None, 3_200_000_000,
                        14_334_000_000, 41e6, 271.0)
    assert describe_progress(st) == "3.20 GB of 14.33 GB · 41.0 MB/s · 4 min 31 s left"


def test_import_and_delete_from_the_local_tab(qtbot, dialog, tmp_path):
    from support.fakehub import make_gguf_bytes
    src = tmp_path / "elsewhere" / "mine-Q4_0.gguf"
    src.parent.mkdir()
    make_gguf_bytes(src, quant="Q4_0", seed=7)
    dialog.import_file(str(src), copy=False)
    assert "Imported mine-Q4_0.gguf" in dialog.message.text()
    rows = {dialog.local_table.item(r, 0).text(): r for r in range(dialog.local_table.rowCount())}
    assert "imported in place" in dialog.local_table.item(rows["mine-Q4_0.gguf"], 6).text()
    dialog.local_table.selectRow(rows["mine-Q4_0.gguf"])
    with qtbot.waitSignal(dialog.load_requested, timeout=TIMEOUT) as sig:
        qtbot.mouseClick(dialog.local_load, qtbot_left())
    assert sig.args == [str(src.resolve()), ""]  # no projector beside it
    dialog.delete_file(src)
    assert src.exists() and dialog.local_table.rowCount() == 0
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    dialog.import_file(str(junk), copy=True)
    assert "junk.gguf" in dialog.message.text() and "color: #b00020" in dialog.message.styleSheet()
