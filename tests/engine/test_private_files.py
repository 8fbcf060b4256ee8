"""Private by default: chats, photos, settings and partial downloads are created 0600 in 0700
folders whatever the umask, and a data folder left world-readable by an older version is
tightened when the store opens (on POSIX; Windows keeps its per-user profile ACLs)."""
import os
import stat

import pytest
from support.fakehub import MODEL_FILE, FakeHub, tiny_repos

from tramontane.app.store import Store
from tramontane.engine.api import ImagePart
from tramontane.engine.library.downloads import DownloadManager, DownloadRequest, DownloadState, final_path, part_path
from tramontane.engine.library.hub import Hub
from tramontane.engine.private_files import make_private_dir, restrict_umask, tighten_tree

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4"
       b"\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x04\x00\x09\xfb\x03\xfd\xe3U\xf2\x9c\x00\x00\x00\x00IEND\xaeB`\x82")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    """The most permissive common umask (022), as a desktop session has."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def every_path(root):
    for top, dirs, files in os.walk(root):
        yield top, True
        for f in files:
            yield os.path.join(top, f), False


def test_a_new_data_folder_and_everything_in_it_is_private(tmp_path, open_umask):
    os.chmod(tmp_path, 0o755)  # stands for the home folder
    data = tmp_path / "share" / "Tramontane"
    store = Store(data)
    try:
        chat = store.create_chat("secret")
        store.add_message(chat, "user", "my diagnosis", images=[ImagePart(data=PNG, name="scan.png")])
        seen = list(every_path(data))
        assert any(p.endswith("chats.sqlite3-wal") for p, _ in seen)  # SQLite's own files too
        assert any(p.endswith(".png") for p, _ in seen)
        for path, is_dir in seen:
            assert mode(path) == (0o700 if is_dir else 0o600), path
        assert mode(tmp_path / "share") == 0o700  # a parent we created ourselves
    finally:
        store.close()
    assert mode(tmp_path) == 0o755  # a parent that existed is not ours to change


def test_an_old_world_readable_data_folder_is_tightened_at_start(tmp_path, open_umask):
    data = tmp_path / "data"
    Store(data).close()
    (data / "images" / "ab").mkdir(parents=True)
    old_image = data / "images" / "ab" / "ab12.png"
    old_image.write_bytes(PNG)
    script = data / "hook.sh"
    script.write_text("#!/bin/sh\n")
    for path, is_dir in every_path(data):
        os.chmod(path, 0o755 if is_dir or path == str(script) else 0o644)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("x")
    os.symlink(outside, data / "link")  # links are not followed

    Store(data).close()
    for path, is_dir in every_path(data):
        if not os.path.islink(path):
            assert mode(path) == (0o700 if is_dir else 0o700 if path == str(script) else 0o600), path
    assert mode(outside) == 0o644
    assert tighten_tree(data) == 0  # nothing left to change


def test_partial_downloads_are_private_and_a_chosen_models_folder_is_left_alone(tmp_path, open_umask):
    models = tmp_path / "models"
    models.mkdir(mode=0o755)
    os.chmod(models, 0o755)
    with FakeHub(tiny_repos(tmp_path / "src"), chunk=8 << 10) as fake:
        fake.faults.delay_per_chunk_s = 0.01
        dm = DownloadManager(models, Hub(endpoint=fake.endpoint, token=False), retry_delay_s=0.01,
                             chunk_size=16 << 10)
        req = DownloadRequest("tiny-org/Tiny-Vision-GGUF", MODEL_FILE)
        dm.start(req)
        part = part_path(final_path(models, req))
        for _ in range(2000):
            if part.exists() and part.stat().st_size > 0:
                break
            dm.wait(req.key, 0.01)
        assert mode(part) == 0o600
        assert mode(part.with_name(part.name + ".json")) == 0o600  # the sidecar names repo and file
        fake.faults.delay_per_chunk_s = 0
        assert dm.wait(req.key, 60).state is DownloadState.DONE
    final = final_path(models, req)
    assert mode(final) == 0o600
    assert mode(final.parent) == 0o700  # folders the download created
    assert mode(models) == 0o755  # the user's folder, maybe shared with LM Studio: not changed


def test_the_app_entry_point_makes_later_files_private(tmp_path, open_umask):
    before = restrict_umask()
    try:
        assert before == 0o022
        (tmp_path / "export.md").write_text("chat")
        make_private_dir(tmp_path / "a" / "b")
        assert mode(tmp_path / "export.md") == 0o600 and mode(tmp_path / "a") == 0o700
    finally:
        os.umask(before)
