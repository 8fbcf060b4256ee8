"""Constrained decoding (llguidance masks in the sampler), logprobs, and the scripted-logits hook.

The test of a grammar: a tiny random model, sampled at temperature 1 on several seeds, must
still write output that validates (jsonschema, the reference validator; tool calls through the
parser and then jsonschema). Schemas bound their strings and arrays so a random model ends
within max_tokens; the grammar is what makes the JSON valid, not luck: the same seeds without
the grammar write no JSON at all.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tramontane.engine.api import ChatMessage, EngineError, SamplingParams, ToolSpec
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.chat_format import instruct_version, parse_tool_calls
from tramontane.engine.mistral3.tokenizer import Tokenizer
from tramontane.engine.runtime.local import LocalEngine

from support.scripted import ScriptedLogits, script_logits
from support import FIXTURES
from support.engines import local_engine_fixture

grammar = pytest.importorskip("tramontane.engine.runtime.grammar")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
SEEDS = range(6)
PERSON_OPEN = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"]}
PERSON = {**PERSON_OPEN, "additionalProperties": False}
WEATHER = ToolSpec("get_weather", "weather", {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]})
TIME = ToolSpec("local_time", "", {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 6}},
                                   "required": ["tz"]})
HI = [ChatMessage.text("user", "hi")]


engine = local_engine_fixture(MODEL, context_length=1024)


def _renamed(version: int) -> Tokenizer:
    """The tiny model's vocabulary with the slots later tekken files use for [ARGS]/[CALL_ID]
    named so, and the template marker of that version (the model itself is random anyway)."""
    with open_gguf(MODEL) as gf:
        kv = dict(gf.kv)
    tokens = list(kv["tokenizer.ggml.tokens"])
    tokens[32], tokens[33] = "[ARGS]", "[CALL_ID]"
    kv["tokenizer.ggml.tokens"] = tokens
    kv["tokenizer.chat_template"] = "[CALL_ID] [TOOL_CONTENT]" if version == 11 else "[ARGS]"
    tok = Tokenizer.from_kv(kv, f"tiny-v{version}.gguf")
    assert instruct_version(tok) == version
    return tok


@pytest.fixture(params=[7, 11, 13], ids=lambda v: f"v{v}")
def versioned(request, engine):
    version = request.param
    original = engine.tokenizer
    if version != 7:
        engine.tokenizer = _renamed(version)
    yield version, engine
    engine.tokenizer = original


def _run(engine, grammar_text, seed, tools=None, max_tokens=200, control_text=False):
    constraint = grammar.GrammarConstraint(engine.tokenizer, grammar_text)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed,
                            logits_processors=(constraint,), control_text=control_text)
    return engine.chat(HI, params, tools=tools, session_key=None)


@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_output_validates_on_every_seed(engine, seed):
    result = _run(engine, grammar.json_schema_grammar(PERSON), seed)
    assert result.finish_reason == "stop"  # the grammar ended it with EOS
    jsonschema.validate(json.loads(result.text), PERSON)
    assert ", " in result.text or result.text.count(":") == 1  # Mistral's separators


def test_ignore_eos_after_a_complete_grammar_keeps_to_eos(engine):
    """A reply told to ignore EOS goes on after the JSON is complete: only EOS stays allowed
    (the matcher is not fed past its end), so the JSON text is still whole."""
    constraint = grammar.GrammarConstraint(engine.tokenizer, grammar.json_schema_grammar(PERSON))
    params = SamplingParams(max_tokens=80, temperature=1.0, seed=0, ignore_eos=True,
                            logits_processors=(constraint,))
    result = engine.chat(HI, params)
    assert result.finish_reason == "length"
    jsonschema.validate(json.loads(result.text), PERSON)  # EOS decodes to no text


def test_without_the_grammar_the_same_seeds_write_no_json(engine):
    texts = [engine.chat(HI, SamplingParams(max_tokens=40, temperature=1.0, seed=s)).text for s in SEEDS]
    for text in texts:
        with pytest.raises(ValueError):
            json.loads(text)


@pytest.mark.parametrize("seed", SEEDS)
def test_strict_schema_admits_no_other_keys(engine, seed):
    closed = grammar.closed_objects(PERSON_OPEN)
    assert closed == PERSON and "additionalProperties" not in PERSON_OPEN
    result = _run(engine, grammar.json_schema_grammar(PERSON_OPEN, strict=True), seed)
    jsonschema.validate(json.loads(result.text), closed)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_json_object_output_is_an_object(engine, seed):
    result = _run(engine, grammar.json_object_grammar(), seed)
    assert isinstance(json.loads(result.text), dict)


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("seed", SEEDS[:4])
def test_tool_call_grammar_writes_valid_calls_in_each_format(versioned, seed, parallel):
    version, engine = versioned
    tools = [WEATHER, TIME]
    text = grammar.tool_call_grammar(engine.tokenizer, version, tools, parallel=parallel)
    result = _run(engine, text, seed, tools=tools, max_tokens=300, control_text=True)
    assert result.finish_reason == "stop"
    parsed = parse_tool_calls(result.text, version)
    assert parsed is not None and parsed.content == "", result.text
    assert parsed.tool_calls and (parallel or len(parsed.tool_calls) == 1)
    by_name = {t.name: t for t in tools}
    for call in parsed.tool_calls:
        jsonschema.validate(json.loads(call.arguments), grammar.closed_objects(by_name[call.name].parameters))
        assert len(call.id) == 9 and call.id.isalnum()


def test_one_named_tool(engine):
    text = grammar.tool_call_grammar(engine.tokenizer, 7, [TIME], parallel=False)
    for seed in SEEDS[:3]:
        parsed = parse_tool_calls(_run(engine, text, seed, tools=[WEATHER, TIME], control_text=True).text, 7)
        assert [c.name for c in parsed.tool_calls] == ["local_time"]


@pytest.mark.parametrize("schema, match", [
    ({"type": "no-such-type"}, "cannot be used"),
    ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}, "cannot be used"),
])
def test_a_schema_the_library_refuses_is_one_clear_error(engine, schema, match):
    with pytest.raises(grammar.GrammarError, match=match):
        grammar.GrammarConstraint(engine.tokenizer, grammar.json_schema_grammar(schema))
    assert issubclass(grammar.GrammarError, EngineError)


def test_mask_matches_the_matcher_token_by_token(engine):
    """The unpacked mask says exactly what llguidance says of each token (its own per-token
    check), so bit order and vocabulary tail are right."""
    constraint = grammar.GrammarConstraint(engine.tokenizer, grammar.json_schema_grammar(PERSON))
    allowed = constraint.allowed([])
    assert allowed.shape == (engine.tokenizer.vocab_size,)
    for token in range(engine.tokenizer.vocab_size):
        assert bool(allowed[token]) == (constraint.matcher.validate_tokens([token]) == 1), token
    assert allowed.sum() > 0 and not allowed.all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mask_applies_on_cuda_logits(engine):
    constraint = grammar.GrammarConstraint(engine.tokenizer, grammar.json_schema_grammar(PERSON))
    logits = torch.randn(engine.tokenizer.vocab_size, device="cuda")
    out = constraint([], logits)
    assert out.device.type == "cuda"
    assert torch.equal(torch.isfinite(out).cpu(), constraint.allowed([]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_constrained_output_validates_on_a_cuda_model(seed):
    eng = LocalEngine(MODEL, device="cuda", context_length=512)
    try:
        result = _run(eng, grammar.json_schema_grammar(PERSON), seed)
        jsonschema.validate(json.loads(result.text), PERSON)
    finally:
        eng.close()


# ----------------------------------------------------------------------------- logprobs, hook

def test_logprobs_are_the_models_log_softmax(engine):
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=5)
    result = engine.chat(HI, params, session_key=None)
    assert len(result.logprobs) == len(result.token_ids) == 4
    ids = result.prompt_token_ids + result.token_ids
    logits = engine.model.forward(engine.model.embed(ids), 0, None, all_logits=True).double()
    ref = torch.log_softmax(logits, dim=-1)
    n = len(result.prompt_token_ids)
    for k, entry in enumerate(result.logprobs):
        row = ref[n - 1 + k]
        assert entry.token_id == result.token_ids[k]
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-4)
        top_ids = [t.token_id for t in entry.top]
        assert top_ids == torch.topk(row, 5).indices.tolist()
        assert [t.logprob for t in entry.top] == pytest.approx(torch.topk(row, 5).values.tolist(), abs=1e-4)
        assert entry.top[0].token_id == entry.token_id  # greedy: the chosen token is the top one
        assert entry.token == engine.tokenizer.piece(entry.token_id)
        assert entry.token_bytes == engine.tokenizer.token_bytes(entry.token_id)


def test_logprobs_range_is_checked(engine):
    with pytest.raises(EngineError, match="top logprobs must be 0..20"):
        engine.chat(HI, SamplingParams(max_tokens=1, logprobs=21))


def test_scripted_logits_hook_makes_the_model_write_given_text(engine, monkeypatch):
    tok = engine.tokenizer
    want = tok.encode("[TOOL_CALLS] is plain text here")
    script_logits(monkeypatch, ScriptedLogits(want, tok.eos_id))
    result = engine.chat(HI, SamplingParams(max_tokens=50, temperature=1.0, seed=3))
    assert result.token_ids == want and result.finish_reason == "stop"
    assert result.text == "[TOOL_CALLS] is plain text here"


def test_control_text_shows_control_tokens_by_name(engine, monkeypatch):
    tok = engine.tokenizer
    want = [tok.token_id("[TOOL_CALLS]"), *tok.encode("x")]
    script_logits(monkeypatch, ScriptedLogits(want, tok.eos_id))
    assert engine.chat(HI, SamplingParams(max_tokens=9)).text == "x"
    assert engine.chat(HI, SamplingParams(max_tokens=9, control_text=True)).text == "[TOOL_CALLS]x"


def test_unpack_bitmask_bit_order():
    words = torch.tensor(np.array([1 | (1 << 31), 0b110], dtype=np.uint32).view(np.int32))
    mask = grammar.unpack_bitmask(words, 36)
    assert mask.nonzero().flatten().tolist() == [0, 31, 33, 34]


@pytest.mark.parametrize("seed", SEEDS)
def test_speculation_under_a_grammar_draws_the_plain_output(engine, seed):
    """Issue 38: prompt lookup's drafts go through the grammar as the plain draws do (a draft the
    grammar forbids is rejected, the matcher rolled back to the accepted tokens): seeded output
    under a JSON Schema is the plain output, token for token, and still validates."""
    schema = {"type": "array", "items": {"enum": ["north wind", "south wind"]}, "minItems": 6, "maxItems": 6}

    def run(speculation):
        constraint = grammar.GrammarConstraint(engine.tokenizer, grammar.json_schema_grammar(schema))
        params = SamplingParams(max_tokens=120, temperature=1.0, seed=seed, logits_processors=(constraint,),
                                speculation=speculation, spec_tokens=4)
        return engine.chat(HI, params, session_key=None)

    plain, spec = run("off"), run("ngram")
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason == "stop"
    jsonschema.validate(json.loads(spec.text), schema)
    assert spec.stats.drafted_tokens > 0  # the repeated items are drafted from the reply itself


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_speculation_under_a_tool_call_grammar_draws_the_plain_calls(versioned, seed):
    """Parallel tool calls under prompt lookup (the tools' names and keys repeat from the prompt's
    tools block and from the first call) are the plain draws, token for token, in each format."""
    version, engine = versioned
    tools = [WEATHER, TIME]

    def run(speculation):
        constraint = grammar.GrammarConstraint(engine.tokenizer, grammar.tool_call_grammar(
            engine.tokenizer, version, tools, parallel=True))
        params = SamplingParams(max_tokens=300, temperature=1.0, seed=seed, logits_processors=(constraint,),
                                control_text=True, speculation=speculation, spec_tokens=4)
        return engine.chat(HI, params, tools=tools, session_key=None)

    plain, spec = run("off"), run("ngram")
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"
    assert parse_tool_calls(spec.text, version).tool_calls and spec.stats.accepted_tokens > 0
