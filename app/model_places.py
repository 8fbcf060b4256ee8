"""GGUF models already on this computer outside the models folder: the places other apps and
browsers put them (Downloads, the Hugging Face cache, LM Studio, Jan, Ollama's blobs, which
are GGUF files named by their hash). Looked for as a job, off the UI thread."""
from __future__ import annotations

import os
from pathlib import Path

PLACES_ENV = "TRAMONTANE_MODEL_PLACES"  # os.pathsep-separated folders instead of the usual ones
GGUF_MAGIC = b"GGUF"
MAX_DEPTH = 6  # the Hugging Face cache nests models--org--name/snapshots/<hash>/file.gguf
MAX_FILES = 200


def usual_places(home: Path | None = None, env=os.environ) -> list[tuple[str, Path]]:
    """(what, folder) of every place looked in, existing or not."""
    if PLACES_ENV in env:
        return [("elsewhere", Path(p)) for p in env[PLACES_ENV].split(os.pathsep) if p]
    home = home or Path.home()
    hf_home = Path(env.get("HF_HOME") or home / ".cache" / "huggingface")
    return [
        ("Downloads", home / "Downloads"),
        ("the Hugging Face cache", Path(env.get("HF_HUB_CACHE") or hf_home / "hub")),
        ("LM Studio", home / ".lmstudio" / "models"),
        ("LM Studio", home / ".cache" / "lm-studio" / "models"),
        ("Jan", home / "jan" / "models"),
        ("Jan", home / ".local" / "share" / "Jan" / "data" / "models"),
        ("Ollama", home / ".ollama" / "models" / "blobs"),
        ("Ollama", Path("/usr/share/ollama/.ollama/models/blobs")),
    ]


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
