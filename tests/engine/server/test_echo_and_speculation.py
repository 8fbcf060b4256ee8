"""/v1/completions' echo with logprobs (each prompt token's log-probability, checked against the
model's own logits) and speculative decoding per request and per server (llama-server's
`speculative.n_max`, `serve --spec`), through the official `openai` client on the tiny model
behind the batching executor `serve` uses."""
from __future__ import annotations

import argparse

import pytest
import torch

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")

from tramontane.engine.api import EngineError  # noqa: E402
from tramontane.engine.cli import serve  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import BatchExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
PROMPT = "Once upon a time there was a cat. Once upon a time there was a cat. Once upon a time"


@pytest.fixture(scope="module")
def served():
    engine = LocalEngine(MODEL, device="cpu", context_length=1024)
    executor = BatchExecutor(engine, slots=2, priority_slots=0)
    server = OpenAIServer(executor, port=0).start()
    server.engine = engine
    yield server
    server.stop()
    executor.shutdown()
    engine.close()


def parse(*argv):
    parser = argparse.ArgumentParser()
    serve.add_parsers(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def gpt(served):
    return openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=120)


def model_logprobs(engine, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, straight from the model's logits of every row."""
    with torch.no_grad():
        logp = torch.log_softmax(engine.model.logits(ids, all_logits=True).float(), dim=-1)
    return logp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


def test_echo_with_logprobs_scores_every_prompt_token(served):
    c = gpt(served)
    tok = served.engine.tokenizer
    text_ids = tok.encode(PROMPT)
    want = model_logprobs(served.engine, [tok.bos_id, *text_ids])  # the server adds BOS to a text prompt
    plain = c.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0,
                                 extra_body={"ignore_eos": True})
    r = c.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0, echo=True,
                             extra_body={"ignore_eos": True})
    lp, n = r.choices[0].logprobs, len(text_ids)
    assert r.choices[0].text == PROMPT + plain.choices[0].text
    assert lp.tokens == [tok.piece(t) for t in text_ids] + plain.choices[0].logprobs.tokens
    # the BOS the text leaves out predicts its first token: a real value, not OpenAI's null
    assert lp.token_logprobs[:n] == pytest.approx(want, abs=1e-4)
    assert lp.token_logprobs[n:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)
    # logprobs 0: no alternatives, only the token's own (OpenAI's "up to logprobs+1")
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]
    # each prompt token at its place in the text (the random reply's may be parts of a character)
    assert [r.choices[0].text[a:b] for a, b in zip(lp.text_offset[:n], lp.text_offset[1:n + 1])] == lp.tokens[:n]
    assert r.usage.prompt_tokens == n + 1

    # a token-list prompt as given, without BOS: nothing predicts its first token (null, null)
    ids = text_ids[:12]
    r = c.completions.create(model="m", prompt=ids, max_tokens=2, temperature=0, logprobs=0, echo=True,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:12] == pytest.approx(model_logprobs(served.engine, ids), abs=1e-4)
    chunks = list(c.completions.create(model="m", prompt=ids, max_tokens=2, temperature=0, logprobs=0, echo=True,
                                       stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)


def test_echo_with_alternatives_gives_each_prompt_tokens_most_likely_ones(served):
    # lm-eval-harness's is_greedy: the prompt token must be compared with the top alternative
    c = gpt(served)
    tok = served.engine.tokenizer
    ids = tok.encode(PROMPT)[:10]
    r = c.completions.create(model="m", prompt=ids, max_tokens=1, temperature=0, logprobs=3, echo=True,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp.top_logprobs[0] is None  # nothing predicts the first token
    with torch.no_grad():
        logp = torch.log_softmax(served.engine.model.logits(ids, all_logits=True).float(), dim=-1)
    for i in range(1, len(ids)):
        values, top_ids = torch.topk(logp[i - 1], 3)
        got = lp.top_logprobs[i]
        assert list(got)[:3] == [tok.piece(t) for t in top_ids.tolist()]
        assert list(got.values())[:3] == pytest.approx(values.tolist(), abs=1e-4)
        assert lp.token_logprobs[i] == pytest.approx(logp[i - 1, ids[i]].item(), abs=1e-4)
        # the prompt token itself is there too, after the three when it is not one of them
        assert got[tok.piece(ids[i])] == pytest.approx(lp.token_logprobs[i], abs=1e-4)
        assert len(got) == 3 + (tok.piece(ids[i]) not in [tok.piece(t) for t in top_ids.tolist()])


def _greedy(c, **extra):
    r = c.completions.create(model="m", prompt=PROMPT, max_tokens=40, temperature=0,
                             extra_body={"ignore_eos": True, **extra})
    return r.choices[0].text, r.model_extra["timings"]


def test_speculation_per_request_and_per_server_keeps_greedy_output(served, monkeypatch):
    c = gpt(served)
    plain, timings = _greedy(c)
    assert "draft_n" not in timings and timings["predicted_n"] == 40  # the server's default: off
    for extra in ({"speculative.n_max": 4}, {"speculative.n_max": 16, "speculative.n_min": 0},
                  {"speculation": "ngram"}):
        text, timings = _greedy(c, **extra)
        assert text == plain, extra
        # the prompt repeats itself: prompt lookup finds drafts; never more accepted than drafted
        assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"], extra
    monkeypatch.setattr(served.tasks, "speculation", ("ngram", 3))  # serve --spec ngram --spec-tokens 3
    text, timings = _greedy(c)
    assert text == plain and timings["draft_n"] > 0
    text, timings = _greedy(c, **{"speculative.n_max": 0})  # a request turns it off
    assert text == plain and "draft_n" not in timings
    chat = c.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=30,
                                     temperature=0, extra_body={"ignore_eos": True})
    monkeypatch.setattr(served.tasks, "speculation", None)
    chat_plain = c.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == chat_plain.choices[0].message.content
    # drafts only where the reply repeats: reported while speculation is on, even 0
    assert chat.model_extra["timings"]["draft_n"] >= 0 and "draft_n" not in chat_plain.model_extra["timings"]
    chunks = list(c.completions.create(model="m", prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True, "speculative.n_max": 4}))
    assert "".join(ch.choices[0].text for ch in chunks) == plain
    assert chunks[-1].model_extra["timings"]["draft_n"] > 0  # llama-server: on the last chunk


@pytest.mark.parametrize("extra, words", [
    ({"speculative.n_max": 17}, "0..16"),
    ({"speculative.n_min": 3}, "no minimum"),
    ({"speculation": "lookahead"}, "off, ngram, draft"),
    ({"speculation": "ngram", "speculative.n_max": 0}, "send one of them"),
])
def test_speculation_fields_refused_in_words(served, extra, words):
    with pytest.raises(openai.BadRequestError, match=words):
        gpt(served).completions.create(model="m", prompt="x", max_tokens=2, extra_body=extra)


def test_serve_takes_the_run_commands_speculation_flags():
    args = parse("--model", "m.gguf", "--spec", "ngram", "--spec-tokens", "4")
    assert (args.spec, args.spec_tokens) == ("ngram", 4)
    assert parse("--model", "m.gguf").spec == "off"
    with pytest.raises(EngineError, match="--spec-tokens must be 1..16"):
        serve.serve_main(parse("--model", "/nonexistent/model.gguf", "--spec-tokens", "0"))
