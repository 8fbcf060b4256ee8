"""A reasoning model's thought apart from its answer: generated tokens routed at the [THINK] /
[/THINK] control ids, as they stream.

The rules are those of vLLM's `mistral` reasoning parser (MistralReasoningParser), which reads
what mistral-common's v13 format writes (`[THINK]thought[/THINK]answer`):
- the thought is what stands between the first [THINK] and the [/THINK] after it;
- a [THINK] never closed (the reply stopped, or ran out of tokens while thinking): all that
  follows it is thought, and the thought is not `closed`;
- text before [THINK] is answer (a well-prompted model writes none), and so is everything when
  no [THINK] comes at all; a [/THINK] with no [THINK] before it is dropped;
- the think tokens themselves are in neither; a second [THINK] inside the thought, or either
  token after the thought closed, is dropped too.
Pure: ids and text pieces in, pieces of thought and answer out; no model, no loop, so the one
scheduler calls it per generated token and the server and the window read the same split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..api import Part, ThinkPart

if TYPE_CHECKING:
    from ..mistral3.tokenizer import Tokenizer

THINK, END_THINK = "[THINK]", "[/THINK]"

# A request's reasoning effort (OpenAI's `reasoning_effort`, the Responses API's `reasoning.effort`):
# mistral-common's names for it (protocol/instruct/request.py, ReasoningEffort). mistral-common
# writes an effort into the prompt only from tokenizer v15 on (its [MODEL_SETTINGS] block) and
# refuses one for any earlier version; every format these models use (v7, v11, v13) has no effort
# control, a v13 model thinking as its system prompt tells it. So, as vLLM serves them
# (vllm/tokenizers/mistral.py: the effort is handed to mistral-common only for version >= 15, and
# validate_request_params refuses only a value outside these names), an effort is accepted and
# changes nothing; "none" too (llama.cpp turns thinking off for it, which a Mistral template
# cannot: its thinking lives in the system prompt).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def reasoning_effort_error(value) -> str | None:
    """What is wrong with a request's reasoning effort (None when not given), for the refusal that
    names its field; None when it is accepted, which for these models changes nothing."""
    if value is None or (isinstance(value, str) and value in REASONING_EFFORTS):
        return None
    return f"must be one of {', '.join(REASONING_EFFORTS)}, got {value!r}"


@dataclass(frozen=True)
class ReasoningDelta:
    """What one generated token added: to the thought, to the answer (either may be "")."""

    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    """Feed each generated token with the text piece its stream decoder gave for it (`push`);
    read `reasoning`, `content`, `closed` and `answering` at any point, `parts()` at the end.

    A piece given for a think token holds the text that token flushed (the end of a character
    held back before it), which belongs to the run before it, and the token's name when the
    decoder shows control tokens; the name is removed."""

    def __init__(self, think_id: int, end_think_id: int, thinking: bool = False):
        """`thinking`: the prompt itself opened the thought (it ends with [THINK])."""
        if think_id == end_think_id:
            raise ValueError("[THINK] and [/THINK] must be different tokens")
        self.think_id = think_id
        self.end_think_id = end_think_id
        self._started = thinking  # a [THINK] was seen (or the prompt ended with one)
        self._closed = False  # ... and its [/THINK]
        self._reasoning: list[str] = []
        self._content: list[str] = []

    @classmethod
    def for_tokenizer(cls, tokenizer: "Tokenizer", thinking: bool = False) -> "ReasoningSplitter | None":
        """A splitter for a model that thinks; None for one that cannot (nothing to split)."""
        ids = getattr(tokenizer, "think_ids", None)  # a stand-in tokenizer (bench, tests) has none
        return None if ids is None else cls(*ids, thinking=thinking)

    # ------------------------------------------------------------------ state
    @property
    def thinking(self) -> bool:
        """Inside the thought: the next token's text goes to `reasoning`."""
        return self._started and not self._closed

    @property
    def answering(self) -> bool:
        """The thought is over (or never began): the next token's text is answer. Constraints
        meant for the answer (a JSON schema, tool calls) apply from here."""
        return not self.thinking

    @property
    def started(self) -> bool:
        return self._started

    @property
    def closed(self) -> bool:
        """The thought was closed by [/THINK]."""
        return self._closed

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def content(self) -> str:
        return "".join(self._content)

    # ------------------------------------------------------------------ feeding
    def push(self, token_id: int, piece: str = "") -> ReasoningDelta:
        """Route one generated token's text; what it added to each side."""
        token_id = int(token_id)
        if token_id == self.think_id:
            delta = self._text(_without_name(piece, THINK))
            if not self._started:
                self._started = True
            return delta
        if token_id == self.end_think_id:
            delta = self._text(_without_name(piece, END_THINK))
            if self._started:
                self._closed = True
            return delta
        return self._text(piece)

    def tail(self, text: str) -> ReasoningDelta:
        """Text with no token of its own (the stream decoder's held-back end, flushed when the
        reply ends): to the side the reply is on."""
        return self._text(text)

    def push_many(self, token_ids, pieces) -> ReasoningDelta:
        """`push` over a run of tokens; the deltas joined."""
        reasoning, content = [], []
        for token_id, piece in zip(token_ids, pieces, strict=True):
            delta = self.push(token_id, piece)
            reasoning.append(delta.reasoning)
            content.append(delta.content)
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _text(self, text: str) -> ReasoningDelta:
        if not text:
            return ReasoningDelta()
        if self.thinking:
            self._reasoning.append(text)
            return ReasoningDelta(reasoning=text)
        self._content.append(text)
        return ReasoningDelta(content=text)

    # ------------------------------------------------------------------ the reply
    def parts(self) -> list[Part]:
        """The reply as an assistant message's parts: its thought first (when one began), then
        its answer, as the chat format encodes it back in later turns (chat_format)."""
        parts: list[Part] = []
        if self._started:
            parts.append(ThinkPart(self.reasoning, closed=self._closed))
        if self._content:
            parts.append(self.content)
        return parts


def split_reasoning(think_ids: tuple[int, int], token_ids, pieces) -> ReasoningSplitter:
    """A whole reply split at once (the same rules as streaming it)."""
    splitter = ReasoningSplitter(*think_ids)
    splitter.push_many(token_ids, pieces)
    return splitter


def _without_name(piece: str, name: str) -> str:
    """The text a think token flushed, without the token's own name (a decoder that shows
    control tokens appends it)."""
    return piece[:-len(name)] if piece.endswith(name) else piece
