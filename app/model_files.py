"""Whether a file the user picked can be loaded as a chat model, asked before anything is
unloaded, and answered in words (not the GGUF reader's)."""
from __future__ import annotations

from pathlib import Path

from .model_places import GGUF_MAGIC


def why_not_a_model(path: str | Path) -> str:
    """'' when `path` is a readable GGUF model; else why not, for a person."""
    name = Path(path).name
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"Cannot open “{name}”: {exc.strerror or exc}."
    if magic != GGUF_MAGIC:
        if name.lower().endswith(".gguf"):  # the name says GGUF, the bytes do not: advice about the name would not help
            return (f"“{name}” is not a GGUF file: it ends in .gguf but its contents are something else "
                    "(an unfinished download, or another kind of file renamed). Download it again or choose another.")
        return f"“{name}” is not a GGUF model file. Choose a model file ending in .gguf."
    from ..engine.library.models_folder import LocalModelError, read_header

    try:
        header = read_header(path)
    except LocalModelError:
        return f"“{name}” is damaged or incomplete: its GGUF header cannot be read."
    if header.is_projector:
        return (f"“{name}” is a vision projector, which works with a model, not on its own. "
                "Open the model file: a projector beside it is loaded with it.")
    return ""
