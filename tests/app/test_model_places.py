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
