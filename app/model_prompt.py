"""The model's own system prompt in a chat (issue 36): a catalogue model ships one (Magistral's and
Ministral 3 Reasoning's tell it how to think), and a chat's own system prompt (or preset) is
composed with it, not put in its place: a custom prompt must not silently turn thinking off
(LM Studio #699). The order is the one Ministral 3 Reasoning's model card gives ("Use our
provided system prompt, and append it to your custom system prompt"): the chat's prompt first,
the model's after it. Magistral's card asks for its prompt without naming an order, so the same
rule serves it. A chat may ask for its own prompt alone (settings_json `OWN_PROMPT_ONLY_KEY`).

The sampling the catalogue entry recommends (its card's temperature, top_p) is found here too
(`recommended_sampling`): the window applies it where the user left Settings' value at its
default (app/config.Sampling.with_recommended), as LM Studio applies a model's preset.

Which catalogue entry a loaded file is: the folder a download put it in (one per repository,
engine/library/downloads.repo_folder), else its file name (a variant's pinned file, or the
repository's model name that the publisher's file names begin with).
"""
from __future__ import annotations

import functools
from pathlib import Path

from ..engine.api import ChatMessage, Part, ThinkPart

OWN_PROMPT_ONLY_KEY = "own_system_prompt_only"  # True: the chat's system prompt alone, without the model's after it


@functools.lru_cache(maxsize=1)
def _catalog():
    from ..engine.library.catalog import load_catalog

    return tuple(load_catalog())


def catalog_entry_for(model_path: str | Path, catalog=None):
    """The catalogue entry the file is one of, or None."""
    from ..engine.library.downloads import repo_folder

    entries = _catalog() if catalog is None else catalog
    path = Path(model_path)
    name, folder = path.name.lower(), path.parent.name.lower()
    for entry in entries:
        if folder == repo_folder(Path(), entry.repo_id).name.lower():
            return entry
    for entry in entries:
        if any(v.file and v.file.lower() == name for v in entry.variants):
            return entry
    for entry in entries:  # e.g. Magistral-Small-2509-Q4_K_M.gguf of unsloth/Magistral-Small-2509-GGUF
        model = entry.repo_id.rsplit("/", 1)[-1].lower().removesuffix("-gguf").removesuffix("_gguf")
        if name.startswith(model) and name[len(model):len(model) + 1] in ("-", ".", "_"):
            return entry
    return None


def model_system_prompt(model_path: str | Path | None) -> tuple[Part, ...]:
    """The system prompt shipped with the model in `model_path` (an engine's `model_path`): ()
    for a server (None: its own template decides) and for a file the catalogue does not know."""
    entry = catalog_entry_for(model_path) if model_path else None
    return entry.system_prompt if entry is not None else ()


def recommended_sampling(model_path: str | Path | None):
    """The catalogue's `Sampling` for the model in `model_path` (the temperature and top_p its
    card recommends); None for a server, a file the catalogue does not know, or an entry that
    pins none."""
    entry = catalog_entry_for(model_path) if model_path else None
    return entry.sampling if entry is not None else None


def recommended_words(values: dict[str, float]) -> str:
    """Knobs of the model's recommended sampling in words ("temperature 0.7 and top-p 0.95"); ''
    for none. `values`: a catalogue Sampling's as Sampling.recommended_values gives them."""
    names = {"temperature": "temperature", "top_p": "top-p"}
    return " and ".join(f"{names[k]} {v:g}" for k, v in values.items())


def compose_system_prompt(messages: list[ChatMessage], model_parts: tuple[Part, ...] | list[Part],
                          can_think: bool, own_only: bool = False) -> list[ChatMessage]:
    """The engine messages with one system message first: the chat's own prompt, then the model's
    appended after it, as Ministral 3 Reasoning's card asks (its text parts join with a blank
    line, as mistral-common joins text chunks). A thought template is left out for a model whose
    format cannot hold one."""
    if own_only or not model_parts:
        return messages
    parts = [p for p in model_parts if can_think or not isinstance(p, ThinkPart)]
    if messages and messages[0].role == "system":
        return [ChatMessage("system", list(messages[0].parts) + parts), *messages[1:]]
    return [ChatMessage("system", parts), *messages]


def own_prompt_only(settings: dict | None) -> bool:
    return (settings or {}).get(OWN_PROMPT_ONLY_KEY) is True


__all__ = ["OWN_PROMPT_ONLY_KEY", "catalog_entry_for", "compose_system_prompt", "model_system_prompt",
           "own_prompt_only", "recommended_sampling", "recommended_words"]
