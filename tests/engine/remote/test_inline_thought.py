"""A thought a server leaves in the content ([THINK]...[/THINK] at its start: llama.cpp's
--reasoning-format none) comes apart in RemoteEngine as the local engine splits it, however the
content is cut into pieces; against real servers in test_reasoning_llamacpp.py."""
from __future__ import annotations

import itertools

import pytest

from tramontane.engine.api import ChatMessage, ReasoningPiece, SamplingParams
from tramontane.engine.remote.client import RemoteEngine, _InlineThought

from support.fakevllm import FakeVLLM


def split(pieces) -> tuple[str, str]:
    inline = _InlineThought()
    thought, answer = [], []
    for piece in pieces:
        t, a = inline.push(piece)
        thought.append(t)
        answer.append(a)
    t, a = inline.flush()
    return "".join(thought + [t]), "".join(answer + [a])


@pytest.mark.parametrize("content, expected", [
    ("[THINK]Let me see.[/THINK]It is 42.", ("Let me see.", "It is 42.")),
    ("[THINK][/THINK]Plain.", ("", "Plain.")),
    ("[THINK]Cut off while thin", ("Cut off while thin", "")),  # never closed: all thought
    ("[THINK]Cut at the marker [/THI", ("Cut at the marker [/THI", "")),  # a marker never completed stays text
    ("[THINK]", ("", "")),  # only [THINK] written (llama-server's non-streamed answer when cut there)
    ("It is 42.", ("", "It is 42.")),
    ("[1] A list, not a thought", ("", "[1] A list, not a thought")),
    ("[THI", ("", "[THI")),  # a reply that ends on what could have been [THINK]
    ("Answer first [THINK]then[/THINK]", ("", "Answer first [THINK]then[/THINK]")),  # only at the start
    ("[THINK]a [/THINK] b[/THINK]c", ("a ", " b[/THINK]c")),  # the first [/THINK] closes it
])
def test_every_cut_of_the_content_splits_the_same(content, expected):
    assert split([content]) == expected
    for i, j in itertools.combinations(range(len(content) + 1), 2):
        assert split([content[:i], content[i:j], content[j:]]) == expected, (i, j)


def test_a_streamed_thought_in_the_content_comes_as_reasoning_pieces():
    """Through the whole client on a fake server (its 'tokens' are words): the thought streams as
    ReasoningPieces, the answer as text, the markers in neither."""
    with FakeVLLM(models=["m"], reply="[THINK]Let me see. [/THINK]It is 42.") as fake:
        pieces: list[str] = []
        result = RemoteEngine(fake.url, "m", read_timeout=10).chat(
            [ChatMessage.text("user", "?")], SamplingParams(max_tokens=50), on_piece=pieces.append)
    assert (result.reasoning, result.text) == ("Let me see. ", "It is 42.")
    assert "".join(p for p in pieces if isinstance(p, ReasoningPiece)) == result.reasoning
    assert "".join(p for p in pieces if not isinstance(p, ReasoningPiece)) == result.text
