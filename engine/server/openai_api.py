"""The OpenAI wire format: request bodies checked and turned into engine calls, replies into JSON.

Pure functions, no HTTP: `parse_chat_request` and `parse_completion_request` refuse anything the
engine cannot honour with an `ApiError` naming the field (OpenAI's error shape, right status),
so a client never gets a silently different behaviour; the `*_response` / `*_chunk` builders
write what the official client parses.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from ..api import ChatMessage, DocumentPart, EngineError, GenerationResult, ImagePart, SamplingParams, ThinkPart, \
    TokenLogprob, ToolSpec
from ..documents.document import DocumentError
from ..documents.file_parts import file_part_bytes
from ..remote.client import image_mime
from ..runtime.prompts import fits
from ..runtime.reasoning import END_THINK, THINK, reasoning_effort_error
from .errors import ApiError, bad  # noqa: F401 - ApiError: the callers' one import
from .tools_api import (ToolRequest, legacy_logprobs_json, logprobs_json, parse_tool_calls_field,
                        parse_tool_message, parse_tool_request, structured_output_grammar, text_offsets,
                        tool_calls_json, tool_request)

# OpenAI's sampling defaults where the window has none of its own; temperature stays Mistral's
# recommended 0.15 (the window's), a client that wants another sends it.
DEFAULT_PARAMS = SamplingParams()
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_CHOICES = 8  # `n`: each choice is one more generation after the shared prompt
MAX_PROMPTS = 32  # a list of prompts on /v1/completions


@dataclass(frozen=True)
class ServedModel:
    """What the server tells about the loaded model, read without touching the engine."""

    id: str  # the GGUF file name without .gguf
    has_vision: bool
    context_size: int
    created: int = field(default_factory=lambda: int(time.time()))
    max_token_bytes: int = 0  # the tokenizer's longest token (0: unknown): bounds tokens by bytes
    vocab_size: int = 0  # the tokenizer's token ids are 0..vocab_size - 1 (0: unknown)
    aliases: tuple[str, ...] = ()  # more ids /v1/models lists (the server's --alias)
    strict: bool = False  # refuse model names not listed (else any name gets this model)

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.id, *(a for a in self.aliases if a != self.id))

    @property
    def capabilities(self) -> list[str]:
        """What the model can do, the one answer for /v1/models, Ollama's /api/show and the
        Responses API: Ollama's names (completion, tools, vision), in /v1/models both on each
        model and in llama-server's `models` list."""
        return ["completion", "tools"] + (["vision"] if self.has_vision else [])

    @property
    def fingerprint(self) -> str:
        """OpenAI's `system_fingerprint`: a string naming the backend configuration (this build
        and this model), the same for every reply while it is served; clients compare it to tell
        a change of backend (llama-server sends its build, OpenAI an `fp_` string)."""
        from tramontane import __version__

        digest = hashlib.blake2b(f"tramontane {__version__} {self.id} {self.context_size}".encode(), digest_size=5)
        return f"fp_{digest.hexdigest()}"


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = 64 << 20  # base64 makes images 4/3 larger
    max_image_bytes: int = 20 << 20  # one decoded image file
    max_images: int = 16  # per request
    max_queue: int = 32  # requests waiting or running: the next one gets 503


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold. The defaults are far above what a browser or the OpenAI
    clients need (they send a request at once; they keep idle connections a few seconds to
    minutes) and bound what a silent or trickling client holds."""

    header_timeout_s: float = 30.0  # from a request's first byte to the end of its headers
    body_timeout_s: float = 300.0  # reading one request's body (64 MiB at ~220 KB/s)
    idle_timeout_s: float = 300.0  # a connection with no request under way (new or kept alive)
    max_connections: int = 256  # open at once; more wait in the kernel's backlog


@dataclass
class ChatJob:
    """A checked request: what to generate and how to answer."""

    params: SamplingParams
    stream: bool
    include_usage: bool
    messages: list[ChatMessage] | None = None  # /v1/chat/completions
    prompt: str | list[int] | None = None  # /v1/completions: the first of `prompts`
    n: int = 1  # choices per prompt
    prompts: list[str | list[int]] = field(default_factory=list)  # /v1/completions: every prompt
    continue_final: bool = False  # chat: the last message is an assistant prefix to continue
    echo: bool = False  # completions: the prompt's text comes back before the reply
    tool_request: ToolRequest | None = None  # chat: tools, tool_choice, response_format, logprobs
    reasoning_format: str = "auto"  # chat: llama.cpp's field, where a thought goes (REASONING_FORMATS)
    # the request's own speculation (mode, drafted tokens at most a step or None); None: the server's
    speculation: tuple[str, int | None] | None = None
    count_prompt: bool = False  # encoded before the reply, its size known at once (Anthropic's message_start)
    param: str = "messages"  # the conversation's field, as the request's API names it (a refusal's `param`)

    @property
    def tools(self) -> list[ToolSpec]:
        """The tools the prompt shows (none when tool_choice is "none")."""
        return self.tool_request.tools if self.tool_request is not None else []


# ------------------------------------------------------------------------------- primitives

def _number(body: dict, name: str, default: float, lo: float = -math.inf, hi: float = math.inf,
            inclusive_lo: bool = True) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(name, f"must be a number, got {value!r}")
    if value > hi or value < lo or (not inclusive_lo and value == lo):
        opening = "[" if inclusive_lo else "("
        raise bad(name, f"must be in {opening}{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _integer(body: dict, name: str, lo: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise bad(name, f"must be at least {lo}, got {value}")
    return value


def _refuse_unsupported(body: dict, supported_defaults: dict[str, Any]) -> None:
    """Fields whose default we honour but whose other values the engine cannot: refused by name,
    never silently ignored."""
    for name, neutral in supported_defaults.items():
        value = body.get(name)
        if value is None or value == neutral or (isinstance(neutral, tuple) and value in neutral):
            continue
        raise bad(name, f"not supported by this server (got {value!r})", code="unsupported_parameter")


_COMMON_UNSUPPORTED = {
    "presence_penalty": 0, "frequency_penalty": 0, "best_of": 1,
}
# chat: tools, tool_choice, response_format, logprobs and top_logprobs are tools_api's
_CHAT_UNSUPPORTED = {**_COMMON_UNSUPPORTED, "functions": ([],), "function_call": ("none", "auto"),
                     "audio": None, "modalities": (["text"],), "prediction": None}
_COMPLETION_UNSUPPORTED = {**_COMMON_UNSUPPORTED, "suffix": ("",), "top_logprobs": 0}
LEGACY_MAX_LOGPROBS = 5  # /v1/completions' `logprobs`: OpenAI's legacy API takes 0..5
SPEC_MODES = ("off", "ngram", "draft")  # draft: the server's --draft-model (none loaded: plain steps)
MAX_SPEC_TOKENS = 16  # runtime/generate.check_params' bound on SamplingParams.spec_tokens


def sampling_params(body: dict, context_size: int) -> SamplingParams:
    """OpenAI's sampling fields, plus the extensions Tramontane's own client and vLLM send
    (top_k, min_p, repetition_penalty, ignore_eos). Other APIs pass their fields under these
    names (their own names in a refusal: `ApiError.param`)."""
    # At least one token: a request for none would only spend a prefill (OpenAI refuses it too).
    max_tokens = _integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", lo=1)
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise bad("stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad("stop", f"at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters")
    seed = _integer(body, "seed")
    if seed is not None and not -(1 << 63) <= seed < 1 << 63:
        raise bad("seed", f"must be a 64-bit integer, got {seed}")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad("ignore_eos", f"must be true or false, got {ignore_eos!r}")
    params = SamplingParams(
        # No limit given: until EOS or a full context, as llama-server does.
        max_tokens=context_size if max_tokens is None else max_tokens,
        temperature=_number(body, "temperature", DEFAULT_PARAMS.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", DEFAULT_PARAMS.top_p, 0.0, 1.0, inclusive_lo=False),
        top_k=_integer(body, "top_k", lo=0) or 0,
        min_p=_number(body, "min_p", DEFAULT_PARAMS.min_p, 0.0, 1.0),
        repetition_penalty=_number(body, "repetition_penalty", DEFAULT_PARAMS.repetition_penalty,
                                   0.0, math.inf, inclusive_lo=False),
        seed=seed, stop=stops, ignore_eos=ignore_eos)
    from ..runtime.generate import (
        check_params,  # here: the CLI's parser imports this module, not torch
    )

    try:
        check_params(params)  # the engine's own rules, in its own words
    except EngineError as exc:
        raise ApiError(400, str(exc)) from None
    return params


MAX_LOGIT_BIAS = 100  # OpenAI's bound on a `logit_bias` value


class LogitBias:
    """OpenAI's `logit_bias` as a logits processor: each listed token's bias (-100..100) added to
    its logit before sampling (and before any grammar's mask), as OpenAI and vLLM apply it; -100
    in effect bans the token, 100 makes it all but certain. Log-probabilities stay the model's."""

    def __init__(self, bias: dict[int, float]):
        self.bias = bias
        self._on: dict = {}  # device -> (ids, values): made once per device

    def __call__(self, generated: list[int], logits):
        import torch

        if logits.device not in self._on:
            self._on[logits.device] = (
                torch.tensor(list(self.bias), dtype=torch.long, device=logits.device),
                torch.tensor(list(self.bias.values()), dtype=logits.dtype, device=logits.device))
        ids, values = self._on[logits.device]
        out = logits.clone()
        out[..., ids] += values
        return out


def with_logit_bias(body: dict, params: SamplingParams, model: ServedModel) -> SamplingParams:
    """`params` with the request's `logit_bias` ({token id: bias}, ids as JSON keys: strings),
    checked against the model's vocabulary."""
    value = body.get("logit_bias")
    if value is None or value == {}:
        return params
    if not isinstance(value, dict):
        raise bad("logit_bias", f"must be an object of token id to bias, got {value!r}")
    bias: dict[int, float] = {}
    for key, b in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad("logit_bias", f"{key!r} is not a token id (an integer)") from None
        check_token_id(token, model, "logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise bad("logit_bias", f"the bias of token {token} must be a number in "
                                    f"[-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {b!r}")
        bias[token] = float(b)
    return replace(params, logits_processors=(*params.logits_processors, LogitBias(bias)))


def request_speculation(body: dict) -> tuple[str, int | None] | None:
    """A request's speculative decoding: Tramontane's `speculation` ("off", "ngram": prompt
    lookup, "draft": the server's draft model) and llama-server's `speculative.n_max` (at most
    that many drafted tokens a step; 0 turns it off, more turns prompt lookup on unless the
    request asks for the draft model) and `speculative.n_min`.
    None where the request says nothing: the server's default (`serve --spec`). Lossless either
    way: only the speed changes."""
    mode = body.get("speculation")
    if mode is not None and mode not in SPEC_MODES:
        raise bad("speculation", f"must be one of {', '.join(SPEC_MODES)}, got {mode!r}")
    n_max = _integer(body, "speculative.n_max", lo=0)
    if n_max is not None and n_max > MAX_SPEC_TOKENS:
        raise bad("speculative.n_max", f"must be 0..{MAX_SPEC_TOKENS}, got {n_max}")
    n_min = _integer(body, "speculative.n_min", lo=0)
    if n_min is not None and n_min > 1:
        # prompt lookup drafts what its match and the measured acceptance allow, never padding a
        # draft to a minimum: a minimum would only skip short drafts, which this engine does not
        raise bad("speculative.n_min", f"must be 0 or 1 (prompt lookup's drafts have no minimum length), "
                                       f"got {n_min}", code="unsupported_parameter")
    if n_max is None:
        return None if mode is None else (mode, None)
    if n_max == 0 or mode == "off":
        if mode in ("ngram", "draft"):
            raise bad("speculative.n_max", f"is 0 (no drafts) while speculation is {mode}: send one of them")
        return "off", None
    return ("draft" if mode == "draft" else "ngram"), n_max


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", "must be an object")
    include_usage = bool((options or {}).get("include_usage", False))
    if options and not stream:
        raise bad("stream_options", "only allowed when stream is true")
    return stream, include_usage


def check_model(body: dict, model: ServedModel) -> None:
    """Any model name is answered by the loaded model (clients are often configured with
    another name, as llama-server and LM Studio allow); a strict server wants a listed id (404)."""
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise bad("model", f"must be a string, got {name!r}")
    if model.strict and name not in model.ids:
        raise model_not_found(name, model)


def model_not_found(name: str, model: ServedModel) -> ApiError:
    served = ", ".join(repr(i) for i in model.ids)
    return ApiError(404, f"model {name!r} does not exist here: this server serves {served}",
                    "model", "model_not_found")


def _choice_count(body: dict) -> int:
    n = _integer(body, "n", lo=1)
    if n is not None and n > MAX_CHOICES:
        raise bad("n", f"at most {MAX_CHOICES} choices per request, got {n}")
    return n or 1


def longest_token_bytes(tokenizer) -> int:
    """The most bytes one token stands for: a text of B bytes is at least B / this many tokens."""
    return tokenizer.longest_token_bytes  # one pass over the offsets, not a Python loop over 131k ids


def context_exceeded(param: str, tokens: int, model: ServedModel, at_least: bool = False) -> ApiError:
    """OpenAI's over-context refusal (400, code context_length_exceeded), in words."""
    count = f"at least {tokens}" if at_least else f"{tokens}"
    return ApiError(400, f"{param}: this model's maximum context length is {model.context_size} tokens, "
                         f"but the prompt is {count} tokens (and the reply needs at least one more): "
                         "shorten it, or serve the model with a longer --context-length",
                    param, "context_length_exceeded")


def check_text_fits(param: str, text_bytes, model: ServedModel, other_tokens: int = 1) -> None:
    """Refuse, before any tokenizing, a text too long for the context whatever its tokens: no
    token is longer than `max_token_bytes`, so B bytes are at least B / max_token_bytes tokens.
    What passes costs at most a context's worth of bytes to tokenize. `text_bytes`: the count,
    or `size(in_bytes)` giving characters (False; cheap, and never more than the bytes) or bytes
    (True), so a huge text is refused without encoding it. `other_tokens`: what the prompt holds
    besides the text, at least (BOS)."""
    if model.max_token_bytes <= 0:
        return
    if callable(text_bytes):  # counted only when needed: a character is at least one byte
        chars_bound = -(-text_bytes(False) // model.max_token_bytes) + other_tokens
        if not fits(chars_bound, model.context_size):
            raise context_exceeded(param, chars_bound, model, at_least=True)
        text_bytes = text_bytes(True)
    at_least = -(-text_bytes // model.max_token_bytes) + other_tokens  # ceil
    if not fits(at_least, model.context_size):
        raise context_exceeded(param, at_least, model, at_least=True)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def message_text_bytes(messages: list[ChatMessage], in_bytes: bool = True) -> int:
    """A lower bound of the UTF-8 bytes the chat encoding tokenizes (assistant text loses its
    trailing spaces there); in characters (cheaper, fewer) unless `in_bytes`."""
    size = _utf8_len if in_bytes else len
    total = 0
    for m in messages:
        for part in m.parts:
            if isinstance(part, str):
                total += size(part.rstrip(" ") if m.role == "assistant" else part)
    return total


# ------------------------------------------------------------------------------- chat

def data_url_image(url: str, where: str, index: int, limits: RequestLimits) -> ImagePart:
    if not url.startswith("data:"):
        raise remote_image(where, url, "data: URLs", "send the image inline as data:image/png;base64,...")
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise bad(where, "a data URL needs ';base64,' before the image bytes", code="invalid_image_url")
    return decoded_image(payload, where, index, limits)


def remote_image(where: str, url: str, accepted: str, how: str) -> ApiError:
    """An image by URL, refused: the server is offline."""
    scheme = url.split(":", 1)[0] if ":" in url[:12] else "a"
    return bad(where, f"only {accepted} are accepted, not {scheme} URLs (this server is offline "
                      f"and never fetches anything): {how}", code="invalid_image_url")


def decoded_image(payload: str, where: str, index: int, limits: RequestLimits) -> ImagePart:
    """An image sent as base64 (a data URL's payload, Anthropic's base64 source, Ollama's
    `images`), its size bounded before decoding and its format read from its own bytes."""
    if len(payload) * 3 // 4 > limits.max_image_bytes + 3:
        raise bad(where, f"image is larger than the limit of {limits.max_image_bytes >> 20} MiB",
                  413, "image_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad(where, "the image is not valid base64", code="invalid_image_url") from None
    image = ImagePart(data, f"image {index + 1}")
    try:
        image_mime(image)  # the bytes' own header: PNG, JPEG, WebP, GIF, BMP or TIFF
    except EngineError as exc:
        raise bad(where, str(exc), code="invalid_image") from None
    return image


def check_image_count(images: list, where: str, limits: RequestLimits) -> None:
    if len(images) >= limits.max_images:
        raise bad(where, f"at most {limits.max_images} images per request", 413, "too_many_images")


def check_vision(messages: list[ChatMessage], model: "ServedModel", param: str = "messages") -> None:
    if not model.has_vision and any(m.images for m in messages):
        raise ApiError(400, f"{param}: {model.id} has no vision projector, so it cannot read "
                            "images (start the server with its mmproj file)", param,
                       "model_has_no_vision")


def _content_parts(content, where: str, role: str, images: list, limits: RequestLimits) -> list:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of content parts")
    parts: list = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise bad(f"{at}.text", "must be a string")
            parts.append(text)
        elif kind == "image_url":
            if role != "user":
                raise bad(at, f"images can only be sent in user messages, not {role} messages")
            spec = part.get("image_url")
            url = spec.get("url") if isinstance(spec, dict) else spec
            if not isinstance(url, str):
                raise bad(f"{at}.image_url.url", "must be a string")
            check_image_count(images, at, limits)
            image = data_url_image(url, f"{at}.image_url.url", len(images), limits)
            images.append(image)
            parts.append(image)
        elif kind == "file":
            parts.append(_file_part(part, at, role))
        else:
            raise bad(f"{at}.type", f"{kind!r} parts are not supported (only text, image_url and file)")
    return parts


def _file_part(part: dict, at: str, role: str) -> DocumentPart:
    """A `file` part's bytes, not yet read: `documents_prompt` reads and places it, off the
    event loop (openai_routes)."""
    if role != "user":
        raise bad(at, f"files can only be sent in user messages, not {role} messages")
    try:
        name, data = file_part_bytes(part)
    except DocumentError as exc:
        raise bad(f"{at}.file", str(exc), code="invalid_file") from None
    return DocumentPart(data, name)


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def parse_messages(raw, limits: RequestLimits) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty list of messages")
    messages: list[ChatMessage] = []
    images: list[ImagePart] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object with role and content")
        role = m.get("role")
        if role == "tool":
            messages.append(parse_tool_message(m, where))
            continue
        if role not in _ROLES:
            raise bad(f"{where}.role", f"must be system, user, assistant or tool, got {role!r}")
        parts = _content_parts(m.get("content"), f"{where}.content", role, images, limits)
        calls = parse_tool_calls_field(m.get("tool_calls"), where) if role == "assistant" else []
        if role == "assistant":
            parts = _earlier_thought(m, where) + parts
        messages.append(ChatMessage(_ROLES[role], parts, calls))
    return messages  # a last assistant message is a prefix to continue (mistral-common's prefix=True)


def _earlier_thought(m: dict, where: str) -> list:
    """An earlier assistant turn's thought, sent back in vLLM's field (`reasoning_content`, or its
    newer `reasoning`), as the think chunk mistral-common encodes before the answer (the window's
    rule; a model that does not think leaves it out, chat_format)."""
    for name in ("reasoning_content", "reasoning"):
        value = m.get(name)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise bad(f"{where}.{name}", f"must be a string, got {value!r}")
        return [ThinkPart(value)]
    return []


def parse_chat_request(body, model: ServedModel, limits: RequestLimits) -> ChatJob:
    """A /v1/chat/completions body, checked; raises ApiError naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    check_model(body, model)
    _refuse_unsupported(body, _CHAT_UNSUPPORTED)
    messages = parse_messages(body.get("messages"), limits)
    _check_continuation(body, messages)
    stream, include_usage = _stream_flags(body)
    params = with_logit_bias(body, sampling_params(body, model.context_size), model)
    job = chat_job(messages, model, params, stream,
                   parse_tool_request(body), include_usage=include_usage, n=_choice_count(body))
    job.reasoning_format = _reasoning_format(body)
    check_reasoning_effort(body.get("reasoning_effort"), "reasoning_effort")
    job.speculation = request_speculation(body)
    return job


def check_reasoning_effort(value, field: str) -> None:
    """OpenAI's `reasoning_effort` (the Responses API's `reasoning.effort`), by runtime.reasoning's
    rule: one of mistral-common's names is accepted and, for these models' formats, changes
    nothing (as vLLM serves them); anything else is refused naming the field."""
    problem = reasoning_effort_error(value)
    if problem:
        raise bad(field, problem)


def _check_continuation(body: dict, messages: list[ChatMessage]) -> None:
    """vLLM's `add_generation_prompt` / `continue_final_message`: a last assistant message is
    continued (mistral-common's prefix=True) whether or not the request says so, as llama-server
    prefills it; both set true, or continuing a message that is not the assistant's, is refused
    (vLLM's and llama-server's rules), never answered as something else."""
    flags = {}
    for name in ("add_generation_prompt", "continue_final_message"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise bad(name, f"must be true or false, got {value!r}")
        flags[name] = value
    if flags["continue_final_message"] and flags["add_generation_prompt"]:
        raise bad("continue_final_message", "cannot be true with add_generation_prompt true: a reply "
                                            "either continues the last message or starts a new one")
    if flags["continue_final_message"] and messages and messages[-1].role != "assistant":
        raise bad("continue_final_message", f"needs a last message from the assistant to continue, "
                                            f"got one from {messages[-1].role}")


# llama.cpp's `reasoning_format` (its --reasoning-format): "none" leaves the thought inline in the
# content, as generated; "deepseek" (and "auto", the default) puts it in `reasoning_content`, the
# field vLLM's mistral reasoning parser fills; "deepseek-legacy" does both.
REASONING_FORMATS = ("auto", "none", "deepseek", "deepseek-legacy")


def _reasoning_format(body: dict) -> str:
    value = body.get("reasoning_format", "auto")
    if value not in REASONING_FORMATS:
        raise bad("reasoning_format", f"must be one of {', '.join(REASONING_FORMATS)}, got {value!r}")
    return value


def reasoning_of(result: GenerationResult) -> tuple[str | None, str]:
    """A reply's reasoning (a reasoning model's [THINK]...[/THINK], split off by the scheduler)
    and its answer. The one place every API reads reasoning from: OpenAI's `reasoning_content`,
    Anthropic's `thinking` blocks, Ollama's `message.thinking`, the Responses API's reasoning
    items. None when the model did not think."""
    return result.reasoning or None, result.text


class ThoughtShape:
    """Where one chat reply's thought goes under a `reasoning_format`: `reasoning_content`, the
    content inline between [THINK] and [/THINK] (as the model wrote it), or both. Streamed, it
    remembers per choice whether a [THINK] is open, to close it before the answer's first piece."""

    def __init__(self, reasoning_format: str = "auto"):
        self.separate = reasoning_format != "none"
        self.inline = reasoning_format in ("none", "deepseek-legacy")
        self._open: set[int] = set()

    def message(self, result: GenerationResult) -> tuple[str | None, str]:
        """The whole reply's (reasoning_content, content)."""
        reasoning, text = reasoning_of(result)
        if reasoning and self.inline:
            text = THINK + reasoning + END_THINK + text
        return (reasoning if self.separate else None), text

    def thought(self, index: int, piece: str) -> dict:
        """The delta of a streamed piece of thought."""
        delta = {"reasoning_content": piece} if self.separate else {}
        if self.inline:
            delta["content"] = ("" if index in self._open else THINK) + piece
            self._open.add(index)
        return delta

    def answer(self, index: int, piece: str) -> str:
        """A streamed piece of the answer's content (after the thought's [/THINK] when inline)."""
        if index in self._open:
            self._open.discard(index)
            return END_THINK + piece
        return piece


def chat_job(messages: list[ChatMessage], model: ServedModel, params: SamplingParams, stream: bool,
             tool_request: ToolRequest | None, include_usage: bool = False, n: int = 1,
             param: str = "messages") -> ChatJob:
    """The one request model of every chat-shaped API, its conversation checked against the
    model (images need vision; a text too long for the context is refused before tokenizing)."""
    if not messages:
        raise bad(param, "must hold at least one message")
    check_vision(messages, model, param)
    check_text_fits(param, lambda in_bytes: message_text_bytes(messages, in_bytes), model)
    return ChatJob(params, stream, include_usage, messages=messages, n=n,
                   continue_final=messages[-1].role == "assistant", tool_request=tool_request, param=param)


def _is_token_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


@dataclass
class TokenizeJob:
    """A /tokenize body: a text (`content`, llama-server's; `prompt`, vLLM's) or a chat
    (`messages`, vLLM's: the prompt the chat format renders), BOS added or not, and whether each
    id comes with its piece (llama-server's `with_pieces`)."""

    text: str | None
    messages: list[ChatMessage] | None
    add_special: bool
    with_pieces: bool


def parse_tokenize_request(body, limits: RequestLimits) -> TokenizeJob:
    """llama-server's /tokenize ({content, add_special = false, with_pieces}) and vLLM's ({prompt
    or messages, add_special_tokens = true}): each API's default for adding BOS, its names in a
    refusal."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    given = [name for name in ("content", "prompt", "messages") if body.get(name) is not None]
    if len(given) != 1:
        raise bad("content", "give one of content (llama-server's), prompt or messages (vLLM's), got "
                             + (", ".join(given) or "none"))
    (name,) = given
    flag, default = ("add_special", False) if name == "content" else ("add_special_tokens", name == "prompt")
    add_special = body.get(flag, default)
    with_pieces = body.get("with_pieces", False)
    for field_name, value in ((flag, add_special), ("with_pieces", with_pieces)):
        if not isinstance(value, bool):
            raise bad(field_name, f"must be true or false, got {value!r}")
    if name == "messages":
        if add_special:
            raise bad(flag, "cannot be true with messages: the chat format writes its own BOS")
        return TokenizeJob(None, parse_messages(body["messages"], limits), add_special, with_pieces)
    if not isinstance(body[name], str):
        raise bad(name, f"must be a string, got {body[name]!r}")
    return TokenizeJob(body[name], None, add_special, with_pieces)


def tokenize_reply(engine, job: TokenizeJob, model: ServedModel) -> dict:
    """The ids (on the engine's thread): with their pieces, llama-server's shape (a piece that is
    not whole UTF-8 as its bytes), and vLLM's `count` and `max_model_len` beside them."""
    tok = engine.tokenizer
    if job.messages is not None:  # the chat format's ids, its BOS first
        ids = list(engine.encode(job.messages).ids)
    else:
        ids = ([tok.bos_id] if job.add_special else []) + tok.encode(job.text)
    tokens: list = ids
    if job.with_pieces:
        tokens = []
        for i in ids:
            raw = tok.piece(i).encode() if tok.is_control(i) else tok.token_bytes(i)
            try:
                piece = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            tokens.append({"id": i, "piece": piece})
    return {"tokens": tokens, "count": len(ids), "max_model_len": model.context_size}


def check_token_id(token: int, model: ServedModel, where: str) -> None:
    """A token id a request gives (logit_bias, /detokenize, a prompt of ids): inside the
    vocabulary, refused naming its field otherwise."""
    if token < 0 or (model.vocab_size and token >= model.vocab_size):
        known = f" (0..{model.vocab_size - 1})" if model.vocab_size else ""
        raise bad(where, f"token id {token} is not in the model's vocabulary{known}")


def parse_detokenize_request(body, model: ServedModel) -> list[int]:
    """/detokenize's `tokens` (llama-server's and vLLM's), checked against the vocabulary."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad("tokens", "must be a list of token ids (integers)")
    for i, t in enumerate(tokens):
        check_token_id(t, model, f"tokens[{i}]")
    return tokens


def parse_completion_request(body, model: ServedModel, limits: RequestLimits) -> ChatJob:
    """A /v1/completions body: `prompt` is a string (BOS is added, control-token text stays
    text), a list of token ids (used as given), or a list of either (one answer each; choices
    are numbered across prompts, prompt i's j-th choice is i * n + j, as OpenAI does)."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body: must be a JSON object")
    check_model(body, model)
    _refuse_unsupported(body, _COMPLETION_UNSUPPORTED)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_token_list(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_token_list(p) for p in prompt):
        prompts = list(prompt)
    else:
        raise bad("prompt", "must be a string, a non-empty list of token ids, or a list of those")
    if len(prompts) > MAX_PROMPTS:
        raise bad("prompt", f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            check_text_fits(where, lambda in_bytes, p=p: _utf8_len(p) if in_bytes else len(p), model)
        else:
            for t in p:  # named here: the engine's own refusal has no field to name
                check_token_id(t, model, where)
            if not fits(len(p), model.context_size):
                raise context_exceeded(where, len(p), model)
    stream, include_usage = _stream_flags(body)
    top = _legacy_logprobs(body)
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad("echo", f"must be true or false, got {echo!r}")
    grammar = structured_output_grammar(body)
    request = tool_request([], grammar_text=grammar, top_logprobs=top) if grammar or top is not None else None
    params = with_logit_bias(body, sampling_params(body, model.context_size), model)
    return ChatJob(params, stream, include_usage, prompt=prompts[0],
                   n=_choice_count(body), prompts=prompts, tool_request=request, echo=echo,
                   speculation=request_speculation(body))


def _legacy_logprobs(body: dict) -> int | None:
    """/v1/completions' `logprobs`: how many alternatives per token, 0..5 (null or false: none)."""
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LEGACY_MAX_LOGPROBS:
        raise bad("logprobs", f"must be an integer 0..{LEGACY_MAX_LOGPROBS} (the alternatives per token), "
                              f"got {value!r}")
    return value


# ------------------------------------------------------------------------------- conversations

def _message_digest(message: ChatMessage) -> bytes:
    h = hashlib.sha256(message.role.encode())
    for part in message.parts:
        if isinstance(part, ImagePart):
            h.update(b"\x00i" + bytes.fromhex(part.sha256))
        elif isinstance(part, ThinkPart):  # an earlier thought sent back: a conversation of its own
            data = part.text.encode("utf-8", "surrogatepass")
            h.update(b"\x00k" + bytes([part.closed]) + len(data).to_bytes(8, "little") + data)
        else:
            data = part.encode("utf-8", "surrogatepass")
            h.update(b"\x00t" + len(data).to_bytes(8, "little") + data)
    for call in message.tool_calls:
        h.update(b"\x00c" + json.dumps([call.id, call.name, call.arguments]).encode())
    if message.tool_call_id is not None:
        h.update(b"\x00r" + message.tool_call_id.encode("utf-8", "surrogatepass"))
    return h.digest()


def prefix_digests(messages: list[ChatMessage]) -> list[bytes]:
    """digests[k]: a hash of messages[:k + 1] (a chain, so each prefix costs one message)."""
    out, running = [], b""
    for message in messages:
        running = hashlib.sha256(running + _message_digest(message)).digest()
        out.append(running)
    return out


class ConversationKeys:
    """Which engine session (KV cache entry) holds each conversation the server has answered.

    OpenAI clients resend the whole conversation every turn and name no chat; a request is
    given the session of its longest prefix that was an earlier request or request + reply, so
    a growing conversation prefills only its new tokens and two conversations never share an
    entry. Keys live in their own "openai:" namespace, apart from the window's chat ids. The
    engine only reuses KV whose tokens match, so a wrong guess costs time, never correctness."""

    PREFIX = "openai:"

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._keys: OrderedDict[bytes, str] = OrderedDict()

    def key_for(self, messages: list[ChatMessage]) -> str:
        for digest in reversed(prefix_digests(messages)):
            key = self._keys.get(digest)
            if key is not None:
                self._keys.move_to_end(digest)
                return key
        return self.PREFIX + uuid.uuid4().hex

    def remember(self, messages: list[ChatMessage], reply: str, key: str) -> None:
        """After a reply: the same request again (regenerate) or the next turn find `key`."""
        done = messages + [ChatMessage.text("assistant", reply)]
        digests = prefix_digests(done)
        for digest in (digests[-2], digests[-1]):
            self._keys[digest] = key
            self._keys.move_to_end(digest)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)


# ------------------------------------------------------------------------------- replies

def finish_reason(result: GenerationResult) -> str:
    """A reply cut inside its tool calls is "length" (with the calls so far), as OpenAI says."""
    if result.finish_reason == "length":
        return "length"
    return "tool_calls" if result.tool_calls else "stop"


def usage(result: GenerationResult) -> dict:
    return usage_of([result])


def usage_of(results: list[GenerationResult], n: int = 1) -> dict:
    """The usage of a request with several choices: prompt i's choices are results[i*n:(i+1)*n];
    each prompt counts once (its choices share it, as OpenAI bills `n`), every reply counts."""
    firsts = results[::n]
    prompt = sum(r.stats.prompt_tokens for r in firsts)
    completion = sum(r.stats.generated_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(r.stats.reused_tokens for r in firsts)}}


def timings_of(results: list[GenerationResult], speculating: bool = False) -> dict:
    """llama-server's `timings` (beside `usage`): prompt tokens computed and from the cache, tokens
    generated and their speeds; while speculating, the tokens drafted and of those accepted
    (`draft_n`, `draft_n_accepted`), summed over the choices."""
    stats = [r.stats for r in results]
    prompt_n = sum(s.prefilled_tokens for s in stats)
    predicted_n = sum(s.generated_tokens for s in stats)
    prompt_ms = sum(s.prefilled_tokens / s.prefill_tok_s * 1e3 for s in stats if s.prefill_tok_s > 0)
    predicted_ms = sum(s.generated_tokens / s.decode_tok_s * 1e3 for s in stats if s.decode_tok_s > 0)
    out = {"cache_n": sum(s.reused_tokens for s in stats), "prompt_n": prompt_n, "prompt_ms": prompt_ms,
           "prompt_per_second": prompt_n / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
           "predicted_n": predicted_n, "predicted_ms": predicted_ms,
           "predicted_per_second": predicted_n / predicted_ms * 1e3 if predicted_ms > 0 else 0.0}
    if speculating:  # llama-server sends these only where speculation is on
        out["draft_n"] = sum(s.drafted_tokens for s in stats)
        out["draft_n_accepted"] = sum(s.accepted_tokens for s in stats)
    return out


def stop_reason(result: GenerationResult, params: SamplingParams, full_text: str) -> str | None:
    """The stop string that ended the reply (vLLM's `stop_reason`; Tramontane's client reads it)."""
    if result.finish_reason != "stop_string":
        return None
    return next((s for s in params.stop if full_text.startswith(s, len(result.text))),
                params.stop[0] if params.stop else None)


class Reply:
    """One answer in OpenAI's shape: a chat completion or a text completion, whole or as
    stream chunks, all under one id and creation time."""

    def __init__(self, endpoint: str, model: ServedModel, include_usage: bool = False,
                 reasoning_format: str = "auto", speculating: bool = False):
        self.chat = endpoint == "chat"
        self.thoughts = ThoughtShape(reasoning_format)
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage  # streamed: a last chunk carries the usage
        self.speculating = speculating  # timings: drafted and accepted tokens
        # streamed logprobs, per choice: entries already sent with pieces, and (text completions)
        # the text offset the next entry starts at
        self._logprobs_sent: dict[int, int] = {}
        self._text_offset: dict[int, int] = {}

    def _body(self, streamed: bool, choices: list) -> dict:
        kind = ("chat.completion.chunk" if streamed else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model.id,
                "system_fingerprint": self.model.fingerprint, "choices": choices}

    def _choice(self, streamed: bool, text: str, finish: str | None = None,
                reason: str | None = None) -> dict:
        if not self.chat:
            content = {"text": text}
        elif streamed:
            content = {"delta": {} if finish else {"content": text}}
        else:
            content = {"message": {"role": "assistant", "content": text}}
        choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = reason
        return choice

    def _chunk(self, choice: dict) -> dict:
        body = self._body(True, [choice])
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return body

    def whole(self, result: GenerationResult, reason: str | None) -> dict:
        reasoning, text = self.thoughts.message(result) if self.chat else (None, result.text)
        choice = self._choice(False, text, finish_reason(result), reason)
        if reasoning is not None:
            choice["message"]["reasoning_content"] = reasoning
        if self.chat and result.tool_calls:
            choice["message"]["content"] = text or None
            choice["message"]["tool_calls"] = tool_calls_json(result.tool_calls)
        choice["logprobs"] = (logprobs_json if self.chat else legacy_logprobs_json)(result.logprobs)
        body = self._body(False, [choice])
        body["usage"] = usage(result)
        body["timings"] = timings_of([result], self.speculating)
        return body

    def opening(self) -> dict | None:
        """The chat stream's first chunk (the role); text completions have none."""
        if not self.chat:
            return None
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def piece(self, text: str, logprobs: list[TokenLogprob] | None = None, index: int = 0) -> dict:
        """A chunk of streamed text, with the logprobs of the tokens it shows when given."""
        chunk = self._chunk(self._choice(True, text))
        if logprobs is not None:
            chunk["choices"][0]["logprobs"] = self._streamed_logprobs(index, logprobs)
        return chunk

    def _streamed_logprobs(self, index: int, entries: list[TokenLogprob]) -> dict:
        self._logprobs_sent[index] = self._logprobs_sent.get(index, 0) + len(entries)
        if self.chat:
            return logprobs_json(entries)
        start = self._text_offset.get(index, 0)
        self._text_offset[index] = text_offsets(entries, start)[-1]
        return legacy_logprobs_json(entries, start)

    def closing(self, result: GenerationResult, reason: str | None, index: int = 0) -> list[dict]:
        """The chunk with the finish reason (and the logprobs no piece carried: a held stop
        string's, the end token's), then the usage chunk when it was asked for."""
        chunks = [self._chunk(self._choice(True, "", finish_reason(result), reason))]
        chunks[0]["timings"] = timings_of([result], self.speculating)  # llama-server: on the reply's last chunk
        if result.logprobs is not None:
            rest = result.logprobs[self._logprobs_sent.get(index, 0):]
            chunks[0]["choices"][0]["logprobs"] = self._streamed_logprobs(index, rest)
        if self.include_usage:
            body = self._body(True, [])
            body["usage"] = usage(result)
            chunks.append(body)
        return chunks


def model_object(model: ServedModel, name: str | None = None) -> dict:
    """The model under its id, or under one of its aliases."""
    return {"id": name or model.id, "object": "model", "created": model.created, "owned_by": "tramontane",
            "max_model_len": model.context_size,  # vLLM's field: clients size their prompts by it
            "capabilities": model.capabilities}


def models_response(model: ServedModel) -> dict:
    """OpenAI's list, and llama-server's `models` beside it (where its clients read capabilities)."""
    return {"object": "list", "data": [model_object(model, name) for name in model.ids],
            "models": [{"name": name, "model": name, "type": "model", "capabilities": model.capabilities}
                       for name in model.ids]}
