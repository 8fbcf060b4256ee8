"""Constrained decoding: a grammar (llguidance) as a token mask applied before sampling.

llguidance (the library llama.cpp and vLLM use) turns a Lark grammar, which may embed JSON
Schemas (`%json {...}`) and name control tokens by id (`<[9]>`), into the set of tokens allowed
next. `GrammarConstraint` is a logits processor (`SamplingParams.logits_processors`): each step
it feeds the matcher the tokens sampled since its last call, asks for the bitmask (one bit per
token, computed on the CPU) and sets every other logit to -inf on the logits' own device. When
the grammar is complete only EOS stays allowed, so the reply ends there.

JSON is written the way Mistral's chat format writes it (json.dumps: ", " and ": ", no other
whitespace), which also keeps a random model from looping on blanks.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from ..api import EngineError, ToolSpec

try:  # a runtime dependency; imported lazily by callers that build grammars
    import llguidance as llg
    from llguidance._tokenizer import TokenizerWrapper
except ImportError:  # pragma: no cover - reported when a grammar is asked for
    llg = None

JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


class GrammarError(EngineError):
    """A schema or grammar the library refuses, in its words."""


def _require() -> None:
    if llg is None:
        raise GrammarError("constrained output needs the llguidance package (pip install llguidance)")


class _Vocabulary:
    """What llguidance asks of a tokenizer: each token's bytes (control tokens as 0xFF + name,
    llguidance's marker for special tokens), the special ids, EOS/BOS, and encode."""

    def __init__(self, tok):
        self._tok = tok
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        self.tokens = [b"\xff" + tok.tokens[i].encode("utf-8") if tok.is_control(i) else tok.token_bytes(i)
                       for i in range(tok.vocab_size)]
        self.special_token_ids = [i for i in range(tok.vocab_size) if tok.is_control(i)]

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text)


def ll_tokenizer(tok):
    """The llguidance view of our tokenizer, built once per tokenizer (~1 s for 131k tokens)."""
    _require()
    cached = getattr(tok, "_llguidance", None)
    if cached is None:
        cached = llg.LLTokenizer(TokenizerWrapper(_Vocabulary(tok)))
        object.__setattr__(tok, "_llguidance", cached)
    return cached


# ----------------------------------------------------------------------------- grammars

def _json_rule(schema: dict) -> str:
    """A Lark rule body for one JSON Schema, written as our separators."""
    body = dict(schema) if isinstance(schema, dict) else schema
    if isinstance(body, dict):
        body.setdefault("x-guidance", JSON_OPTIONS)
    return "%json " + json.dumps(body, ensure_ascii=False)


def closed_objects(schema):
    """The schema with `additionalProperties: false` on every object that lists its properties
    and says nothing about others (what OpenAI's strict mode requires): a call's arguments are
    the function's parameters, not those plus invented keys."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) if k not in ("enum", "const", "default", "examples") else v
           for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema_grammar(schema: dict, strict: bool = False) -> str:
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON Schema must be an object, got {type(schema).__name__}")
    return "start: " + _json_rule(closed_objects(schema) if strict else schema)


def json_object_grammar() -> str:
    """response_format json_object: any JSON object."""
    return json_schema_grammar({"type": "object"})


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a Lark string literal has JSON's escapes


def tool_call_grammar(tok, version: int, tools: list[ToolSpec], *, parallel: bool = True) -> str:
    """A reply that is only tool calls, in the model's wire format, each call's arguments valid
    against that tool's `parameters`. `parallel`: one call or several."""
    _require()
    if not tools:
        raise GrammarError("a tool call grammar needs at least one tool")
    calls_id = tok.token_id("[TOOL_CALLS]")
    rules = []
    if version == 7:
        # [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (an id, as history shows it, optional)
        for i, t in enumerate(tools):
            rules.append(f'call{i}: "{{\\"name\\": " {_lark_string(_lark_string(t.name))} '
                         f'", \\"arguments\\": " args{i} call_id? "}}"')
        alternatives = " | ".join(f"call{i}" for i in range(len(tools)))
        more = ' (", " call)*' if parallel else ""
        head = [f"start: <[{calls_id}]> \"[\" call{more} \"]\"", f"call: {alternatives}",
                'call_id: ", \\"id\\": \\"" /[a-zA-Z0-9]{9}/ "\\""']
    else:
        args_id = tok.token_id("[ARGS]")
        call_id = f' <[{tok.token_id("[CALL_ID]")}]> /[a-zA-Z0-9]{{9}}/' if version == 11 else ""
        for i, t in enumerate(tools):
            rules.append(f"call{i}: <[{calls_id}]> {_lark_string(t.name)}{call_id} <[{args_id}]> args{i}")
        alternatives = " | ".join(f"call{i}" for i in range(len(tools)))
        head = [f"start: call{'+' if parallel else ''}", f"call: {alternatives}"]
    for i, t in enumerate(tools):
        params = closed_objects(t.parameters) if t.parameters else {"type": "object"}
        rules.append(f"args{i}: {_json_rule(params)}")
    return "\n".join(head + rules)


def either_grammar(first: str, second: str) -> str:
    """A reply that is either grammar (each as built here: its first rule is `start`)."""
    if not (first.startswith("start:") and second.startswith("start:")):
        raise GrammarError("either_grammar: both grammars must begin with their start rule")
    return "\n".join(["start: first_ | second_", "first_:" + first[len("start:"):],
                      "second_:" + second[len("start:"):]])


def check_grammar(text: str) -> str:
    """Empty when the library accepts the grammar (schemas included), else its message."""
    _require()
    return llg.LLMatcher.validate_grammar(text)


# ----------------------------------------------------------------------------- the mask

class GrammarConstraint:
    """A logits processor: masks every token the grammar does not allow next. One per reply."""

    def __init__(self, tok, grammar: str):
        _require()
        self.tokenizer = ll_tokenizer(tok)
        self.vocab_size = tok.vocab_size
        self.matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0)  # compiled once: no validate_grammar first
        if self.matcher.is_error():
            raise GrammarError(f"the output format cannot be used: {self.matcher.get_error()}")
        self._bitmask = torch.zeros((self.vocab_size + 31) // 32, dtype=torch.int32)
        self._fed = 0

    def _fail_if_error(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"constrained output failed: {self.matcher.get_error()}")

    def allowed(self, generated: list[int]) -> torch.Tensor:
        """Bool mask (vocab,) of the tokens allowed after `generated` (every token of the reply
        so far; those not yet seen are fed to the matcher first)."""
        new = generated[self._fed:]
        self._fed = len(generated)
        if self.matcher.is_stopped():  # complete (a reply that ignores EOS goes on): EOS only
            return self._eos_only()
        if new and not self.matcher.consume_tokens(list(new)):
            self._fail_if_error()
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.data_ptr(), self._bitmask.numel() * 4)
        self._fail_if_error()
        return unpack_bitmask(self._bitmask, self.vocab_size)

    def _eos_only(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.tokenizer.eos_token] = True
        return mask

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        allowed = self.allowed(generated).to(logits.device, non_blocking=True)
        return logits.masked_fill(~allowed, float("-inf"))


class AfterThought:
    """A grammar for a reasoning model's answer: the thought ([THINK] ... [/THINK], when the reply
    opens with [THINK]) is free, the grammar (a GrammarConstraint) applies from the token after
    [/THINK] on, fed only the answer's tokens; a reply that does not open with [THINK] is the
    grammar's from its first token (the first token may be [THINK] or what the grammar allows)."""

    def __init__(self, inner: GrammarConstraint, think_ids: tuple[int, int]):
        self.inner = inner
        self.begin, self.end = think_ids

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        if not generated:
            allowed = self.inner.allowed([]).clone()
            allowed[self.begin] = True
            return logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        if generated[0] != self.begin:
            return self.inner(generated, logits)
        try:
            answer_from = generated.index(self.end) + 1
        except ValueError:
            return logits  # still thinking
        return self.inner(generated[answer_from:], logits)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(ceil(V/32),) int32 words on the CPU, bit j of word w = token 32w + j -> bool (V,).
    numpy's unpackbits: one pass on one thread (~20 us for 131k tokens), where torch's shifts
    spread a tiny op over the intra-op pool."""
    words = bitmask.numpy().view(np.uint8)  # little-endian words: byte order = token order
    bits = np.unpackbits(words, bitorder="little")[:vocab_size]
    return torch.from_numpy(bits.view(np.bool_))


__all__ = ["GrammarConstraint", "GrammarError", "json_schema_grammar", "json_object_grammar",
           "tool_call_grammar", "closed_objects", "check_grammar", "either_grammar", "ll_tokenizer", "unpack_bitmask", "JSON_OPTIONS"]
