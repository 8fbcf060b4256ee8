"""Which GGUF files on disk can be a model's draft model (issue 38): Settings' picker lists them,
and a model load checks its draft by the same rule before any weight is read (worker.py).

A draft suits a target when it is another file, a model (not a projector), smaller than the
target (a draft as big as its target saves nothing), and its vocabulary agrees with the
target's (engine/runtime/speculative.draft_vocabulary_mismatch, read from the two files).
Everything here reads headers and tokenizer data: run it off the UI thread.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..engine.api import EngineError
from ..engine.library.sizes import size_text


def draft_refusal(target: str | os.PathLike, draft: str | os.PathLike) -> str:
    """'' when `draft` can draft for `target`; else why not, as a clause naming the draft file
    (no final full stop: callers put it in their sentence)."""
    from ..engine.library.models_folder import LocalModelError, read_header
    from ..engine.runtime.speculative import draft_vocabulary_mismatch

    target, draft = Path(target), Path(draft)
    try:
        draft_size = draft.stat().st_size
    except OSError as exc:
        return f"{draft} cannot be read: {exc.strerror or exc}"
    if not draft.is_file():
        return f"{draft} is not a file"
    try:
        if draft.resolve() == target.resolve():
            return f"{draft.name} is the model itself"
        target_size = target.stat().st_size
    except OSError as exc:
        return f"{target} cannot be read: {exc.strerror or exc}"
    try:
        if read_header(draft).is_projector:
            return f"{draft.name} is a vision projector, not a model"
    except LocalModelError as exc:
        return str(exc)
    if draft_size >= target_size:
        return (f"{draft.name} ({size_text(draft_size)}) is not smaller than {target.name} "
                f"({size_text(target_size)})")
    try:
        return draft_vocabulary_mismatch(target, draft) or ""
    except EngineError as exc:  # a tokenizer the reader refuses, naming its file
        return str(exc)
    except OSError as exc:
        return f"{draft} cannot be read: {exc.strerror or exc}"


def library_files(models_dir: str | os.PathLike | None, recent: list[str]) -> list[Path]:
    """The GGUF files the Models dialog lists: the models folder and its imports, the files
    loaded lately, and those found in other apps' usual places; each once (by its resolved path)."""
    from ..engine.library.models_folder import scan_models
    from .model_places import find_models, usual_places

    files = [m.path for m in scan_models(models_dir or None)]
    seen = {p.resolve() for p in files}
    for path in map(Path, recent):
        if path.is_file() and path.resolve() not in seen:
            seen.add(path.resolve())
            files.append(path)
    files += [path for _what, path in find_models(usual_places(), set(files))]
    return files


def draft_choices(target: str | os.PathLike,
                  files: list[Path]) -> tuple[list[tuple[Path, int]], dict[Path, str]]:
    """((file, size) of the files that can draft for `target`, smallest first; the others with
    why not)."""
    fits, refused = [], {}
    for path in files:
        why = draft_refusal(target, path)
        if why:
            refused[path] = why
        else:
            fits.append((path, path.stat().st_size))
    fits.sort(key=lambda fit: (fit[1], fit[0].name))
    return fits, refused


__all__ = ["draft_choices", "draft_refusal", "library_files"]
