"""OpenAI's tools, tool_choice, response_format and logprobs: parsed from a chat request, turned
into what the engine does (the tools in the prompt, a grammar, control tokens shown), and the
reply's shapes (`tool_calls`, streamed tool-call deltas, `logprobs.content`).

Pure functions and one small stream filter; no HTTP. The request side raises `ApiError` naming
the field; a schema the grammar library refuses is refused here, before any work.
"""
from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field, replace

from ..api import GenerationResult, ReasoningPiece, SamplingParams, TokenLogprob, ToolCall, ToolSpec
from .errors import bad

MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
ARGUMENT_PIECE = 24  # characters of arguments per streamed delta
MARKER = "[TOOL_CALLS]"


def _bad(param: str, message: str, code: str | None = None):
    return bad(param, message, code=code)


@dataclass
class ToolRequest:
    """What a chat request asks of tools and output format."""

    tools: list[ToolSpec] = field(default_factory=list)  # shown in the prompt (empty: none)
    choice: str = "auto"  # auto / required / none / named
    named: str | None = None  # the function tool_choice names
    parallel: bool = True
    grammar: str | None = None  # response_format's grammar (Lark text for llguidance)
    top_logprobs: int | None = None  # None: no logprobs

    @property
    def calls_tools(self) -> bool:
        """Tool calls are possible: the reply is read for [TOOL_CALLS]."""
        return bool(self.tools) and self.choice != "none"


# ----------------------------------------------------------------------------- request

def parse_tools(raw) -> list[ToolSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("tools", "must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    check_tool_count(raw)
    specs = []
    for i, tool in enumerate(raw):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise _bad(f"{at}.type", "only function tools are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{at}.function", "must be an object with name, description and parameters")
        specs.append(tool_spec(fn, f"{at}.function", specs))
    return specs


def check_tool_count(raw: list) -> None:
    if len(raw) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools, got {len(raw)}")


def tool_spec(fn: dict, at: str, earlier: list[ToolSpec], schema_field: str = "parameters") -> ToolSpec:
    """One function tool (`name`, `description`, its JSON Schema under `schema_field`: OpenAI's
    `parameters`, Anthropic's `input_schema`), checked against the tools before it."""
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _bad(f"{at}.name", f"must be 1-64 letters, digits, _ or -, got {name!r}")
    if any(t.name == name for t in earlier):
        raise _bad(f"{at}.name", f"{name!r} is given twice")
    description = fn.get("description", "")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{at}.description", "must be a string")
    parameters = fn.get(schema_field, {})
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise _bad(f"{at}.{schema_field}", "must be a JSON Schema object")
    return ToolSpec(name, description or "", parameters)


def parse_tool_choice(raw, tools: list[ToolSpec]) -> tuple[str, str | None]:
    if raw is None:
        return "auto", None
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise _bad("tool_choice", "'required' needs tools")
        return raw, None
    fn = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad("tool_choice", "must be 'auto', 'none', 'required' or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if name not in {t.name for t in tools}:
        raise _bad("tool_choice", f"names {name!r}, which is not among the tools")
    return "named", name


def parse_response_format(raw) -> str | None:
    """The grammar for `response_format` (None for text)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad("response_format", "must be an object with a type (text, json_object, json_schema)")
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":  # llama-server's extension: a `schema` beside the type
        schema = raw.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise _bad("response_format.schema", f"must be a JSON Schema object, got {schema!r}")
        return output_grammar(schema, "response_format.schema" if schema is not None else "response_format")
    if kind == "json_schema":
        spec = raw.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _bad("response_format.json_schema.schema", "must be a JSON Schema object")
        strict = spec.get("strict", False)
        if not isinstance(strict, bool) and strict is not None:
            raise _bad("response_format.json_schema.strict", "must be true or false")
        return output_grammar(schema, "response_format")
    raise _bad("response_format.type", f"must be text, json_object or json_schema, got {kind!r}")


def output_grammar(schema: dict | None, where: str) -> str:
    """The grammar of a reply that is JSON: any object (None), or valid against `schema`.

    Objects are closed by default, strict or not: an object schema that lists `properties`
    and leaves `additionalProperties` unset admits no other keys (vLLM's default grammar
    backend, xgrammar, does the same). Every pydantic model's schema leaves it unset, and a
    random or small model would otherwise add keys until the token limit. A schema that wants
    more keys says so (`additionalProperties: true` or a schema)."""
    from ..runtime import grammar

    text = grammar.json_object_grammar() if schema is None else grammar.json_schema_grammar(schema, strict=True)
    problem = grammar.check_grammar(text)
    if problem:
        raise _bad(where, f"the schema cannot be used: {problem}", code="invalid_schema")
    return text


GUIDED = ("guided_json", "guided_choice", "guided_regex", "guided_grammar")  # vLLM's older names
LLAMA_CPP_OUTPUTS = {"json_schema": "guided_json", "grammar": "gbnf"}  # llama-server's fields: a schema, GBNF
_STRUCTURED_KINDS = {"json": "guided_json", "choice": "guided_choice", "regex": "guided_regex",
                     "grammar": "guided_grammar"}


def structured_output_grammar(body: dict) -> str | None:
    """vLLM's structured outputs (`structured_outputs: {json | choice | regex | grammar}`, or
    the older `guided_*` fields) and llama-server's `json_schema` / `grammar` (GBNF, converted by
    llguidance's own gbnf_to_lark) as a grammar: honoured where llguidance can (vLLM's grammar is
    Lark text, as llguidance reads it), refused in one sentence otherwise; never ignored."""
    asked = {name: body[name] for name in (*GUIDED, *LLAMA_CPP_OUTPUTS) if body.get(name) is not None}
    nested = body.get("structured_outputs")
    if nested is not None:
        if not isinstance(nested, dict):
            raise _bad("structured_outputs", "must be an object with one of json, choice, regex, grammar")
        unknown = sorted(k for k, v in nested.items() if v is not None and k not in _STRUCTURED_KINDS)
        if unknown:
            raise _bad(f"structured_outputs.{unknown[0]}", "not supported by this server "
                       "(json, choice, regex and grammar are)", code="unsupported_parameter")
        asked.update({f"structured_outputs.{k}": v for k, v in nested.items() if v is not None})
    for name in ("guided_whitespace_pattern", "guided_decoding_backend"):
        if body.get(name) is not None:
            raise _bad(name, "not supported by this server (its grammar library is llguidance, "
                             "with JSON's usual whitespace)", code="unsupported_parameter")
    if not asked:
        return None
    if len(asked) > 1:
        raise _bad(sorted(asked)[1], f"only one structured output at a time, got {', '.join(sorted(asked))}")
    ((name, value),) = asked.items()
    if name.startswith("structured_outputs."):
        kind = _STRUCTURED_KINDS[name.removeprefix("structured_outputs.")]
    else:
        kind = LLAMA_CPP_OUTPUTS.get(name, name)
    from ..runtime import grammar

    if kind == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise _bad(name, "must be a JSON Schema (an object, or its JSON text)") from None
        if not isinstance(value, dict):
            raise _bad(name, "must be a JSON Schema object")
        return output_grammar(value, name)
    if kind == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise _bad(name, "must be a non-empty list of non-empty strings")
        text = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
    elif kind == "guided_regex":
        if not isinstance(value, str) or not value:
            raise _bad(name, "must be a regular expression (a non-empty string)")
        text = "start: /" + value.replace("/", "\\/") + "/"
    elif kind == "gbnf":  # llama.cpp's grammar format, as llguidance converts it to its Lark
        if not isinstance(value, str) or not value.strip():
            raise _bad(name, "must be a grammar (GBNF text, as llama.cpp reads it)")
        from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

        try:
            text = gbnf_to_lark(value)
        except GbnfToLarkError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise _bad(name, f"is not a GBNF grammar this server can read: {first}", code="invalid_grammar") from None
    else:
        if not isinstance(value, str) or not value.strip():
            raise _bad(name, "must be a grammar (Lark text)")
        text = value
    problem = grammar.check_grammar(text)
    if problem:
        first = problem.strip().splitlines()[0]
        reads = "llama.cpp's GBNF" if kind == "gbnf" else "llguidance's Lark"
        raise _bad(name, f"cannot be used (this server reads this grammar as {reads}): {first}",
                   code="invalid_grammar")
    return text


def parse_logprobs(body: dict) -> int | None:
    from ..runtime.generate import MAX_TOP_LOGPROBS

    wanted = body.get("logprobs")
    top = body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise _bad("logprobs", f"must be true or false, got {wanted!r}")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _bad("top_logprobs", f"must be an integer 0..{MAX_TOP_LOGPROBS}, got {top!r}")
        if not wanted:
            raise _bad("top_logprobs", "needs logprobs: true")
    return (top or 0) if wanted else None


def parse_tool_request(body: dict) -> ToolRequest:
    tools = parse_tools(body.get("tools"))
    choice, named = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", f"must be true or false, got {parallel!r}")
    output = parse_response_format(body.get("response_format"))
    structured = structured_output_grammar(body)
    if structured is not None and output is not None:
        raise _bad("response_format", "cannot be combined with vLLM's structured outputs (guided_*) "
                                      "or llama-server's json_schema / grammar")
    return tool_request(tools, choice, named, parallel, output or structured, parse_logprobs(body))


def tool_request(tools: list[ToolSpec], choice: str = "auto", named: str | None = None, parallel: bool = True,
                 grammar_text: str | None = None, top_logprobs: int | None = None) -> ToolRequest:
    """A checked ToolRequest from any API's tool fields: a forced call's schemas are checked
    by the grammar library here, before any work."""
    if choice in ("required", "named"):  # their grammar is built per model (its wire format)
        from ..runtime import grammar

        for t in tools if choice == "required" else [t for t in tools if t.name == named]:
            problem = grammar.check_grammar(grammar.json_schema_grammar(t.parameters or {"type": "object"}))
            if problem:
                raise _bad("tools", f"{t.name}'s parameters cannot be used: {problem}", code="invalid_schema")
    return ToolRequest(tools=tools if choice != "none" else [], choice=choice, named=named,
                       parallel=parallel, grammar=grammar_text, top_logprobs=top_logprobs)


def _content_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _bad(where, "must be a string or a list of text parts")


def parse_tool_message(m: dict, where: str):
    """A role "tool" message: its text and the call it answers."""
    from ..api import ChatMessage

    call_id = m.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_call_id", "a tool message must name the call it answers")
    return ChatMessage("tool", [_content_text(m.get("content"), f"{where}.content")], tool_call_id=call_id)


def parse_tool_calls_field(raw, where: str) -> list[ToolCall]:
    """An assistant message's `tool_calls` as sent back by a client."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad(f"{where}.tool_calls", "must be a list")
    calls = []
    for i, call in enumerate(raw):
        at = f"{where}.tool_calls[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(at, "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise _bad(f"{at}.function.arguments", "must be a JSON string")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"{at}.id", "must be the call's id (a string)")
        calls.append(ToolCall(call_id, fn["name"], arguments))
    return calls


# ----------------------------------------------------------------------------- engine side

def engine_params(tokenizer, request: ToolRequest, params: SamplingParams) -> SamplingParams:
    """The sampling settings for one reply: a fresh grammar (its state is per reply), control
    tokens shown when calls are read back, logprobs when asked. Runs on the engine's thread."""
    from ..mistral3.chat_format import instruct_version
    from ..runtime import grammar

    processors = list(params.logits_processors)
    text = request.grammar
    if request.choice in ("required", "named"):
        tools = request.tools if request.choice == "required" else [
            t for t in request.tools if t.name == request.named]
        text = grammar.tool_call_grammar(tokenizer, instruct_version(tokenizer), tools,
                                         parallel=request.parallel and request.choice == "required")
    elif request.calls_tools and text is not None:  # auto + response_format: calls, or that reply
        calls = grammar.tool_call_grammar(tokenizer, instruct_version(tokenizer), request.tools,
                                          parallel=request.parallel)
        text = grammar.either_grammar(calls, text)
    if text is not None:
        constraint = grammar.GrammarConstraint(tokenizer, text)
        think_ids = tokenizer.think_ids  # a reasoning model thinks freely first
        processors.append(grammar.AfterThought(constraint, think_ids) if think_ids else constraint)
    return replace(params, logits_processors=tuple(processors), control_text=request.calls_tools,
                   logprobs=request.top_logprobs)


def read_tool_calls(tokenizer, request: ToolRequest, result: GenerationResult) -> GenerationResult:
    """A reply in tool mode: its calls parsed into `tool_calls` and `text` left with the content
    before them; a malformed call list (or a call to a tool not offered) stays
    text, without the control-token names. A reply cut by the token limit inside its calls keeps
    the calls so far (the last one's arguments unfinished), as OpenAI answers."""
    from ..mistral3.chat_format import instruct_version, parse_cut_tool_calls, parse_tool_calls

    if not request.calls_tools:
        return result
    parsed = None
    offered = {t.name for t in request.tools}
    if result.finish_reason in ("stop", "stop_string"):
        parsed = parse_tool_calls(result.text, instruct_version(tokenizer))
    elif result.finish_reason == "length":  # cut inside the calls: those so far, never the wire text
        parsed = parse_cut_tool_calls(result.text, instruct_version(tokenizer))
        if parsed is not None:
            result.text = _without_control_names(tokenizer, result, parsed.content)
            result.tool_calls = [c for c in parsed.tool_calls if c.name in offered]
            return result
    if parsed is None or any(c.name not in offered for c in parsed.tool_calls):
        result.text = _without_control_names(tokenizer, result, result.text)
        return result
    result.text = _without_control_names(tokenizer, result, parsed.content)
    result.tool_calls = parsed.tool_calls if request.parallel else parsed.tool_calls[:1]
    return result


def _without_control_names(tokenizer, result: GenerationResult, text: str) -> str:
    """`text` (the reply, or its content before the calls) as plain text: the names of the
    control tokens the reply wrote taken out (kept as generated otherwise, stop string cut
    included)."""
    for name in {tokenizer.piece(t) for t in result.token_ids if tokenizer.is_control(t)}:
        text = text.replace(name, "")
    return text


def shown_pieces(tokenizer, on_piece):
    """`on_piece` for a tool-mode reply, given each piece as the content shows it: control tokens
    are written by name so that the calls can be read back (`engine_params`), and a token's piece
    ends with its name (after any text it flushed), which is taken out as the whole reply's
    content leaves it out (`read_tool_calls`); [TOOL_CALLS] stays, for `ToolStream` to find."""

    def shown(piece: str) -> None:
        if not isinstance(piece, ReasoningPiece):  # a thought comes without names (runtime.reasoning)
            piece = _without_control_suffix(tokenizer, piece)
        if piece:
            on_piece(piece)

    return shown


def _without_control_suffix(tokenizer, piece: str) -> str:
    for at in range(len(piece)):
        name = piece[at:]
        if name != MARKER and tokenizer.has_token(name) and tokenizer.is_control(tokenizer.token_id(name)):
            return piece[:at]
    return piece


# ----------------------------------------------------------------------------- reply shapes

def tool_calls_json(calls: list[ToolCall]) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]


def arguments_object(call: ToolCall) -> dict:
    """A call's arguments as the object Anthropic's `input` and Ollama's `arguments` are. A call cut
    by the token limit gives what it had written, read as the streaming clients read the pieces so
    far (the anthropic SDK's partial JSON mode): open containers closed, a value still being
    written left out with its key, so a whole reply says what its stream says."""
    try:
        value, _, _ = _partial_value(call.arguments, 0)
    except ValueError:  # not JSON at all: nothing to give
        return {}
    return value if isinstance(value, dict) else {}


_CUT = object()  # a value the text ends inside of
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None}


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _partial_value(text: str, at: int):
    """(value, end, cut) of the JSON value at `at`; value is _CUT when the text ends before one is
    whole, cut is True when a container was closed because the text ended in it."""
    at = _skip_space(text, at)
    if at == len(text):
        return _CUT, at, True
    if text[at] in "{[":
        return _partial_container(text, at)
    if text[at] == '"':
        return _partial_string(text, at)
    for word, value in _LITERALS.items():
        if text.startswith(word, at):
            return value, at + len(word), False
        if word.startswith(text[at:]):
            return _CUT, len(text), True
    number = _NUMBER.match(text, at)
    rest = text[number.end() if number else at:]
    if rest and re.fullmatch(r"[0-9.eE+-]+", rest):  # a number still being written: 1., -, 1.5e
        return _CUT, len(text), True
    if number:  # at the text's end it is whole as far as it goes (the anthropic SDK keeps it)
        return json.loads(number.group()), number.end(), not rest
    raise ValueError(f"not JSON at {at}")


def _partial_string(text: str, at: int):
    end = at + 1
    while end < len(text) and text[end] != '"':
        end += 2 if text[end] == "\\" else 1
    if end >= len(text):
        return _CUT, len(text), True
    try:
        return json.decoder.scanstring(text, at + 1)[0], end + 1, False
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def _partial_container(text: str, at: int):
    is_object, close = text[at] == "{", "}" if text[at] == "{" else "]"
    out: dict | list = {} if is_object else []
    at += 1
    while True:
        at = _skip_space(text, at)
        if at == len(text):
            return out, at, True
        if text[at] == close:
            return out, at + 1, False
        if out and text[at] == ",":
            at = _skip_space(text, at + 1)
        elif out:
            raise ValueError(f"expected , or {close} at {at}")
        if is_object:
            key, at, _ = _partial_string(text, at) if at < len(text) and text[at] == '"' else (_CUT, at, True)
            at = _skip_space(text, at)
            if key is _CUT or at == len(text):
                return out, at, True
            if text[at] != ":":
                raise ValueError(f"expected : at {at}")
            at += 1
        value, at, cut = _partial_value(text, at)
        if value is not _CUT:
            if is_object:
                out[key] = value
            else:
                out.append(value)
        if cut:
            return out, at, True


def logprobs_json(entries: list[TokenLogprob] | None) -> dict | None:
    if entries is None:
        return None

    def one(e: TokenLogprob) -> dict:
        return {"token": e.token, "logprob": e.logprob, "bytes": list(e.token_bytes)}

    return {"content": [dict(one(e), top_logprobs=[one(t) for t in e.top]) for e in entries],
            "refusal": None}


def legacy_logprobs_json(entries: list[TokenLogprob] | None, start: int = 0) -> dict | None:
    """OpenAI's legacy (/v1/completions) shape: tokens, token_logprobs, top_logprobs (one
    {token: logprob} per token) and text_offset (each token's first character in the text; the
    first entry's is `start`, a streamed chunk's place in it)."""
    if entries is None:
        return None
    offsets = text_offsets(entries, start)[:-1]
    # a prompt's first token (nothing before it to predict it): null and null, as OpenAI writes it
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else _legacy_top(e) for e in entries],
            "text_offset": offsets}


def text_offsets(entries: list[TokenLogprob], start: int = 0) -> list[int]:
    """Where each entry's text begins in the text, counting from `start`, then where the last one
    ends (a character cut across tokens counts at the token that completes it)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    offsets = [start]
    for e in entries:
        offsets.append(offsets[-1] + len(decoder.decode(e.token_bytes)))
    return offsets


def _legacy_top(e: TokenLogprob) -> dict:
    """One place's {token: logprob}: the k most likely, then the token itself when it is not among
    them (OpenAI: "always the logprob of the sampled token", up to logprobs+1 entries; logprobs 0
    gives just it)."""
    top = {t.token: t.logprob for t in e.top}
    top.setdefault(e.token, e.logprob)
    return top


def prompt_token_logprobs(tokenizer, ids: list[int], scored: list[float], tops=None) -> list[TokenLogprob]:
    """An echoed prompt's entries for the legacy shape: `scored` is log p(ids[i] | ids[:i]) for
    i >= 1 (GenerationResult.prompt_logprobs), so the first token has none (None); `tops` the
    alternatives at each of those positions (GenerationResult.prompt_top_logprobs), if asked."""
    values = [None, *scored]
    alternatives = [(), *(tops or [()] * len(scored))]

    def entry(t: int, v, top=()) -> TokenLogprob:
        return TokenLogprob(t, v, tuple(entry(i, lp) for i, lp in top), tokenizer.piece(t), tokenizer.token_bytes(t))

    return [entry(t, v, top) for t, v, top in zip(ids, values, alternatives)]


def tool_call_deltas(calls: list[ToolCall]) -> list[dict]:
    """OpenAI's streamed form of calls: per call, a delta with index, id, type and name (empty
    arguments), then the arguments in pieces (index only)."""
    deltas = []
    for index, call in enumerate(calls):
        deltas.append({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                       "function": {"name": call.name, "arguments": ""}}]})
        for at in range(0, len(call.arguments), ARGUMENT_PIECE):
            deltas.append({"tool_calls": [{"index": index, "function": {
                "arguments": call.arguments[at:at + ARGUMENT_PIECE]}}]})
    return deltas


class ToolStream:
    """A tool-mode reply's streamed text: what comes before [TOOL_CALLS] streams as content;
    from the marker on it is held, and at the end becomes tool-call deltas when it parsed as
    calls, else content (so a malformed call never reaches the client as half a call)."""

    def __init__(self):
        from ..runtime.generate import StopStringFilter  # torch: not at the CLI parser's import

        self.text = ""
        self._filter = StopStringFilter(MARKER)  # holds back what could begin the marker, stops at it

    @property
    def shown(self) -> int:
        return self._filter.shown

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        return self._as_content(self._filter.feed(piece))

    @staticmethod
    def _as_content(out: str) -> list[dict]:
        return [{"content": out}] if out else []

    def finish(self, result: GenerationResult) -> list[dict]:
        if result.tool_calls:
            return self._as_content(self.text[self.shown:len(result.text)]) + tool_call_deltas(result.tool_calls)
        # text (or a malformed call, shown as its plain text): whatever was held back
        shown_plain = self.text[:self.shown]
        return [{"content": result.text[len(shown_plain):]}] if len(result.text) > len(shown_plain) else []
