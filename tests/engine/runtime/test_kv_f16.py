"""The float16 KV cache option end to end (new_cache / LocalEngine kv_type, --kv-type): the tiny
fixture models decode the same greedy tokens with float16 KV as with float32 KV, on every kernel
variant this CPU can force, and the default stays float32.

Logit bounds: keys and values are rounded once to float16 (relative error <= 2^-11 ~ 4.9e-4 per
element), which moves an attention output by at most ~2^-11 of the values' scale. With float
activations (F32 / F16 weights) that reaches the logits as is: bound 1e-3 of the largest |logit|
(measured 1.1e-4..2.4e-4). Where activations are quantized to int8 per block (Q8_0, K-quants) a
change that small flips some activation roundings (a step is 1/127 of the block's largest value),
so the bound is the one tests/engine/mistral3/test_text_cpu_native.py holds the int8 path to: 3%
of the largest |logit| (measured 1.2%..1.6%). A cache read with the wrong element size is O(1) off.
"""
from __future__ import annotations

import os

import pytest
import torch

from support import FIXTURES
from support.fixture_models import greedy_tokens
from tramontane.engine.api import ChatMessage, EngineError, SamplingParams
from tramontane.engine.cli.main import build_parser
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.runtime import decoder
from tramontane.engine.runtime.decoder import decode, new_cache
from tramontane.engine.runtime.memory import kv_type_bytes
from tramontane.kernels import cpu_native

pytestmark = [pytest.mark.skipif(not cpu_native.AVAILABLE, reason="native CPU kernels not built")]

PROMPTS = [[1, 2, 3, 4, 5], list(range(100, 160)), [7] * 3 + list(range(900, 940, 3))]


def _logit_rows(model, ids, tokens, kv_type):
    """Logits along fixed tokens: the prompt's last row, then one per decode step of tokens[:-1]."""
    cache = new_cache(model, len(ids) + len(tokens), kv_type=kv_type)
    assert all(t.dtype == (torch.float16 if kv_type == "f16" else torch.float32)
               for t in cache.layer_k + cache.layer_v)
    rows = [model.logits(ids, 0, cache)]
    for t in tokens[:-1]:
        rows.append(decode(model, t, cache))
    return torch.stack(rows)


@pytest.mark.cpu_variants
@pytest.mark.parametrize("name", ["mistral3_tiny-q8_0", "mistral3_tiny-f32", "mistral3_tiny-f16",
                                  "mistral3_q256-Q4_K_M"])
def test_f16_kv_greedy_tokens_equal_f32_kv(name):
    """Float activations: the same 12 greedy tokens, free running. int8 activations: the random
    fixtures' logits are flat (near ties a 1% change flips), so along the float32 run's tokens each
    step's greedy token must be the same wherever float32's top-two margin is over twice the
    largest logit change measured (there a flip would be an error; at least a third of the steps)."""
    model = Mistral3Text.load(os.path.join(FIXTURES, f"{name}.gguf"), device="cpu")
    exact = name.endswith(("f32", "f16"))
    bound = 1e-3 if exact else 0.03
    checked = total = 0
    for ids in PROMPTS:
        want = greedy_tokens(model, ids, 12)
        if exact:
            cache = new_cache(model, len(ids) + 12, kv_type="f16")
            logits, got = model.logits(ids, 0, cache), []
            for _ in range(12):
                got.append(int(logits.argmax()))
                logits = decode(model, got[-1], cache)
            assert got == want, (ids, got, want)
        logits32, logits16 = _logit_rows(model, ids, want, "f32"), _logit_rows(model, ids, want, "f16")
        assert logits32.argmax(-1).tolist() == want  # the float32 run itself, replayed
        scale = logits32.abs().max()
        err = (logits16 - logits32).abs().max()
        assert err <= bound * scale, float(err / scale)
        top2 = logits32.topk(2, -1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * err  # no logit moved more than err: no flip possible
        assert logits16.argmax(-1)[clear].tolist() == logits32.argmax(-1)[clear].tolist()
        checked, total = checked + int(clear.sum()), total + len(want)
    assert checked * 3 >= total, (checked, total)


def test_default_kv_stays_float32_and_f16_halves_the_bytes():
    model = Mistral3Text.load(os.path.join(FIXTURES, "mistral3_tiny-q8_0.gguf"), device="cpu")
    f32, f16 = new_cache(model, 64), new_cache(model, 64, kv_type="f16")
    assert f32.dtype == torch.float32 and f16.dtype == torch.float16
    assert f16.nbytes * 2 == f32.nbytes
    for cache, elem in ((f32, 4), (f16, 2)):  # the decode step is the one native call either way
        model.logits([1, 2, 3], 0, cache)
        decode(model, 4, cache)
        step = model._native_decode(model.segments[0], cache)
        assert isinstance(step, cpu_native.DecodeLayers) and step._dims[-1] == elem
    cpu = torch.device("cpu")
    assert model.kv_bytes_per_token(dtype=torch.float16, device=cpu) * 2 == model.kv_bytes_per_token(device=cpu)
    assert (kv_type_bytes("f32"), kv_type_bytes("f16")) == (4, 2)
    with pytest.raises(EngineError, match="not one of f32, f16"):
        new_cache(model, 64, kv_type="bf16")


def test_f16_kv_refused_where_the_native_kernels_are_missing(monkeypatch):
    monkeypatch.setattr(cpu_native, "AVAILABLE", False)
    with pytest.raises(EngineError, match="native CPU kernels"):
        decoder.cpu_kv_dtype("f16")
    assert decoder.cpu_kv_dtype("f32") == torch.float32


def test_local_engine_kv_type():
    from tramontane.engine.runtime.local import LocalEngine

    path = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
    greedy = SamplingParams(max_tokens=6, temperature=0)
    msgs = [ChatMessage.text("user", "hello there")]
    e32 = LocalEngine(path, None, device="cpu", context_length=128)
    e16 = LocalEngine(path, None, device="cpu", context_length=128, kv_type="f16")
    assert e32.pool.dtype == torch.float32 and e16.pool.dtype == torch.float16
    for e in (e32, e16):  # the plan counted a whole context's KV as allocated: 4 or 2 bytes an element
        seq = e.new_sequence()
        seq.reserve(e.context_size)
        assert sum(p.kv for p in e.plan.placements) == seq.nbytes
        seq.release()
    assert e16.chat(msgs, greedy).token_ids == e32.chat(msgs, greedy).token_ids
    with pytest.raises(EngineError, match="KV type 'q8' is not one of f32, f16"):
        LocalEngine(path, None, device="cpu", context_length=128, kv_type="q8")


@pytest.mark.parametrize("command", [["run", "--model", "m.gguf"], ["serve", "--model", "m.gguf"],
                                     ["bench", "--model", "m.gguf"]])
def test_cli_kv_type_option(command, capsys):
    parser = build_parser()
    assert parser.parse_args(command).kv_type == "f32"
    assert parser.parse_args(command + ["--kv-type", "f16"]).kv_type == "f16"
    with pytest.raises(SystemExit):
        parser.parse_args(command + ["--kv-type", "bf16"])
    with pytest.raises(SystemExit):
        parser.parse_args([command[0], "--help"])
    assert "(default: f32)" in " ".join(capsys.readouterr().out.split())
