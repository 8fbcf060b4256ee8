"""The model manager dialog, driven offscreen against the loopback fake hub."""

import shutil

import pytest

from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos  # noqa: E402

from tramontane.engine.library.downloads import (DownloadManager, DownloadRequest,  # noqa: E402
                                         DownloadState, final_path, part_path)
from tramontane.engine.library.catalog import parse_catalog  # noqa: E402
from tramontane.engine.library.hub import Hub  # noqa: E402

pytest.importorskip("PySide6")
from tramontane.app.dialogs.models import ModelManagerDialog, describe_progress  # noqa: E402
from tramontane.engine.library.catalog import load_catalog  # noqa: E402
from tramontane.engine.runtime.device_map import DeviceInfo, Machine  # noqa: E402
from support import FIXTURES  # noqa: E402

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
    assert dialog.catalog_table.item(0, 6).text() == "ready"
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
    # the local tab lists both, paired (it is refreshed by a job after each finished download:
    # the last refresh may still be on its way)
    def local_rows():
        return {dialog.local_table.item(r, 0).text(): dialog.local_table.item(r, 7).text()
                for r in range(dialog.local_table.rowCount())}

    qtbot.waitUntil(lambda: local_rows() == {MODEL_FILE: PROJ_FILE, PROJ_FILE: ""}, timeout=TIMEOUT)
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
    assert dialog.local_table.item(r, 4).text() == "Q4_0"
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
    assert dlg.local_table.rowCount() == 1 and dlg.local_table.item(0, 4).text() == "Q8_0"
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
    assert "imported in place" in dialog.local_table.item(rows["mine-Q4_0.gguf"], 8).text()
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


# ---------------------------------------------------------------------------------------
# issue 18 (loaded model, double-click, remembered choices, files opened lately, sizes) and
# issue 16 (fits this machine, from the engine's planner)

GiB = 1 << 30
GPU8 = Machine((DeviceInfo("cuda:0", 8 * GiB, "simulated 8 GB"),), DeviceInfo("cpu", 64 * GiB, "simulated"))


def _open(qtbot, tmp_path, hub, **kw) -> ModelManagerDialog:
    kw.setdefault("catalog", tiny_catalog())
    dlg = ModelManagerDialog(tmp_path / "models", hub=hub, **kw)
    qtbot.addWidget(dlg)
    dlg.show()
    return dlg


def _column(table, row: int, title: str) -> str:
    cols = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    return table.item(row, cols.index(title)).text()


def _catalogue_rows(dlg) -> dict[tuple[str, str], int]:
    t = dlg.catalog_table
    return {(t.item(r, 0).data(0x0100)[0].id, t.item(r, 2).text()): r for r in range(t.rowCount())}


def _tiny_pair(folder):
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "mistral3_tiny-f32.gguf"
    proj = folder / "mmproj-mistral3_tiny-f32.gguf"
    shutil.copyfile(FIXTURES / model.name, model)
    shutil.copyfile(FIXTURES / proj.name, proj)
    return model, proj


def test_every_catalogue_entry_has_a_size_and_says_whether_it_fits(qtbot, fake, tmp_path):
    """The shipped catalogue's entries that pin their files, on a simulated 8 GB GPU + 64 GB
    machine (the others' sizes come from the listing: the test below). The verdicts are those of
    the planner on the real tensor inventories (tests/engine/library/test_fit.py checks the
    estimates against them): Mistral Small 24B needs 16 of 40 layers on the CPU, Ministral 3
    14B 10 of 40; 3B and 8B fit the GPU."""
    pinned = [e for e in load_catalog() if all(v.size_gb for v in e.variants)
              and (e.mmproj_size_gb or not e.vision)]
    dlg = _open(qtbot, tmp_path, Hub(endpoint=fake.endpoint, token=False), catalog=pinned,
                machine=GPU8)
    rows = _catalogue_rows(dlg)
    t = dlg.catalog_table
    qtbot.waitUntil(lambda: all(_column(t, r, "On this machine") for r in rows.values()), timeout=TIMEOUT)
    words = {key: _column(t, r, "On this machine") for key, r in rows.items()}
    assert dlg.machine_label.text().startswith(
        "This machine: cuda:0 simulated 8 GB: 8.59 GB free · simulated: 68.72 GB free. Planned for a 4096")
    assert words == {("mistral-small-3.1-24b-instruct", "Q4_K_M"): "partly on the CPU",
                     ("mistral-small-3.1-24b-instruct", "Q8_0"): "partly on the CPU",
                     ("ministral-3-3b-instruct", "Q4_K_M"): "on the GPU",
                     ("ministral-3-8b-instruct", "Q4_K_M"): "on the GPU",
                     ("ministral-3-14b-instruct", "Q4_K_M"): "partly on the CPU",
                     ("mistral-small-3.2-24b-instruct", "Q4_K_M"): "partly on the CPU",
                     ("mistral-small-3.2-24b-instruct", "Q8_0"): "partly on the CPU"}
    sizes = {key: _column(t, r, "Download") for key, r in rows.items()}
    # every vision row says "+ projector" (issue 26, item 9): with the size once it is known
    assert sizes[("mistral-small-3.1-24b-instruct", "Q4_K_M")] == "14.33 GB + 878.0 MB projector"
    assert sizes[("ministral-3-8b-instruct", "Q4_K_M")] == "5.20 GB + 858.0 MB projector"
    assert sizes[("ministral-3-3b-instruct", "Q4_K_M")] == "2.15 GB + 842.0 MB projector"
    assert sizes[("mistral-small-3.2-24b-instruct", "Q8_0")] == "25.05 GB + 878.0 MB projector"
    assert "?" not in sizes.values()
    # the tooltip holds the planner's arithmetic
    tip = t.item(rows[("mistral-small-3.1-24b-instruct", "Q4_K_M")], 4).toolTip()
    assert "cuda:0 (simulated 8 GB)" in tip and "layers on GPU" in tip
    # every size is in the catalogue (Ministral's projectors too): the hub is not asked for them
    assert t.item(rows[("ministral-3-8b-instruct", "Q4_K_M")], 3).toolTip() == "model 5.20 GB + projector 858.0 MB"
    assert not dlg.listed
    dlg.close()


def test_cpu_only_and_too_small_machines(qtbot, fake, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing listed: the catalogue's sizes alone
    hub = Hub(endpoint=fake.endpoint)
    small = Machine((), DeviceInfo("cpu", 12 * GiB, "simulated 12 GB"))
    dlg = _open(qtbot, tmp_path, hub, catalog=load_catalog(), machine=small)
    rows, t = _catalogue_rows(dlg), dlg.catalog_table
    qtbot.waitUntil(lambda: all(_column(t, r, "On this machine") for r in rows.values()), timeout=TIMEOUT)
    assert _column(t, rows[("mistral-small-3.1-24b-instruct", "Q8_0")], "On this machine") == "too big"
    assert "does not fit this machine" in t.item(rows[("mistral-small-3.1-24b-instruct", "Q8_0")], 4).toolTip()
    assert _column(t, rows[("ministral-3-3b-instruct", "Q4_K_M")], "On this machine") == "on the CPU"
    dlg.close()
    assert fake.requests == []


def test_sizes_the_catalogue_leaves_open_come_from_the_hub_listing(qtbot, fake, tmp_path):
    catalog = parse_catalog({"models": [
        {"id": "open", "name": "Tiny, sizes open", "repo_id": REPO, "license": "MIT", "vision": True,
         "variants": [{"quant": "Q8_0", "file": None}], "mmproj": {"file": PROJ_FILE},
         "shape": {"layers": 2, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16,
                   "vocab": 256, "tied": False}}]})
    dlg = _open(qtbot, tmp_path, Hub(endpoint=fake.endpoint, token=False), catalog=catalog, machine=GPU8)
    files = fake.repos[REPO].files
    from tramontane.engine.library.downloads import size_text
    shown = f"{size_text(len(files[MODEL_FILE]))} + {size_text(len(files[PROJ_FILE]))} projector"
    qtbot.waitUntil(lambda: dlg.catalog_table.item(0, 3).text() == shown, timeout=TIMEOUT)
    assert dlg.listed[("open", "Q8_0")] == (len(files[MODEL_FILE]), len(files[PROJ_FILE]))
    qtbot.waitUntil(lambda: dlg.catalog_table.item(0, 4).text() == "on the GPU", timeout=TIMEOUT)
    dlg.close()


def test_loaded_model_is_marked_and_double_click_loads(qtbot, fake, tmp_path):
    model, proj = _tiny_pair(tmp_path / "models" / "mine")
    dlg = _open(qtbot, tmp_path, Hub(endpoint=fake.endpoint, token=False), machine=GPU8,
                loaded_model=str(model))
    dlg.tabs.setCurrentIndex(2)
    t = dlg.local_table
    row = next(r for r in range(t.rowCount()) if t.item(r, 0).data(0x0100).path == model.resolve())
    assert t.item(row, 0).text() == "mistral3_tiny-f32.gguf  (loaded)" and t.item(row, 0).font().bold()
    qtbot.waitUntil(lambda: _column(t, row, "On this machine") == "on the GPU", timeout=TIMEOUT)
    assert "vision tower" in t.item(row, 6).toolTip()  # planned with its projector
    proj_row = 1 - row
    assert _column(t, proj_row, "On this machine") == "" and not t.item(proj_row, 0).font().bold()
    # a double-click on the projector does nothing; on the model it loads the pair
    with qtbot.assertNotEmitted(dlg.load_requested):
        _double_click(qtbot, t, proj_row)
    with qtbot.waitSignal(dlg.load_requested, timeout=TIMEOUT) as sig:
        _double_click(qtbot, t, row)
    assert sig.args == [str(model.resolve()), str(proj.resolve())]
    dlg.set_loaded_model(None)
    assert "(loaded)" not in t.item(row, 0).text()
    dlg.close()


def _double_click(qtbot, table, row: int) -> None:
    from PySide6.QtWidgets import QApplication
    qtbot.wait(QApplication.doubleClickInterval() + 50)  # not part of an earlier double-click
    rect = table.visualRect(table.model().index(row, 0))
    qtbot.mouseClick(table.viewport(), qtbot_left(), pos=rect.center())  # selects the row
    qtbot.mouseDClick(table.viewport(), qtbot_left(), pos=rect.center())


def test_catalogue_row_marked_loaded_and_double_click_loads(qtbot, fake, tmp_path):
    models = tmp_path / "models"
    hub = Hub(endpoint=fake.endpoint, token=False)
    pair = [hub.file_info(REPO, MODEL_FILE), hub.file_info(REPO, PROJ_FILE)]
    dlg = _open(qtbot, tmp_path, hub, machine=GPU8)
    with qtbot.assertNotEmitted(dlg.load_requested):  # not downloaded yet
        _double_click(qtbot, dlg.catalog_table, 0)
    dlg.start_pair(*pair)
    qtbot.waitUntil(lambda: dlg.catalog_table.item(0, 6).text() == "ready", timeout=TIMEOUT)
    model = final_path(models, DownloadRequest(REPO, MODEL_FILE))
    with qtbot.waitSignal(dlg.load_requested, timeout=TIMEOUT) as sig:
        _double_click(qtbot, dlg.catalog_table, 0)
    assert sig.args[0] == str(model)
    dlg.set_loaded_model(str(model))
    assert dlg.catalog_table.item(0, 6).text() == "loaded"
    # downloaded: planned from the file itself now
    qtbot.waitUntil(lambda: "vision tower" in dlg.catalog_table.item(0, 4).toolTip(), timeout=TIMEOUT)
    dlg.close()


def test_tab_and_copy_choice_are_remembered(qtbot, fake, tmp_path, settings):
    hub = Hub(endpoint=fake.endpoint, token=False)
    first = _open(qtbot, tmp_path, hub, settings=settings, machine=GPU8)
    assert first.tabs.currentIndex() == 0 and not first.local_copy.isChecked()
    first.tabs.setCurrentIndex(2)
    first.local_copy.setChecked(True)
    first.close()
    second = _open(qtbot, tmp_path, hub, settings=settings, machine=GPU8)
    assert second.tabs.currentIndex() == 2 and second.local_copy.isChecked()
    second.local_copy.setChecked(False)
    second.close()
    assert (settings.models_tab, settings.import_copy) == (2, False)


def test_files_opened_from_elsewhere_are_listed_and_can_be_forgotten(qtbot, fake, tmp_path, settings):
    model, proj = _tiny_pair(tmp_path / "elsewhere")
    settings.last_model = (str(model), str(proj))  # what the window does after a File → Open load
    settings.recent_models = settings.recent_models + [str(tmp_path / "gone.gguf")]  # deleted since
    dlg = _open(qtbot, tmp_path, Hub(endpoint=fake.endpoint, token=False), settings=settings,
                machine=GPU8)
    t = dlg.local_table
    assert t.rowCount() == 1  # the model (its projector is paired, not listed apart); not the gone file
    assert t.item(0, 0).text() == model.name and _column(t, 0, "Projector") == proj.name
    assert _column(t, 0, "Folder") == f"opened from: {model.parent.resolve()}"
    qtbot.waitUntil(lambda: _column(t, 0, "On this machine") == "on the GPU", timeout=TIMEOUT)
    t.selectRow(0)
    with qtbot.waitSignal(dlg.load_requested, timeout=TIMEOUT) as sig:
        qtbot.mouseClick(dlg.local_load, qtbot_left())
    assert sig.args == [str(model.resolve()), str(proj.resolve())]
    dlg.delete_file(model)
    assert model.exists() and t.rowCount() == 0 and "left where it is" in dlg.message.text()
    assert str(model) not in settings.recent_models
    dlg.close()


def test_the_hub_is_asked_for_open_sizes_once_per_session(qtbot, fake, tmp_path):
    from tramontane.engine.library.downloads import size_text
    from tramontane.app.downloads import Downloads
    catalog = parse_catalog({"models": [
        {"id": "open", "name": "Tiny, sizes open", "repo_id": REPO, "license": "MIT",
         "variants": [{"quant": "Q8_0", "file": None}]}]})
    downloads = Downloads(tmp_path / "models", Hub(endpoint=fake.endpoint, token=False))
    def listings():
        return [p for _, p, _ in fake.requests if "/tree/" in p]

    size = len(fake.repos[REPO].files["Tiny-Vision-Q8_0.gguf"])
    for _ in range(2):
        dlg = ModelManagerDialog(downloads=downloads, catalog=catalog, machine=GPU8)
        qtbot.addWidget(dlg)
        qtbot.waitUntil(lambda d=dlg: d.catalog_table.item(0, 3).text() == size_text(size), timeout=TIMEOUT)
        dlg.close()
    assert len(listings()) == 1
    downloads.shutdown()


def test_the_loaded_models_ram_is_counted_free_once(qtbot, fake, tmp_path, monkeypatch):
    """Issue 35, item 2: with a model loaded the dialog said 35.9 GB free on a 23.5 GB machine:
    the RAM the loaded model holds was added to the planned machine, then again for the label,
    and once more by every later plan (a refresh)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    machine = Machine((), DeviceInfo("cpu", 10 * 10**9, "system memory"))
    dlg = _open(qtbot, tmp_path, Hub(endpoint=fake.endpoint), machine=machine, freed_bytes=4 * 10**9)
    qtbot.waitUntil(lambda: "free" in dlg.machine_label.text(), timeout=TIMEOUT)
    assert dlg.machine_label.text().startswith("This machine: system memory: 14.00 GB free.")
    dlg.machine_label.setText("")
    dlg.refresh_local()  # plans again
    qtbot.waitUntil(lambda: "free" in dlg.machine_label.text(), timeout=TIMEOUT)
    assert dlg.machine_label.text().startswith("This machine: system memory: 14.00 GB free.")
    dlg.close()


def test_refresh_looks_in_the_other_apps_places_again_and_names_ollama_blobs(qtbot, fake, tmp_path, monkeypatch):
    """Issue 35, item 8: Refresh finds a model put in another app's folder after the dialog
    opened (it only looked once), and an Ollama blob is listed by its manifest's name."""
    import json
    import os

    from support.fakehub import make_gguf_bytes
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    blobs = tmp_path / "ollama" / "models" / "blobs"
    blobs.mkdir(parents=True)
    make_gguf_bytes(blobs / ("sha256-" + "ab" * 32), quant="Q4_0", seed=3)
    manifest = tmp_path / "ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "ministral-3" / "3b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": "sha256:" + "ab" * 32}]}))
    monkeypatch.setenv("TRAMONTANE_MODEL_PLACES", os.pathsep.join(map(str, (downloads, blobs))))
    dlg = ModelManagerDialog(tmp_path / "models", hub=Hub(endpoint=fake.endpoint, token=False), catalog=tiny_catalog())
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.tabs.setCurrentIndex(2)
    table = dlg.local_table

    def names():
        return sorted(table.item(r, 0).text() for r in range(table.rowCount()))

    qtbot.waitUntil(lambda: names() == ["ministral-3:3b"], timeout=TIMEOUT)
    make_gguf_bytes(downloads / "later-Q4_0.gguf", quant="Q4_0", seed=4)
    qtbot.mouseClick(dlg.local_refresh, qtbot_left())
    qtbot.waitUntil(lambda: names() == ["later-Q4_0.gguf", "ministral-3:3b"], timeout=TIMEOUT)
    (downloads / "later-Q4_0.gguf").unlink()
    qtbot.mouseClick(dlg.local_refresh, qtbot_left())
    qtbot.waitUntil(lambda: names() == ["ministral-3:3b"], timeout=TIMEOUT)
    dlg.close()
