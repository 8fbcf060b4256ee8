"""GGUF models already on this computer outside the models folder: the places other apps and
browsers put them (Downloads, the Hugging Face cache, LM Studio, Jan, Ollama's blobs, which
are GGUF files named by their hash). Looked for as a job, off the UI thread."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..env import read_env

GGUF_MAGIC = b"GGUF"
MAX_DEPTH = 6  # the Hugging Face cache nests models--org--name/snapshots/<hash>/file.gguf
MAX_FILES = 200


def hub_cache(home: Path, env=os.environ) -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it: HF_HUB_CACHE, else
    HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else home / ".cache"
    return cache / "huggingface" / "hub"


def usual_places(home: Path | None = None, env=os.environ) -> list[tuple[str, Path]]:
    """(what, folder) of every place looked in, existing or not."""
    chosen = read_env(env).model_places  # TRAMONTANE_MODEL_PLACES: these folders instead
    if chosen is not None:
        return [("elsewhere", p) for p in chosen]
    home = home or Path.home()
    config = Path(env["XDG_CONFIG_HOME"]).expanduser() if env.get("XDG_CONFIG_HOME") else home / ".config"
    return [
        ("Downloads", home / "Downloads"),
        ("the Hugging Face cache", hub_cache(home, env)),
        ("LM Studio", home / ".lmstudio" / "models"),
        ("LM Studio", home / ".cache" / "lm-studio" / "models"),
        ("Jan", home / "jan" / "models"),
        ("Jan", home / ".local" / "share" / "Jan" / "data" / "models"),
        ("Jan", config / "Jan" / "data" / "llamacpp" / "models"),  # Jan's Linux app (llama.cpp engine)
        ("Ollama", home / ".ollama" / "models" / "blobs"),
        ("Ollama", Path("/usr/share/ollama/.ollama/models/blobs")),
    ]


OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
MAX_MANIFEST_BYTES = 1 << 20


def ollama_name(blob: Path) -> str | None:
    """The model name Ollama shows for one of its blobs (`blobs/sha256-<hex>`), from its
    manifests (`manifests/<registry>/<namespace>/<model>/<tag>`, JSON whose model layer's
    digest is `sha256:<hex>`): "model:tag", or "namespace/model:tag" outside the library
    namespace; None when no manifest names it."""
    if not blob.name.startswith("sha256-"):
        return None
    digest = "sha256:" + blob.name[len("sha256-"):]
    manifests = blob.parent.parent / "manifests"
    if not manifests.is_dir():
        return None
    for path in sorted(manifests.rglob("*")):
        rel = path.relative_to(manifests).parts
        if len(rel) != 4 or not path.is_file():
            continue
        try:
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                continue
            layers = json.loads(path.read_text(encoding="utf-8")).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        if any(isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER
               and layer.get("digest") == digest for layer in layers):
            _registry, namespace, model, tag = rel
            return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return None


def shown_name(path: Path) -> str:
    """The name a found model file is listed by: Ollama's model name for its blobs, else the file's."""
    return ollama_name(path) or path.name


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def find_models(places: list[tuple[str, Path]], skip: set[Path] = frozenset()) -> list[tuple[str, Path]]:
    """(what, file) of the GGUF files in `places`: files named *.gguf, and in Ollama's blobs the
    files whose first bytes say GGUF. Each file once (by its resolved path), none of `skip`."""
    found: list[tuple[str, Path]] = []
    seen = {p.resolve() for p in skip}
    for what, folder in places:
        if not folder.is_dir():
            continue
        for root, dirs, files in os.walk(folder):
            depth = len(Path(root).relative_to(folder).parts)
            if depth >= MAX_DEPTH:
                dirs[:] = []
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in sorted(files):
                path = Path(root) / name
                named = name.lower().endswith(".gguf")
                if not named and not (name.startswith("sha256") and is_gguf(path)):  # Ollama's blobs
                    continue
                resolved = path.resolve()
                if resolved in seen or not resolved.is_file():
                    continue
                seen.add(resolved)
                found.append((what, path))  # the name people know (a cache's link, not its blob)
                if len(found) >= MAX_FILES:
                    return found
    return found


def _folder_labels(path: Path) -> list[str]:
    """The folders above a file, nearest first, as a person would tell them apart: a Hugging
    Face snapshot (models--org--name/snapshots/<hash>/) is its repository, "org/name"."""
    parents = list(path.parents)[:-1]  # not the root
    labels = [p.name for p in parents]
    if len(parents) >= 3 and parents[1].name == "snapshots" and parents[2].name.startswith("models--"):
        repo = parents[2].name[len("models--"):].replace("--", "/")
        labels = [repo] + labels[3:]
    return labels


def distinct_names(rows: list[tuple[str, Path]]) -> list[str]:
    """The names to list (name, file) rows by, each told apart from the others of the same
    name by the nearest folders that differ ("model.gguf — org/name"), whole, never cut."""
    out = [name for name, _path in rows]
    by_name: dict[str, list[int]] = {}
    for i, (name, _path) in enumerate(rows):
        by_name.setdefault(name, []).append(i)
    for name, indexes in by_name.items():
        if len(indexes) < 2:
            continue
        labels = {i: _folder_labels(rows[i][1]) for i in indexes}

        def chain(i: int, depth: int) -> str:
            return "/".join(reversed(labels[i][:depth]))

        for i in indexes:  # each as few folders as tell it from the others of its name
            depth = next((k for k in range(1, len(labels[i]) + 1)
                          if all(chain(i, k) != chain(j, k) for j in indexes if j != i)), len(labels[i]))
            out[i] = f"{name} — {chain(i, depth)}" if depth else name
    return out


def home_path(path: str | os.PathLike) -> str:
    """A folder as its owner reads it: under the home folder written from ~ (the Models
    dialog's "Models folder: ~/.local/share/Tramontane/models"), else whole."""
    path = Path(path)
    try:
        rest = path.relative_to(Path.home())
    except ValueError:
        return str(path)
    return "~" if rest == Path() else str(Path("~") / rest)


def looked_in_words(models_dir: Path | None, places: list[tuple[str, Path]]) -> str:
    """Where models were looked for, for an empty list: "No GGUF models found. Looked in the
    models folder (…), Downloads (…), …"."""
    seen, parts = set(), []
    for what, folder in ([("the models folder", models_dir)] if models_dir else []) + list(places):
        if folder in seen:
            continue
        seen.add(folder)
        parts.append(f"{what} ({home_path(folder)})")
    return "No GGUF models found. Looked in " + ", ".join(parts) + "." if parts else "No GGUF models found."
