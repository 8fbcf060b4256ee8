"""app/model_places.py: where other apps keep GGUF models, and the names they show them by."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import FIXTURES

from tramontane.app.model_places import find_models, hub_cache, ollama_name, shown_name, usual_places

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"


@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "xdg"}, {"XDG_CACHE_HOME": "xdg", "HF_HOME": "hf"},
                                 {"HF_HOME": "hf", "HF_HUB_CACHE": "hub-cache"}])
def test_the_hugging_face_cache_is_found_as_huggingface_hub_finds_it(tmp_path, env):
    """The reference is the hub library itself, asked in a process with that environment."""
    home = tmp_path / "home"
    env = {k: str(tmp_path / v) for k, v in env.items()}
    clean = {k: v for k, v in os.environ.items()
             if k not in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE")}
    out = subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"],
                         env={**clean, "HOME": str(home), **env}, capture_output=True, text=True, check=True)
    assert hub_cache(home, env) == Path(out.stdout.strip())


def test_jans_linux_folder_and_the_xdg_config_home_are_looked_in(tmp_path):
    home = tmp_path / "home"
    places = [p for _what, p in usual_places(home=home, env={})]
    assert home / ".config" / "Jan" / "data" / "llamacpp" / "models" in places
    places = [p for _what, p in usual_places(home=home, env={"XDG_CONFIG_HOME": str(tmp_path / "cfg")})]
    assert tmp_path / "cfg" / "Jan" / "data" / "llamacpp" / "models" in places
    jan = home / ".config" / "Jan" / "data" / "llamacpp" / "models" / "tiny"
    jan.mkdir(parents=True)
    shutil.copyfile(MODEL, jan / "model.gguf")
    assert [p for _w, p in find_models(usual_places(home=home, env={}))] == [jan / "model.gguf"]


def _ollama(tmp_path: Path) -> tuple[Path, Path]:
    """An Ollama models folder as Ollama lays it out: blobs by digest, manifests by name/tag."""
    models = tmp_path / ".ollama" / "models"
    blobs = models / "blobs"
    blobs.mkdir(parents=True)
    hexdigest = "db31" + "0" * 60
    blob = blobs / f"sha256-{hexdigest}"
    shutil.copyfile(MODEL, blob)
    config = blobs / ("sha256-" + "c" * 64)
    config.write_text("{}")

    def manifest(namespace: str, model: str, tag: str, digest: str) -> None:
        path = models / "manifests" / "registry.ollama.ai" / namespace / model / tag
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "c" * 64},
            "layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "e" * 64},
                       {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1}]}))

    manifest("library", "mistral-small3.1", "24b", "sha256:" + "f" * 64)  # another model's blob
    manifest("library", "ministral-3", "8b", f"sha256:{hexdigest}")
    return blob, config


def test_an_ollama_blob_is_listed_by_the_name_its_manifest_gives(tmp_path):
    blob, config = _ollama(tmp_path)
    assert ollama_name(blob) == "ministral-3:8b"
    assert shown_name(blob) == "ministral-3:8b"
    assert ollama_name(config) is None  # no manifest's model layer names it
    assert shown_name(MODEL) == MODEL.name
    (blob.parents[1] / "manifests" / "registry.ollama.ai" / "library" / "ministral-3" / "8b").write_text("{broken")
    assert shown_name(blob) == blob.name  # an unreadable manifest: the file's own name


def test_a_blob_pulled_from_a_user_namespace_keeps_the_namespace(tmp_path):
    blob, _ = _ollama(tmp_path)
    path = blob.parents[1] / "manifests" / "registry.ollama.ai" / "library" / "ministral-3" / "8b"
    moved = blob.parents[1] / "manifests" / "hf.co" / "someone" / "ministral-3-gguf" / "Q4_K_M"
    moved.parent.mkdir(parents=True)
    path.rename(moved)
    assert ollama_name(blob) == "someone/ministral-3-gguf:Q4_K_M"


def test_two_files_of_the_same_name_are_told_apart_by_their_folders(tmp_path):
    """Issue 35, item 8: two rows both "model.gguf", the folder cut in the middle."""
    from tramontane.app.model_places import distinct_names

    hub = tmp_path / "hub"
    a = hub / "models--org--tiny" / "snapshots" / "abc" / "model.gguf"
    b = hub / "models--org--small" / "snapshots" / "def" / "model.gguf"
    c = tmp_path / "Downloads" / "one" / "x" / "model.gguf"
    d = tmp_path / "Downloads" / "two" / "x" / "model.gguf"
    rows = [("model.gguf", a), ("model.gguf", b), ("other.gguf", c), ("model.gguf", c), ("model.gguf", d)]
    assert distinct_names(rows) == ["model.gguf — org/tiny", "model.gguf — org/small", "other.gguf",
                                    "model.gguf — one/x", "model.gguf — two/x"]
    assert distinct_names([("llama3:8b", a)]) == ["llama3:8b"]  # alone: as it is


def test_an_empty_list_says_where_it_looked(tmp_path):
    from tramontane.app.model_places import looked_in_words

    home = tmp_path / "home"
    places = usual_places(home=home, env={})
    words = looked_in_words(tmp_path / "models", places)
    assert words.startswith(f"No GGUF models found. Looked in the models folder ({tmp_path / 'models'}), "
                            f"Downloads ({home / 'Downloads'}), the Hugging Face cache (")
    for what, folder in places:
        assert f"{what} ({folder})" in words
    assert looked_in_words(None, []) == "No GGUF models found."


@pytest.fixture
def models_dialog(qtbot, tmp_path, monkeypatch):
    """The real Models dialog on its local tab, looking in `places` (set before it opens)."""
    pytest.importorskip("pytestqt")
    from support.fakehub import FakeHub, tiny_repos

    from tramontane.app.dialogs.models import ModelManagerDialog
    from tramontane.engine.library.catalog import parse_catalog
    from tramontane.engine.library.hub import Hub

    def open_with(*places):
        monkeypatch.setenv("TRAMONTANE_MODEL_PLACES", os.pathsep.join(map(str, places)))
        hub = stack.enter_context(FakeHub(tiny_repos(tmp_path / "src")))
        dlg = ModelManagerDialog(tmp_path / "models", hub=Hub(endpoint=hub.endpoint, token=False),
                                 catalog=parse_catalog({"models": []}))
        qtbot.addWidget(dlg)
        dlg.show()
        dlg.tabs.setCurrentIndex(2)
        opened.append(dlg)
        return dlg

    import contextlib

    opened: list = []
    with contextlib.ExitStack() as stack:
        yield open_with
        for dlg in opened:
            dlg.close()


def test_the_models_dialog_tells_two_snapshots_model_gguf_apart(qtbot, tmp_path, models_dialog):
    hub = tmp_path / "hub"
    for repo in ("models--org--tiny", "models--org--small"):
        snapshot = hub / repo / "snapshots" / "abc"
        snapshot.mkdir(parents=True)
        shutil.copyfile(MODEL, snapshot / "model.gguf")
    dlg = models_dialog(hub)
    table = dlg.local_table

    def names():
        return sorted(table.item(r, 0).text() for r in range(table.rowCount()))

    qtbot.waitUntil(lambda: table.rowCount() == 2, timeout=30000)
    assert names() == ["model.gguf — org/small", "model.gguf — org/tiny"]
    assert not dlg.local_empty.isVisible()


def test_the_models_dialog_says_where_it_looked_when_it_found_nothing(qtbot, tmp_path, models_dialog):
    from tramontane.app.model_places import looked_in_words

    nowhere = tmp_path / "Downloads"
    dlg = models_dialog(nowhere)
    qtbot.waitUntil(dlg.local_empty.isVisible, timeout=30000)
    assert dlg.local_table.rowCount() == 0
    assert dlg.local_empty.text() == looked_in_words(tmp_path / "models", [("elsewhere", nowhere)])
    assert str(nowhere) in dlg.local_empty.text() and str(tmp_path / "models") in dlg.local_empty.text()


def test_folders_under_the_home_folder_are_written_from_the_tilde(qtbot, tmp_path, monkeypatch, models_dialog):
    """The Models dialog said "Models folder: /home/you/.local/share/Tramontane/models" (in the
    README's picture, the tests' temporary folder); under the home folder it is written from ~,
    in the folder line and in the list of places looked in, and whole elsewhere."""
    from tramontane.app.model_places import home_path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_path(tmp_path / "models") == os.path.join("~", "models")
    assert home_path(tmp_path) == "~" and home_path("/usr/share/ollama") == "/usr/share/ollama"
    assert home_path(str(tmp_path) + "-other") == str(tmp_path) + "-other"  # a sibling, not inside
    nowhere = tmp_path / "Downloads"
    dlg = models_dialog(nowhere)
    assert dlg.folder_label.text() == f"Models folder: {os.path.join('~', 'models')}"
    qtbot.waitUntil(dlg.local_empty.isVisible, timeout=30000)
    assert dlg.local_empty.text() == ("No GGUF models found. Looked in the models folder "
                                      f"({os.path.join('~', 'models')}), elsewhere ({os.path.join('~', 'Downloads')}).")
