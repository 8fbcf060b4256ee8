"""Issue 35, item 7, on the real window: a reply whose text does not round-trip through the
tokenizer (it holds U+FFFD from a split byte sequence, so encoding the text gives other ids) is
put back into the next turn's prompt as the ids that were sampled, and that turn reuses the
whole first prompt and reply from the cache instead of re-reading from the reply's start."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from support.app_window import send  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")


def _reply_that_does_not_round_trip(qtbot, window):
    """Sample short hot replies in fresh chats until one's text re-encodes to other ids (the
    tiny random model writes byte pieces that do not form characters within a few seeds)."""
    for seed in range(40):
        window.navigation.new_chat()
        window.session.param_overrides = dict(temperature=1.5, seed=seed, max_tokens=8)
        reply_id = send(qtbot, window, "Say something.")
        reply = window.store.get_message(reply_id)
        if "\ufffd" in reply.text and reply.finish_reason == "length":
            return reply
    pytest.fail("no seed in 40 gave a reply holding U+FFFD")


def test_the_next_turn_reuses_a_reply_that_does_not_round_trip(qtbot, window):
    tok = window.worker.engine.tokenizer
    first = _reply_that_does_not_round_trip(qtbot, window)
    first_stats = window.session.live_stats[first.id]
    sampled = window.worker.engine.replies.get(first.text)
    assert sampled is not None and len(sampled) == first_stats.generated_tokens == 8
    assert tok.decode(sampled) == first.text and tok.encode(first.text) != sampled  # no round trip

    window.session.param_overrides = dict(temperature=0.0, max_tokens=2)
    follow = send(qtbot, window, "More.")
    stats = window.session.live_stats[follow]
    # what the first turn left in the KV: its prompt and its reply but the last id (never fed)
    assert stats.reused_tokens == first_stats.prompt_tokens + first_stats.generated_tokens - 1, stats
