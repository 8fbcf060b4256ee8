"""The app's download manager: it outlives the Models dialog, and pairs come out ready to load."""
import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QCoreApplication, QEvent, Qt  # noqa: E402

from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos  # noqa: E402
from tramontane.app.dialogs.models import ModelManagerDialog  # noqa: E402
from tramontane.app.downloads import Downloads  # noqa: E402
from tramontane.engine.library.downloads import (DownloadRequest, DownloadState,  # noqa: E402
                                                 final_path)
from tramontane.engine.library.hub import Hub  # noqa: E402

REPO = "tiny-org/Tiny-Vision-GGUF"
TIMEOUT = 30_000


@pytest.fixture
def fake(tmp_path):
    with FakeHub(tiny_repos(tmp_path / "src")) as hub:
        yield hub


@pytest.fixture
def downloads(fake, tmp_path):
    d = Downloads(tmp_path / "models", Hub(endpoint=fake.endpoint, token=False))
    yield d
    d.shutdown()


def close_and_delete(dialog) -> None:
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.close()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def test_closing_the_models_dialog_does_not_pause_a_running_download(qtbot, fake, downloads, tmp_path):
    data = fake.repos[REPO].files[MODEL_FILE]
    fake.faults.stall_at[MODEL_FILE] = len(data) // 2  # running, half way, until released
    dialog = ModelManagerDialog(downloads=downloads, catalog=[])
    dialog.show()
    dialog.start_pair(downloads.hub.file_info(REPO, MODEL_FILE), None)
    key = DownloadRequest(REPO, MODEL_FILE).key
    qtbot.waitUntil(lambda: downloads.manager.status(key).done_bytes > 0, timeout=TIMEOUT)
    seen = []
    downloads.status_changed.connect(lambda st: seen.append(st.state))
    close_and_delete(dialog)
    qtbot.wait(300)  # a pause would show up here
    assert downloads.state(key) is DownloadState.RUNNING
    fake.faults.release.set()
    qtbot.waitUntil(lambda: downloads.state(key) is DownloadState.DONE, timeout=TIMEOUT)
    assert DownloadState.PAUSED not in seen
    assert final_path(tmp_path / "models", DownloadRequest(REPO, MODEL_FILE)).read_bytes() == data
    assert fake.served(MODEL_FILE) == len(data)  # one transfer, never restarted

    # Reopened, the dialog shows the finished download with its Load button.
    again = ModelManagerDialog(downloads=downloads, catalog=[])
    qtbot.addWidget(again)
    row = again._rows[key]
    assert row.state is DownloadState.DONE and not row.load_button.isHidden()
    with qtbot.waitSignal(again.load_requested, timeout=TIMEOUT) as sig:
        qtbot.mouseClick(row.load_button, Qt.MouseButton.LeftButton)
    assert sig.args == [str(final_path(tmp_path / "models", row.request)), ""]


def test_a_dialog_without_the_app_downloads_pauses_its_own_on_close(qtbot, fake, tmp_path):
    fake.faults.stall_at[MODEL_FILE] = 1000
    dialog = ModelManagerDialog(tmp_path / "models", hub=Hub(endpoint=fake.endpoint, token=False),
                                catalog=[])
    qtbot.addWidget(dialog)  # deleted after the test (its lambdas would keep it alive forever)
    own = dialog.downloads
    dialog.start_pair(own.hub.file_info(REPO, MODEL_FILE), None)
    key = DownloadRequest(REPO, MODEL_FILE).key
    qtbot.waitUntil(lambda: own.manager.status(key).done_bytes > 0, timeout=TIMEOUT)
    dialog.close()
    assert own.state(key) is DownloadState.PAUSED
    fake.faults.release.set()


def test_pair_ready_once_both_files_are_verified(qtbot, fake, downloads, tmp_path):
    hub = downloads.hub
    ready = []
    downloads.pair_ready.connect(lambda *args: ready.append(args))
    downloads.start_pair(hub.file_info(REPO, MODEL_FILE), hub.file_info(REPO, PROJ_FILE))
    qtbot.waitUntil(lambda: bool(ready), timeout=TIMEOUT)
    model = final_path(tmp_path / "models", DownloadRequest(REPO, MODEL_FILE))
    proj = final_path(tmp_path / "models", DownloadRequest(REPO, PROJ_FILE))
    assert ready == [(DownloadRequest(REPO, MODEL_FILE).key, str(model), str(proj))]
    assert model.is_file() and proj.is_file()
    assert not downloads.busy(REPO)


def test_the_window_owns_the_downloads(qtbot, fake, tmp_path, monkeypatch):
    from support.app_window import close_window, make_window

    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    window = make_window(qtbot, tmp_path / "data", load=False)
    window.settings.models_dir = str(tmp_path / "models")
    window.dialogs.open_model_manager()
    dialog = window.dialogs.model_manager
    assert dialog.downloads is window.dialogs.downloads and dialog.models_dir == tmp_path / "models"
    data = fake.repos[REPO].files[MODEL_FILE]
    fake.faults.stall_at[MODEL_FILE] = len(data) // 2
    dialog.start_pair(dialog.hub.file_info(REPO, MODEL_FILE), None)
    key = DownloadRequest(REPO, MODEL_FILE).key
    qtbot.waitUntil(lambda: window.dialogs.downloads.manager.status(key).done_bytes > 0, timeout=TIMEOUT)
    dialog.reject()  # Esc / Close: the dialog goes (WA_DeleteOnClose)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    qtbot.wait(300)
    assert window.dialogs.downloads.state(key) is DownloadState.RUNNING
    fake.faults.release.set()
    qtbot.waitUntil(lambda: window.dialogs.downloads.state(key) is DownloadState.DONE, timeout=TIMEOUT)
    assert fake.served(MODEL_FILE) == len(data)

    window.dialogs.open_model_manager()  # reopened: the same downloads, the finished one listed
    assert window.dialogs.model_manager.downloads is window.dialogs.downloads
    assert window.dialogs.model_manager._rows[key].state is DownloadState.DONE

    # Quitting pauses what still runs; its part stays for the next session.
    fake.faults.release.clear()
    other = "Tiny-Vision-Q4_0.gguf"
    fake.faults.stall_at[other] = 1000
    window.dialogs.model_manager.start_pair(window.dialogs.downloads.hub.file_info(REPO, other), None)
    other_key = DownloadRequest(REPO, other).key
    qtbot.waitUntil(lambda: window.dialogs.downloads.manager.status(other_key).done_bytes > 0,
                    timeout=TIMEOUT)
    downloads = window.dialogs.downloads
    close_window(window)
    assert downloads.state(other_key) is DownloadState.PAUSED
    assert [r.key for r in downloads.manager.unfinished_requests()] == [other_key]
    fake.faults.release.set()


def test_downloads_follow_the_models_folder_setting_when_idle(qtbot, fake, downloads, tmp_path):
    from tramontane.app.downloads import downloads_in

    assert downloads_in(downloads, tmp_path / "models") is downloads
    fake.faults.stall_at[MODEL_FILE] = 1000
    downloads.start_pair(downloads.hub.file_info(REPO, MODEL_FILE), None)
    key = DownloadRequest(REPO, MODEL_FILE).key
    qtbot.waitUntil(lambda: downloads.manager.status(key).done_bytes > 0, timeout=TIMEOUT)
    # busy: a running download finishes where it started
    assert downloads_in(downloads, tmp_path / "elsewhere") is downloads
    downloads.manager.pause(key)
    qtbot.waitUntil(lambda: downloads.state(key) is DownloadState.PAUSED, timeout=TIMEOUT)
    fake.faults.release.set()
    moved = downloads_in(downloads, tmp_path / "elsewhere")
    assert moved is not downloads and moved.models_dir == tmp_path / "elsewhere"
    assert moved.hub is downloads.hub  # the session's token stays
    moved.shutdown()
