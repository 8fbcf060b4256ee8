"""What the window shows about the loaded engine (`EngineInfo`): made by the worker, read by
the model bar, the empty state, the chat session and the server switch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineInfo:
    """What the model bar shows about the loaded engine."""

    description: str
    has_vision: bool
    model_path: str = ""  # '' for a remote engine
    mmproj_path: str = ""
    device: str = ""  # cpu / cuda / remote
    memory: str = ""  # words, e.g. "1.2 GB GPU" ('' when unknown)
    context_size: int = 0  # the context the engine uses
    context_limit: int = 0  # the model file's own limit (0 unknown)
    resident_bytes: int = 0  # the RAM the load added to this process (freed by an unload)
    context_asked: int = 0  # the context length Settings asked for (0: the default)
    remote: bool = False
    placement: str = ""  # where the layers run, e.g. "34 of 40 layers on GPU, 6 on CPU"
    split: bool = False  # some layers on a GPU, some on the CPU
    # the vision tower's (image_size, patch_size, merge): what an image costs in tokens
    # (composer chips); None without a projector or on a server
    image_geometry: tuple[int, int, int] | None = None
    # a reasoning model ([THINK] / [/THINK] in its vocabulary, issue 36) and its chat format
    # version (7, 11, 13; 0 unknown, e.g. a server)
    can_think: bool = False
    chat_version: int = 0
