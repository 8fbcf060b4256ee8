"""A prompt on its way into the model, one rule each for every caller (LocalEngine, the batch
scheduler): does it fit the context, are its raw ids in the vocabulary, and its input rows
(token embeddings with each image's features spliced into its [IMG] positions)."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..api import EngineError
from ..mistral3.chat_format import EncodedPrompt


def fits(n_prompt: int, context: int, max_tokens: int = 1) -> bool:
    """The one "does it fit" rule: a prompt of n_prompt tokens and, when a reply is asked for,
    the reply's first position, within a context of `context` positions."""
    return n_prompt + (1 if max_tokens > 0 else 0) <= context


def check_fits(n_prompt: int, max_tokens: int, context: int, limit: int = 0,
               path: str | Path | None = None) -> None:
    """EngineError unless the prompt fits (`fits`). The advice offers a larger context only
    below the file's own `limit` (0: not known)."""
    if fits(n_prompt, context, max_tokens):
        return
    room = 1 if max_tokens > 0 else 0
    needs = f"{n_prompt} tokens" + (f" (needs {n_prompt + room} positions with the reply)" if room else "")
    grow = " or raise the context length" if not limit or context < limit else \
        f" (this model's file allows no more than {limit})"
    where = f"{path}: " if path else ""
    raise EngineError(f"{where}the conversation is {needs}, more than the context length of {context}: "
                      f"start a new chat{grow}")


def check_prompt_ids(ids: Sequence[int], vocab: int) -> None:
    """Raw prompt ids (a completion request's): at least one, each inside the vocabulary."""
    if not ids:
        raise EngineError("the prompt is empty: give at least one token")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise EngineError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")


def image_features(vision, prompt: EncodedPrompt, start: int = 0,
                   lock: threading.Lock | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[torch.Tensor | None]:
    """The vision tower's features of each image span of `prompt` that reaches past position
    `start` (None for the spans before it, whose KV is reused), in span order. `progress(done,
    total)`: called with (0, total) first and after each image, which are then encoded one at a
    time (a large photo takes minutes on a CPU: the window says how far it is); it may raise to
    stop between images."""
    spans = prompt.image_spans
    needed = [s for s in spans if s.end > start]
    if not needed:
        return [None] * len(spans)
    if vision is None:
        raise EngineError("this model has no vision projector: load one to send images")
    with lock if lock is not None else contextlib.nullcontext():
        if progress is None:
            encoded = vision.encode_image_parts([s.image for s in needed])
        else:
            progress(0, len(needed))
            encoded = []
            for done, span in enumerate(needed, 1):
                encoded += vision.encode_image_parts([span.image])
                progress(done, len(needed))
    it = iter(encoded)
    return [next(it) if s.end > start else None for s in spans]


def prompt_rows(model, image_token: int | None, prompt: EncodedPrompt, start: int,
                features: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Input rows for prompt positions [start, end): token embeddings with each image's
    features (`image_features`) in place of its [IMG] rows ([IMG_BREAK]/[IMG_END] keep their
    embeddings)."""
    ids = prompt.ids[start:]
    embeds = model.embed(ids)
    for span, feats in zip(prompt.image_spans, features):
        if span.end <= start:
            continue
        lo, hi = span.start - start, span.end - start
        ids_t = torch.tensor(ids[lo:hi], device=embeds.device)
        rows = (ids_t == image_token).nonzero().squeeze(1) + lo
        if rows.numel() != feats.shape[0]:
            raise EngineError(f"{span.image.name}: the image gives {feats.shape[0]} features for "
                              f"{rows.numel()} [IMG] tokens")
        embeds[rows] = feats.to(device=embeds.device, dtype=embeds.dtype)
    return embeds
