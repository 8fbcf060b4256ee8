"""A reasoning model's thought in the window (issue 36): the words its block is titled with (the
view and the Markdown export say the same), and the chat's reasoning switch.

The switch is per chat (`settings_json["reasoning"]`, beside the chat's own sampling). What
"off" can do depends on the model's chat format, and we never invent tokens for it:
mistral-common's v7, v11 and v13 formats (every model this engine reads) have no field that
asks a model not to think: Magistral and Ministral 3 Reasoning think as their system prompt
tells them (only v15's [MODEL_SETTINGS] carries a reasoning effort). So where the format has
no switch, off changes nothing in the prompt and hides nothing; the window says so
(`switch_words`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

REASONING_KEY = "reasoning"  # a chat's reasoning switch, in its settings (True / False; absent: on)

NO_SWITCH_NOTE = ("This model's chat format (v{version}) has no way to ask it not to think: it "
                  "thinks as its system prompt tells it. Off changes nothing in the prompt, and "
                  "what it thinks is still shown apart from the answer.")


@dataclass
class Thought:
    """A reply's thought as it streams (the worker's): its pieces, and when the model began and
    ended thinking (time.monotonic seconds), for "Thought for 12 s"."""

    pieces: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None  # the first answer piece, or the reply's end
    cut: bool = False  # cut off before [/THINK] (see `ended`)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)

    def add(self, piece: str, now: float) -> None:
        self.pieces.append(piece)
        if self.started_at is None:
            self.started_at = now

    def answered(self, now: float) -> None:
        """An answer piece came: the thinking is over (its first one counts)."""
        if self.started_at is not None and self.ended_at is None:
            self.ended_at = now

    def ended(self, now: float, cut: bool) -> "Thought":
        """The reply is over: a thought still going ends now; `cut`: it never reached its
        [/THINK] (only a thought that has text can be cut)."""
        self.answered(now)
        self.cut = bool(self.pieces) and cut
        return self


def thought_title(seconds: float | None, cut: bool = False, thinking: bool = False) -> str:
    """'Thinking…', 'Thought for 12 s', 'Thought for 2 min 5 s', with ' (stopped)' for a thought
    cut off before its end; 'Thought' when the time was not measured."""
    if thinking:
        return "Thinking…"
    if seconds is None:
        words = "Thought"
    elif seconds < 60:
        words = f"Thought for {max(1, round(seconds))} s" if seconds >= 0.5 else "Thought for less than a second"
    else:
        minutes, rest = divmod(round(seconds), 60)
        words = f"Thought for {minutes} min" + (f" {rest} s" if rest else "")
    return words + (" (stopped)" if cut else "")


def chat_reasoning_on(settings: dict | None) -> bool:
    """The chat's switch: on unless the chat turned it off."""
    return (settings or {}).get(REASONING_KEY) is not False


def switch_words(can_think: bool, version: int, on: bool) -> tuple[str, str]:
    """The switch's label and tooltip for the loaded model ('' label: a model that cannot think,
    no switch to show). Every format this engine encodes lacks a think switch (see above)."""
    if not can_think:
        return "", ""
    return ("Reasoning: on" if on else "Reasoning: off"), NO_SWITCH_NOTE.format(version=version)
