"""Tekken tokenizer from GGUF metadata: byte-level BPE (via `tokenizers`) + streaming detokenizer.

A GGUF made by llama.cpp's converter stores the tekken vocabulary as GPT-2 style byte-level BPE:
`tokenizer.ggml.model = gpt2`, `pre = tekken`, `tokens` (byte-level strings; control tokens as
their plain text), `merges` ("left right"), `token_type` (llama.cpp's token types). The
encoding must equal mistral-common's Tekkenizer (tiktoken) on the same vocabulary, so:
- pre-tokenisation is tekken's regex (mistral-common's `config.pattern`), nothing else;
- a pre-token that is itself in the vocabulary is taken whole (`ignore_merges`), like tiktoken;
- control tokens are not in the BPE model at all: typed text can never produce `[INST]` or `<s>`.
Decoding goes through a per-id byte table, so text split inside a UTF-8 sequence comes out
whole, and the stream decoder never emits half a character.
"""
from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..api import EngineError
from ..gguf import Metadata

if TYPE_CHECKING:
    from ..gguf import GGUFFile

# mistral-common's tekken JSON `config.pattern` (tekken_240718/240911 and the v7 files).
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

# `tokenizer.ggml.pre` values we know the split pattern of. Anything else is refused: guessing
# a pattern would silently give different ids than the model was trained on.
PRE_TOKENIZER_PATTERNS = {"tekken": TEKKEN_PATTERN}


class TokenizerError(EngineError):
    """The file's tokenizer data is missing, malformed or of a kind we do not support."""


class TokenType(IntEnum):
    """llama.cpp's `tokenizer.ggml.token_type` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


def chat_format_version(has_control: Callable[[str], bool], chat_template: str | None) -> int:
    """The mistral-common chat format a file's model was trained on, 7, 11 or 13, from which control
    tokens its vocabulary has (`has_control(piece)`) and its tokenizer.chat_template.

    A vocabulary without an [ARGS] control token is v7 (Mistral Small 3.1 2503, Devstral 1.0
    2505: llama.cpp writes its template as the name "mistral-v7-tekken", for a v7 tokenizer
    only). With [ARGS], the file's template text tells v11 (Mistral Small 3.2 2506: its calls
    carry [CALL_ID] and its results [TOOL_CONTENT]) from v13 (Magistral 1.1/1.2, Ministral 3,
    Devstral 1.1: `[TOOL_CALLS]name[ARGS]{...}`, results without ids, [THINK] chunks), which
    writes neither, or writes [THINK] (v11 has no thoughts). A file without a template is
    taken as the newer format."""
    template = (chat_template or "").strip()
    if not has_control("[ARGS]") or template in ("mistral-v7-tekken", "mistral-v7"):
        return 7
    if ("[CALL_ID]" in template and "[TOOL_CONTENT]" in template and "[THINK]" not in template
            and has_control("[CALL_ID]")):
        return 11
    return 13


def thinks(version: int, has_control: Callable[[str], bool]) -> bool:
    """Whether a model of that chat format version and vocabulary writes [THINK]…[/THINK] chunks:
    v13 with both control tokens."""
    return version >= 13 and has_control("[THINK]") and has_control("[/THINK]")


@dataclass(frozen=True)
class FileChatFormat:
    """What a file's tokenizer metadata says of its chat format, read without building its
    tokenizer (`read_chat_format`)."""

    version: int  # 7, 11, 13 (chat_format_version)
    can_think: bool  # [THINK] / [/THINK] chunks (thinks)
    tool_calls: bool  # a [TOOL_CALLS] control token: the model writes tool calls


def read_chat_format(kv: dict[str, Any], source: str) -> FileChatFormat:
    """The chat format of a GGUF's tokenizer metadata (`GGUFFile.kv`) by the same rules as
    `Tokenizer.version` / `think_ids`, from its control tokens and template only (what the
    Models dialog shows of a file found on disk). Raises TokenizerError naming the file when
    the tokens or their types are missing."""
    meta = Metadata(kv, source, TokenizerError)
    tokens, types, _merges = _vocabulary(meta, lambda msg: TokenizerError(f"{source}: {msg}"))
    control = {tokens[int(i)] for i in np.flatnonzero(_control_mask(types))}
    version = chat_format_version(control.__contains__, meta.string("tokenizer.chat_template", default=None))
    return FileChatFormat(version, thinks(version, control.__contains__), "[TOOL_CALLS]" in control)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable-character map, inverted (char -> byte)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_CHAR_TO_BYTE = _byte_level_alphabet()


def _byte_token_value(piece: str) -> int | None:
    """`<0xE4>` -> 0xE4 (SentencePiece-style byte-fallback tokens), else None."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return None
    return None


@dataclass
class Tokenizer:
    """Per-id data is kept compact (a 131072-token vocabulary is looked up, not mirrored in
    Python objects): `tokens` is the file's StringArray, the decoded bytes one blob with
    offsets, and text -> id goes through the BPE model's own vocabulary plus a small dict of
    the tokens outside it (controls, byte and user-defined tokens)."""

    source: str
    tokens: Sequence[str]
    token_types: np.ndarray
    bos_id: int
    eos_id: int
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    _hf: Any = field(repr=False)
    _bytes_blob: bytes = field(repr=False)  # what every id decodes to, concatenated (b"" for controls)
    _bytes_offsets: np.ndarray = field(repr=False)  # id i's bytes: blob[offsets[i]:offsets[i + 1]]
    _is_control: np.ndarray = field(repr=False)  # bool per id
    _special_pieces: dict[str, int] = field(repr=False)  # text -> id of the tokens not in the BPE vocab
    # the file's tokenizer.chat_template (a llama.cpp template name or Jinja text): never
    # rendered, only read for which tool-call format the model was trained on (chat_format)
    chat_template: str | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf(cls, gf: "GGUFFile") -> "Tokenizer":
        return cls.from_kv(gf.kv, str(gf.path))

    @classmethod
    def from_kv(cls, kv: dict[str, Any], source: str) -> "Tokenizer":
        meta = Metadata(kv, source, TokenizerError)

        def fail(msg: str) -> TokenizerError:
            return TokenizerError(f"{source}: {msg}")

        pattern = _split_pattern(meta, fail)
        tokens, types, merges = _vocabulary(meta, fail)
        vocab = _read_vocabulary(tokens, types, fail)
        hf = _build_hf_tokenizer(vocab.vocab_json, _merges_json(merges, fail), pattern, fail)
        held = hf.get_vocab_size(with_added_tokens=False)
        if held != vocab.n_normal:  # a JSON key given twice keeps one entry
            raise fail(_duplicate_normal_token(tokens, types)
                       or f"the BPE vocabulary holds {held} of the {vocab.n_normal} ordinary tokens")

        def special(key: str, piece: str, required: bool) -> int | None:
            value = meta.uint(key, default=None)
            if value is None:
                value = _lookup(piece, vocab.special_pieces, vocab.is_control, hf)
            if value is None:
                if required:
                    raise fail(f"{key} is missing and the vocabulary has no {piece!r}")
                return None
            if not value < len(tokens):
                raise fail(f"{key} = {value} is outside the vocabulary (0..{len(tokens) - 1})")
            return value

        return cls(
            source=source,
            tokens=tokens,
            token_types=types,
            bos_id=special("tokenizer.ggml.bos_token_id", "<s>", True),
            eos_id=special("tokenizer.ggml.eos_token_id", "</s>", True),
            pad_id=special("tokenizer.ggml.padding_token_id", "<pad>", False),
            unk_id=special("tokenizer.ggml.unknown_token_id", "<unk>", False),
            add_bos=meta.bool("tokenizer.ggml.add_bos_token", default=True),
            _hf=hf,
            _bytes_blob=bytes(vocab.blob),
            _bytes_offsets=vocab.offsets,
            _is_control=vocab.is_control,
            _special_pieces=vocab.special_pieces,
            chat_template=meta.string("tokenizer.chat_template", default=None),
        )

    # ------------------------------------------------------------------ which model it is
    @property
    def version(self) -> int:
        """The mistral-common chat format the file's model was trained on: 7, 11 or 13
        (`chat_format_version`)."""
        return chat_format_version(self.has_control, self.chat_template)

    @property
    def think_ids(self) -> tuple[int, int] | None:
        """([THINK], [/THINK]) ids where the model can think (v13 with both control tokens)."""
        if not thinks(self.version, self.has_control):
            return None
        return self.token_id("[THINK]"), self.token_id("[/THINK]")

    @property
    def can_think(self) -> bool:
        """Whether the model writes (and is shown) thoughts as [THINK]…[/THINK] chunks."""
        return self.think_ids is not None

    def has_control(self, piece: str) -> bool:
        """Whether the vocabulary has `piece` as a control token (not as ordinary text)."""
        token_id = _lookup(piece, self._special_pieces, self._is_control, self._hf)
        return token_id is not None and bool(self._is_control[token_id])

    # ------------------------------------------------------------------ lookups
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_id(self, piece: str) -> int:
        """Id of a token by its text as stored in the file, e.g. "[IMG_BREAK]"."""
        token_id = _lookup(piece, self._special_pieces, self._is_control, self._hf)
        if token_id is None:
            raise TokenizerError(f"{self.source}: the vocabulary has no token {piece!r}")
        return token_id

    def has_token(self, piece: str) -> bool:
        return _lookup(piece, self._special_pieces, self._is_control, self._hf) is not None

    def is_control(self, token_id: int) -> bool:
        return bool(self._is_control[self._check_id(token_id)])

    @property
    def longest_token_bytes(self) -> int:
        """The most bytes one token stands for (a text of B bytes is at least B / this many tokens)."""
        return int(np.diff(self._bytes_offsets).max(initial=0))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token adds to decoded text (b"" for control tokens)."""
        return self._bytes_of(self._check_id(token_id))

    def _bytes_of(self, token_id: int) -> bytes:
        return self._bytes_blob[self._bytes_offsets[token_id]:self._bytes_offsets[token_id + 1]]

    def piece(self, token_id: int) -> str:
        """Readable text of one token: control tokens by name, others decoded (may hold U+FFFD)."""
        token_id = self._check_id(token_id)
        if self._is_control[token_id]:
            return self.tokens[token_id]
        return self._bytes_of(token_id).decode("utf-8", errors="replace")

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"{self.source}: token id {token_id} is outside the vocabulary "
                                 f"(0..{len(self.tokens) - 1})")
        return token_id

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no BOS). Control-token text is encoded as ordinary text."""
        if not text:
            return []
        try:
            return self._hf.encode(text, add_special_tokens=False).ids
        except TypeError:
            # tokenizers refuses str it cannot turn into UTF-8 (lone surrogates from a broken
            # clipboard or file): say which character instead of a TypeError.
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise TokenizerError(f"text has a character that is not valid Unicode "
                                     f"(U+{ord(text[exc.start]):04X} at position {exc.start})") from None
            raise

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of `ids`. Like mistral-common, the runs between control tokens are decoded
        separately (invalid UTF-8 becomes U+FFFD); control tokens vanish or, with
        skip_special=False, appear by name."""
        stream = self.stream(skip_special=skip_special)
        return "".join(stream.push(t) for t in ids) + stream.flush()

    def stream(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Turns generated ids into text pieces; a character split across tokens is held back until
    its last byte arrives. The concatenation of all pieces equals `Tokenizer.decode`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        token_id = self._tok._check_id(token_id)
        if self._tok._is_control[token_id]:
            text = self.flush()  # a control token ends the current byte run
            return text if self._skip_special else text + self._tok.tokens[token_id]
        return self._utf8.decode(self._tok._bytes_of(token_id))

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


def _split_pattern(meta: Metadata, fail) -> str:
    """The pre-tokenizer's split pattern: only byte-level BPE with a `pre` we know."""
    model = meta.string("tokenizer.ggml.model", default=None)
    if model is None:
        raise fail("has no tokenizer (tokenizer.ggml.model is missing)")
    if model != "gpt2":
        raise fail(f"tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') tekken "
                   "vocabularies are supported")
    pre = meta.string("tokenizer.ggml.pre", default=None)
    if pre not in PRE_TOKENIZER_PATTERNS:
        raise fail(f"tokenizer.ggml.pre is {pre!r}; supported pre-tokenizers: "
                   f"{', '.join(PRE_TOKENIZER_PATTERNS)} (Mistral 3 files say 'tekken')")
    return PRE_TOKENIZER_PATTERNS[pre]


def _vocabulary(meta: Metadata, fail) -> tuple[Sequence[str], np.ndarray, Sequence[str]]:
    """The file's tokens, their llama.cpp types (one known type per token) and the merges."""
    tokens = meta.array_of("tokenizer.ggml.tokens", "string", default=[])
    if not tokens:
        raise fail("tokenizer.ggml.tokens is missing or empty")
    n = len(tokens)
    if not meta.has("tokenizer.ggml.token_type"):
        raise fail("tokenizer.ggml.token_type is missing (needed to tell control tokens apart)")
    types = meta.array_of("tokenizer.ggml.token_type", "int")
    if len(types) != n:
        raise fail(f"tokenizer.ggml.token_type must hold {n} integers (one per token), "
                   f"got {len(types)}")
    known = np.isin(types, [t.value for t in TokenType])
    if not known.all():
        bad = int(np.flatnonzero(~known)[0])
        raise fail(f"tokenizer.ggml.token_type[{bad}] is {int(types[bad])}, not a known token type")
    if not meta.has("tokenizer.ggml.merges"):
        raise fail("tokenizer.ggml.merges is missing")
    return tokens, types, meta.array_of("tokenizer.ggml.merges", "string")


@dataclass
class _VocabularyData:
    blob: bytearray  # what every id decodes to, concatenated
    offsets: np.ndarray
    vocab_json: bytearray  # '"piece":id,' for each ordinary token
    n_normal: int
    is_control: np.ndarray
    special_pieces: dict[str, int]  # text -> id of the tokens outside the BPE vocabulary


def _control_mask(types: np.ndarray) -> np.ndarray:
    """Which tokens are control tokens (llama.cpp's CONTROL and UNKNOWN types), never text."""
    return np.isin(types, [TokenType.CONTROL, TokenType.UNKNOWN])


def _read_vocabulary(tokens: Sequence[str], types: np.ndarray, fail) -> _VocabularyData:
    """One pass over the vocabulary, keeping nothing per token but its decoded bytes (in one
    blob) and, for an ordinary token, its entry in the BPE model's JSON text."""
    n = len(tokens)
    is_control = _control_mask(types)
    data = _VocabularyData(bytearray(), np.zeros(n + 1, dtype=np.int64), bytearray(), 0, is_control, {})
    blob, special_pieces = data.blob, data.special_pieces
    for i, (piece, ttype) in enumerate(zip(tokens, types.tolist())):
        if ttype == TokenType.NORMAL:
            try:
                blob += bytes(_CHAR_TO_BYTE[c] for c in piece)
            except KeyError:
                raise fail(f"token {i} {piece!r} is not byte-level BPE text") from None
            data.vocab_json += f"{json.dumps(piece)}:{i},".encode("ascii")  # json.dumps escapes non-ASCII
            data.n_normal += 1
        else:
            # by text: the lowest control id, else the lowest id (as _lookup wants it)
            first = special_pieces.get(piece)
            if first is None or is_control[i] and not is_control[first]:
                special_pieces[piece] = i
            if ttype == TokenType.BYTE:
                value = _byte_token_value(piece)
                if value is None:
                    raise fail(f"token {i} {piece!r} has type BYTE but is not of the form <0xHH>")
                blob.append(value)
            elif ttype == TokenType.USER_DEFINED:
                blob += piece.encode("utf-8")  # llama.cpp stores these as plain text
            # CONTROL, UNKNOWN, UNUSED: nothing in decoded text
        data.offsets[i + 1] = len(blob)
    return data


def _merges_json(merges: Sequence[str], fail) -> bytearray:
    text = bytearray()
    for j, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise fail(f"tokenizer.ggml.merges[{j}] {merge!r} is not 'left right'")
        text += f"{json.dumps(merge)},".encode("ascii")
    return text


def _lookup(piece: str, special_pieces: dict[str, int], is_control: np.ndarray, hf) -> int | None:
    """The id of a token's text: a control token wins over an ordinary one with the same text,
    otherwise the lowest id (the BPE vocabulary holds the ordinary tokens, each once)."""
    other = special_pieces.get(piece)
    if other is not None and is_control[other]:
        return other
    normal = hf.token_to_id(piece)
    if normal is None or other is not None and other < normal:
        return other
    return normal


def _duplicate_normal_token(tokens, types: np.ndarray) -> str | None:
    """The message for an ordinary token given twice (looked for only once the BPE vocabulary
    came out short: this builds the dict the normal path avoids)."""
    seen: dict[str, int] = {}
    for i in np.flatnonzero(types == TokenType.NORMAL).tolist():
        piece = tokens[i]
        if piece in seen:
            return f"token {piece!r} appears twice (ids {seen[piece]} and {i})"
        seen[piece] = i
    return None


def _build_hf_tokenizer(vocab_json: bytearray, merges_json: bytearray, pattern: str, fail):
    """A `tokenizers` BPE from `"piece":id,` and `"left right",` JSON fragments (one ASCII JSON
    text parsed in Rust: ~8 MB for tekken, where the dict and tuples BPE(...) takes are ~60 MB
    of Python objects)."""
    from tokenizers import Regex
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    hf = HFTokenizer(models.BPE(vocab={}, merges=[], ignore_merges=True, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        # maps bytes to GPT-2's printable alphabet; the split above already did the regex part
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
    ])
    config = json.loads(hf.to_str())  # the same settings, with the real vocabulary spliced in
    config["model"]["vocab"], config["model"]["merges"] = "\x00vocab", "\x00merges"  # no setting holds a NUL
    head, rest = json.dumps(config).encode("ascii").split(json.dumps("\x00vocab").encode("ascii"))
    middle, tail = rest.split(json.dumps("\x00merges").encode("ascii"))
    text = b"".join((head, b"{", vocab_json[:-1], b"}", middle, b"[", merges_json[:-1], b"]", tail))
    try:
        return HFTokenizer.from_buffer(text)
    except Exception as exc:  # tokenizers raises plain Exception on a merge of unknown tokens
        raise fail(f"the BPE merges do not fit the vocabulary: {exc}") from None

