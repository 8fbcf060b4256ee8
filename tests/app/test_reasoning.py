"""app/reasoning.py: the words a thought's block is titled with, the worker's Thought (what was
thought, for how long, whether it was cut), and the chat's reasoning switch."""
from __future__ import annotations

import pytest

from tramontane.app.reasoning import NO_SWITCH_NOTE, REASONING_KEY, Thought, chat_reasoning_on, switch_words, thought_title


@pytest.mark.parametrize("seconds, cut, words", [
    (None, False, "Thought"),
    (0.2, False, "Thought for less than a second"),
    (0.5, False, "Thought for 1 s"),
    (12.4, False, "Thought for 12 s"),
    (59.4, True, "Thought for 59 s (stopped)"),
    (60.0, False, "Thought for 1 min"),
    (125.2, False, "Thought for 2 min 5 s"),
])
def test_thought_title(seconds, cut, words):
    assert thought_title(seconds, cut) == words


def test_thinking_title():
    assert thought_title(None, thinking=True) == "Thinking…"


def test_a_thought_is_timed_from_its_first_piece_to_the_first_answer_piece():
    t = Thought()
    t.answered(1.0)  # an answer piece before any thought: no thought, no time
    assert (t.text, t.seconds) == ("", None)
    t.add("Two", 2.0)
    t.add(" and two.", 3.5)
    t.answered(7.0)
    t.answered(9.0)  # later answer pieces change nothing
    assert (t.text, t.seconds) == ("Two and two.", 5.0)
    assert not t.ended(10.0, cut=False).cut and t.seconds == 5.0


def test_a_thought_still_going_at_the_end_ends_then_and_is_cut_only_with_text():
    t = Thought()
    t.add("Hm", 1.0)
    assert t.ended(4.0, cut=True) is t and (t.seconds, t.cut) == (3.0, True)
    assert not Thought().ended(4.0, cut=True).cut  # nothing thought: nothing cut


def test_the_switch_is_on_unless_the_chat_turned_it_off():
    assert chat_reasoning_on(None) and chat_reasoning_on({}) and chat_reasoning_on({REASONING_KEY: True})
    assert not chat_reasoning_on({REASONING_KEY: False})
    assert chat_reasoning_on({REASONING_KEY: "garbage"})  # only an explicit off is off


def test_the_switch_says_what_it_can_do_for_the_format():
    assert switch_words(False, 11, True) == ("", "")  # a model that cannot think: no switch
    label, note = switch_words(True, 13, False)
    assert label == "Reasoning: off" and note == NO_SWITCH_NOTE.format(version=13)
    assert "v13" in note and "changes nothing" in note
    assert switch_words(True, 13, True)[0] == "Reasoning: on"
