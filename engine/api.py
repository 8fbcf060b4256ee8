"""The types every engine speaks: chat messages in, text pieces and stats out.

The GUI, the sessions and the CLI use only these; `LocalEngine` (GGUF on this machine) and
`RemoteEngine` (an OpenAI-compatible server) implement `Engine`.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Literal, Protocol, Union

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "cancelled", "stop_string", "error", "interrupted"]


class EngineError(Exception):
    """A problem the user should read (file, server, image, context...). Never a traceback."""


@dataclass(frozen=True)
class ImagePart:
    """An image attached to a message: the encoded file bytes and where they came from."""

    data: bytes
    name: str = "image"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @classmethod
    def from_path(cls, path: str | Path) -> "ImagePart":
        path = Path(path)
        try:
            return cls(path.read_bytes(), path.name)
        except OSError as exc:
            raise EngineError(f"{path}: cannot read image: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class ThinkPart:
    """A reasoning model's thought ([THINK]…[/THINK] in the v13 chat format): in an assistant
    message the reasoning before its answer, in a system message the shape the model is told to
    think in. `closed` False: the thought was cut off (no [/THINK] was written)."""

    text: str
    closed: bool = True


@dataclass(frozen=True)
class DocumentPart:
    """A document attached to a user message: the file's bytes and name, and its text as
    engine/documents read it (a `Document`; typed loosely, this module imports nothing). No
    encoder reads it: engine/documents/prompt.py turns it into text and page images first."""

    data: bytes
    name: str
    document: object = field(default=None, compare=False, repr=False)

    @cached_property  # a document may be megabytes: hashed once
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


Part = Union[str, ImagePart, ThinkPart, DocumentPart]


@dataclass(frozen=True)
class ToolCall:
    """One function call an assistant message made: `arguments` is the JSON text as written."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call (OpenAI's `tools[i].function`): `parameters` is its JSON
    Schema, kept as the client wrote it (the prompt shows it in that key order)."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=dict, hash=False, compare=True)


@dataclass
class ChatMessage:
    role: Role
    parts: list[Part] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call they answer

    @classmethod
    def text(cls, role: Role, text: str) -> "ChatMessage":
        return cls(role, [text])

    @property
    def text_content(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def images(self) -> list[ImagePart]:
        return [p for p in self.parts if isinstance(p, ImagePart)]

    @property
    def documents(self) -> list[DocumentPart]:
        return [p for p in self.parts if isinstance(p, DocumentPart)]

    @property
    def reasoning(self) -> str:
        """The text of the message's thoughts (its ThinkParts), "" where it has none."""
        return "".join(p.text for p in self.parts if isinstance(p, ThinkPart))


@dataclass
class SamplingParams:
    max_tokens: int = 1024
    temperature: float = 0.15  # Mistral's recommended default for its instruct models
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    # Per request, not settings: each `(generated_ids, logits) -> logits` runs before the
    # sampling chain (a grammar's token mask: runtime/grammar.py).
    logits_processors: tuple = ()
    logprobs: int | None = None  # None: off; n: the chosen token's log-probability and the top n
    control_text: bool = False  # pieces and text show control tokens by name ([TOOL_CALLS]...)
    # score the prompt: each prompt token's log-probability given those before it (perplexity,
    # a completion's echo); the whole prompt is read, none of it taken from the cache
    prompt_logprobs: bool = False
    # speculative decoding: "off", or "ngram" (prompt lookup: drafts from the sequence's own
    # tokens, verified as extra rows of the same step; lossless); at most `spec_tokens` a step
    speculation: str = "off"
    spec_tokens: int = 8

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the cache
    prefilled_tokens: int = 0  # prompt tokens computed this turn
    generated_tokens: int = 0
    ttft_s: float = 0.0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    context_used: int = 0
    context_size: int = 0
    finish_reason: FinishReason = "stop"
    drafted_tokens: int = 0  # speculation: tokens drafted and verified
    accepted_tokens: int = 0  # ... and of those, accepted


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (before sampling settings), with the
    `top` most likely alternatives as (token id, log-probability), most likely first."""

    token_id: int
    logprob: float
    top: tuple = ()  # TokenLogprob entries (their own `top` empty)
    token: str = ""  # its text (a control token by name)
    token_bytes: bytes = b""  # the bytes it adds to the text (part of a character, maybe)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # one per generated token when asked for
    # with SamplingParams.prompt_logprobs: log p(prompt[i] | prompt[:i]) for i = 1..len - 1
    prompt_logprobs: list[float] | None = None
    # and with SamplingParams.logprobs = N > 0 too: the N most likely tokens at each of those
    # positions, ((token id, log-probability), ...) most likely first
    prompt_top_logprobs: list[tuple] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)  # the reply is these calls (then text)
    # a reasoning model's thought ([THINK]…[/THINK], runtime/reasoning.py), apart from `text`
    reasoning: str = ""

    @property
    def finish_reason(self) -> FinishReason:
        return self.stats.finish_reason


class ReasoningPiece(str):
    """A streamed piece of a reasoning model's thought ([THINK]...[/THINK]): `on_piece` gets these
    beside the answer's plain str pieces; the result keeps them apart (`GenerationResult.reasoning`)."""


class LoggedPiece(str):
    """A streamed piece of the answer, when logprobs are asked for (`SamplingParams.logprobs`),
    with the entries of the tokens drawn since the previous piece: a stream's chunk carries the
    logprobs of the text it shows, as OpenAI's do; the result still has them all."""

    logprobs: list[TokenLogprob]

    def __new__(cls, text: str, logprobs: list[TokenLogprob]):
        piece = super().__new__(cls, text)
        piece.logprobs = list(logprobs)
        return piece

    @staticmethod
    def joined(first: str, second: str) -> str:
        """Two consecutive pieces as one, with both pieces' entries."""
        if not isinstance(first, LoggedPiece) and not isinstance(second, LoggedPiece):
            return first + second
        return LoggedPiece(first + second, [e for piece in (first, second) if isinstance(piece, LoggedPiece)
                                            for e in piece.logprobs])


PieceCallback = Callable[[str], None]  # answer text (LoggedPiece with logprobs), and ReasoningPiece for a thought


class Engine(Protocol):
    """Every member the window, the CLI and the server use of an engine, implemented by
    `LocalEngine` (and its batched view) and `RemoteEngine`; nobody outside engine/ probes an
    engine for anything else. Implementations are owned by one worker thread unless they say
    otherwise (the batched view is callable from many)."""

    @property
    def description(self) -> str: ...

    @property
    def has_vision(self) -> bool: ...

    @property
    def device_kind(self) -> str:
        """Where the replies are computed: "cpu", "cuda" (the output head's device) or "remote"."""
        ...

    @property
    def context_size(self) -> int:
        """The longest conversation (prompt and reply) this engine takes, in tokens (0: unknown)."""
        ...

    @property
    def context_limit(self) -> int:
        """The model file's own context limit (0: unknown, e.g. a remote server's)."""
        ...

    @property
    def placement(self) -> dict:
        """Where the model runs, as data (LocalEngine.placement); {} where it is not known."""
        ...

    @property
    def writes_tool_calls(self) -> bool:
        """Whether tool calls are written and read here (the local tokenizer's format)."""
        ...

    def count_tokens(self, messages: list[ChatMessage]) -> int | None:
        """The prompt tokens of `messages` as `chat` would send them; None where the engine
        cannot count (a remote server)."""
        ...

    @property
    def image_geometry(self) -> tuple[int, int, int] | None:
        """(image size, patch size, merge) of the vision tower this engine runs, for the image
        chips' token costs; None without one (or a server's, not ours to read)."""
        ...

    @property
    def model_path(self) -> Path | None:
        """The model file this engine runs on this machine; None for a server's model (not ours
        to read), so nothing of a file is looked up for it (its catalogue entry, its prompt)."""
        ...

    @property
    def think_ids(self) -> tuple[int, int] | None:
        """([THINK], [/THINK]) ids of a model that thinks; None for one that does not, or where
        the ids are not known (a server)."""
        ...

    @property
    def chat_version(self) -> int:
        """The chat format version of the model's tokenizer (7, 11, 13); 0 where not known."""
        ...

    def chat(
        self,
        messages: list[ChatMessage],
        params: SamplingParams,
        on_piece: PieceCallback | None = None,
        cancel: threading.Event | None = None,
        session_key: str | None = None,
        tools=None,
        on_prompt_progress: Callable[[int, int], None] | None = None,
    ) -> GenerationResult:
        """Generate the assistant reply to `messages` (the last one is the user's).

        `session_key` names the chat (a local engine finds its KV by content either way).
        `tools`: the ToolSpecs the model may call. `on_prompt_progress(read, total)`: prompt
        tokens read so far, where the engine knows it (a remote server does not say). Raises
        EngineError with a readable message on any failure."""
        ...

    def forget_chat(self, messages: list[ChatMessage]) -> None:
        """A deleted chat's content leaves every cache the engine keeps (a no-op where none)."""
        ...

    def forget_session(self, session_key: str) -> None:
        """A deleted chat's KV is dropped (a no-op where none is kept)."""
        ...

    def encode_images(self, messages: list[ChatMessage], last: int,
                      progress: Callable[[int, int], None] | None = None) -> None:
        """Encode the last `last` images of `messages` now, one at a time, `progress(done, total)`
        after each (it may raise to stop between them); the engine keeps them by content, so the
        reply's own call finds them encoded. A no-op where images are encoded elsewhere (a
        remote server)."""
        ...

    def close(self) -> None: ...


class LocalModelEngine(Engine, Protocol):
    """An engine on a model file of this machine: what the local API server and the CLI use on
    top of `Engine` (LocalEngine, and BatchedEngine on its scheduler)."""

    model_path: Path  # never None here
    mmproj_path: Path | None

    @property
    def tokenizer(self): ...

    def encode(self, messages: list[ChatMessage], tools=None):
        """The chat format's ids (an EncodedPrompt), as `chat` would send them."""
        ...

    def complete(self, prompt_ids: list[int], params: SamplingParams, on_piece: PieceCallback | None = None,
                 cancel: threading.Event | None = None, session_key: str | None = None) -> GenerationResult:
        """Continue raw prompt ids (no chat format)."""
        ...

    def generate_from(self, prompt, params: SamplingParams, on_piece: PieceCallback | None = None,
                      cancel: threading.Event | None = None, session_key: str | None = None) -> GenerationResult:
        """Reply to an encoded prompt (from `encode`)."""
        ...

    def run_together(self, fn: Callable[["LocalModelEngine", int], object], n: int) -> list:
        """fn(engine, i) for i in range(n), batched together where the engine can (a request's
        `n` choices); their results in order."""
        ...
