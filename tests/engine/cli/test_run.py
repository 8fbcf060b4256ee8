"""`tramontane-cli run | perplexity | bench` against HF, and their errors."""
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tramontane.engine.cli.main import main as cli_main
from tramontane.engine.cli.run import token_nll
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.engine.mistral3.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers", reason="HF transformers is the reference (test extra)")

from support import FIXTURES
MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
MINISTRAL = os.path.join(FIXTURES, "ministral3_tiny-f32.gguf")
TEXT = ("Le vent du nord, la tramontane, souffle sur la plaine du Roussillon. "
        "It dries the air, clears the sky and bends the plane trees.\n"
        "def gust(speed):\n    return speed * 1.5  # km/h\n")


def run_json(capsys, *args) -> dict:
    assert cli_main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def hf_causal(model_dir: str):
    cfg = json.load(open(os.path.join(FIXTURES, model_dir, "config.json")))
    if cfg.get("architectures", [""])[0] == "Mistral3ForConditionalGeneration":
        model = transformers.Mistral3ForConditionalGeneration.from_pretrained(
            os.path.join(FIXTURES, model_dir), dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, model_dir),
                                                                  dtype=torch.float32)
    return model.eval()


def hf_perplexity(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="sum")
    return math.exp(float(nll) / (len(ids) - 1))


@pytest.mark.parametrize("gguf_name, hf_dir", [("mistral3_tiny-f32.gguf", "mistral3_tiny"),
                                               ("ministral3_tiny-f32.gguf", "ministral3_tiny")])
def test_perplexity_equals_hf(tmp_path, capsys, gguf_name, hf_dir):
    # The tiny Ministral has a 64-token context: give it one sentence (still past its
    # original context of 16, so YaRN's query scaling is exercised).
    body = TEXT if "ministral" not in gguf_name else TEXT.split(". ")[0] + "."
    text = tmp_path / "text.txt"
    text.write_text(body, encoding="utf-8")
    out = run_json(capsys, "perplexity", "--model", os.path.join(FIXTURES, gguf_name), "--file", str(text),
                   "--json", "--device", "cpu")
    with open_gguf(os.path.join(FIXTURES, gguf_name)) as gf:
        tok = Tokenizer.from_gguf(gf)
        ids = [tok.bos_id] + tok.encode(body)
        assert 16 < len(ids) <= gf.arch("context_length")
    assert out["tokens"] == len(ids) - 1
    assert out["perplexity"] == pytest.approx(hf_perplexity(hf_causal(hf_dir), ids), rel=1e-4)


def test_strided_windows_score_every_token_once():
    with open_gguf(MODEL) as gf:
        tok = Tokenizer.from_gguf(gf)
        model = Mistral3Text.load(gf, device="cpu")
    ids = [tok.bos_id] + tok.encode(TEXT * 2)
    whole, n_whole = token_nll(model, tok, ids, window=len(ids), stride=len(ids))
    strided, n_strided = token_nll(model, tok, ids, window=48, stride=24)
    assert n_whole == n_strided == len(ids) - 1
    # With 24+ tokens of context each, the strided estimate is close to but not equal to the whole.
    assert strided != whole and abs(strided - whole) / whole < 0.2
    # A window covering the text gives exactly the one-window result.
    same, _ = token_nll(model, tok, ids, window=len(ids) + 5, stride=3)
    assert same == pytest.approx(whole, rel=1e-9)


def test_run_json_contract_and_greedy_equals_hf(capsys):
    out = run_json(capsys, "run", "--model", MODEL, "--system", "Be brief.", "--prompt", "Bonjour !",
                   "--max-tokens", "10", "--ignore-eos", "--json", "--device", "cpu", "--temperature", "0")
    for key in ("text", "prompt_token_ids", "token_ids", "finish_reason", "ttft_s", "prefill_tok_s",
                "decode_tok_s"):
        assert key in out
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    ref = MistralTokenizer.from_file(os.path.join(FIXTURES, "tekken_tiny.json"))
    expected = ref.encode_chat_completion(ChatCompletionRequest(
        messages=[SystemMessage(content="Be brief."), UserMessage(content="Bonjour !")])).tokens
    assert out["prompt_token_ids"] == expected and expected[0] == 1
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == 10
    hf = hf_causal("mistral3_tiny")
    ids = list(expected)
    with torch.no_grad():
        for _ in range(10):
            ids.append(int(hf(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert out["token_ids"] == ids[len(expected):]
    assert out["text"] == Tokenizer.from_gguf(open_gguf(MODEL)).decode(out["token_ids"])


def test_run_streams_text_to_stdout(capsys):
    """The streamed pieces add up to the reply the same seeded run gives whole (--json); stats
    go to stderr. 24 tokens: the tiny vocabulary is half control tokens, which print nothing."""
    args = ["run", "--model", MODEL, "--prompt", "hi", "--max-tokens", "24", "--ignore-eos",
            "--device", "cpu", "--seed", "3", "--temperature", "0.8"]
    assert cli_main(args) == 0
    streamed = capsys.readouterr()
    assert "prompt tokens" in streamed.err
    whole = run_json(capsys, *args, "--json")["text"]
    assert whole.strip() and streamed.out == whole + "\n"


def test_errors_name_the_file_and_exit_non_zero(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    assert cli_main(["run", "--model", str(missing), "--prompt", "x"]) == 2
    assert str(missing) in capsys.readouterr().err

    mmproj = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf")
    assert cli_main(["run", "--model", mmproj, "--prompt", "x", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert mmproj in err and "vision projector" in err

    alone = tmp_path / "alone.gguf"
    shutil.copy(MODEL, alone)
    image = tmp_path / "dot.png"
    from PIL import Image

    Image.new("RGB", (20, 20), "red").save(image)
    assert cli_main(["run", "--model", str(alone), "--image", str(image), "--prompt", "x", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert str(alone) in err and "no vision projector" in err

    assert cli_main(["run", "--model", MODEL, "--prompt", "word " * 200, "--context-length", "64",
                     "--device", "cpu", "--mmproj", mmproj]) == 2
    err = capsys.readouterr().err
    assert "mistral3_tiny-f32.gguf" in err and "context length" in err and "Traceback" not in err


def test_image_prompt_finds_the_projector_beside_the_model(tmp_path, capsys):
    shutil.copy(MODEL, tmp_path / "model.gguf")
    shutil.copy(os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf"), tmp_path / "mmproj-Mistral-tiny.gguf")
    from PIL import Image

    Image.new("RGBA", (40, 30), (0, 128, 255, 128)).save(tmp_path / "a.png")
    out = run_json(capsys, "run", "--model", str(tmp_path / "model.gguf"), "--image", str(tmp_path / "a.png"),
                   "--prompt", "What colour?", "--max-tokens", "3", "--json", "--device", "cpu")
    assert 10 in out["prompt_token_ids"] and 13 in out["prompt_token_ids"]  # [IMG] ... [IMG_END]


def test_cli_entry_point_runs_as_a_program(tmp_path):
    exe = shutil.which("tramontane-cli", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "tramontane.engine.cli.main"]
    proc = subprocess.run(cmd + ["tokenize", "--model", MODEL, "--json", "[INST] hello"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ids = json.loads(proc.stdout)
    assert 3 not in ids and ids  # typed "[INST]" is text, never the control token


def test_bench_prints_speeds(capsys):
    out = run_json(capsys, "bench", "--model", MODEL, "--prompt-tokens", "32", "--gen-tokens", "8", "--json",
                   "--device", "cpu")
    assert out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0 and out["ttft_s"] > 0


def test_slicing_a_window_changes_nothing(monkeypatch):
    """A window is read a prefill chunk a step (only that chunk's logits alive); any chunk scores the same."""
    with open_gguf(MODEL) as gf:
        tok = Tokenizer.from_gguf(gf)
        model = Mistral3Text.load(gf, device="cpu")
    ids = [tok.bos_id] + tok.encode(TEXT * 2)
    whole = token_nll(model, tok, ids, window=len(ids), stride=len(ids))
    strided = token_nll(model, tok, ids, window=48, stride=24)
    monkeypatch.setattr(model, "prefill_chunk", 5)
    assert token_nll(model, tok, ids, window=len(ids), stride=len(ids))[0] == pytest.approx(whole[0], rel=1e-6)
    sliced = token_nll(model, tok, ids, window=48, stride=24)
    assert sliced[1] == strided[1] and sliced[0] == pytest.approx(strided[0], rel=1e-6)


def test_run_with_prompt_lookup_speculation_says_the_same(capsys):
    """--spec ngram: greedy output token for token the plain output, the drafts counted."""
    args = ["run", "--model", MODEL, "--prompt", "one two three four, one two three four, one two",
            "--max-tokens", "24", "--temperature", "0", "--ignore-eos", "--json", "--device", "cpu"]
    plain = run_json(capsys, *args)
    spec = run_json(capsys, *args, "--spec", "ngram", "--spec-tokens", "4")
    assert spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    assert plain["drafted_tokens"] == 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
