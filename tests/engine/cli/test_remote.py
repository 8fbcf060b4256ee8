"""`tramontane-cli run --server ...`: the same `run` as a local model, through RemoteEngine."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from tramontane.engine.cli.main import main as cli_main

from support.fakevllm import FakeVLLM, split_tokens

KEY = "sk-cli-0b5e22d1-SECRET"
REPLY = "Bonjour, je suis un serveur factice."


def main(argv: list[str]) -> int:
    return cli_main(["run", *argv])


@pytest.fixture
def server():
    with FakeVLLM(api_key=KEY, models=["small"], reply=REPLY) as fake:
        yield fake


def test_streams_text_to_stdout(server, capsys, monkeypatch):
    monkeypatch.setenv("TRAMONTANE_TEST_KEY", KEY)
    assert main([
        "--server", server.url, "--model", "small", "--api-key-env", "TRAMONTANE_TEST_KEY",
        "--prompt", "Salut", "--system", "Réponds en français.", "--max-tokens", "50",
        "--temperature", "0", "--top-p", "0.5", "--top-k", "5", "--seed", "7"]) == 0
    out = capsys.readouterr()
    assert out.out == REPLY + "\n"
    assert f"{server.last_usage['prompt_tokens']} prompt tokens" in out.err
    body = server.requests[0].body
    assert body["messages"] == [{"role": "system", "content": "Réponds en français."},
                                {"role": "user", "content": "Salut"}]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["top_k"],
            body["seed"]) == (50, 0.0, 0.5, 5, 7)


def test_json_output_with_image(server, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("K", KEY)
    image = tmp_path / "photo.jpg"
    Image.new("RGB", (9, 6), (5, 100, 200)).save(image, format="JPEG")
    assert main(["--server", server.url, "--model", "small", "--api-key-env", "K",
                 "--prompt", "What is this?", "--image", str(image), "--max-tokens", "3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # exactly one object, no streamed text
    assert out["text"] == "".join(split_tokens(REPLY)[:3])
    assert out["finish_reason"] == "length"
    assert out["token_ids"] == [] and out["prompt_token_ids"] == []
    assert out["usage"] == server.last_usage
    assert out["ttft_s"] > 0 and out["prefill_tok_s"] > 0 and out["decode_tok_s"] >= 0
    chat = next(r for r in server.requests if r.method == "POST")
    assert chat.images == [("image/jpeg", image.read_bytes())]
    assert chat.body["messages"][0]["content"][-1] == {"type": "text", "text": "What is this?"}


def test_errors_exit_1_without_the_key(server, capsys, monkeypatch):
    monkeypatch.setenv("K", KEY)
    assert main(["--server", server.url, "--model", "large", "--api-key-env", "K",
                 "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "does not serve the model 'large'" in err and "small" in err
    assert "0b5e22d1" not in err


def test_interrupted_prints_partial_text_and_exits_1(server, capsys):
    server.api_key = None
    server.fault, server.fault_after = "cut", 2
    assert main(["--server", server.url, "--model", "small", "--prompt", "hi", "--json"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["finish_reason"] == "interrupted"
    assert out["text"] == "".join(split_tokens(REPLY)[:2])
    assert "connection broke" in out["error"] and "interrupted" in captured.err


def test_missing_key_variable_is_a_usage_error(server, capsys, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert main(["--server", server.url, "--model", "small", "--api-key-env",
                 "NO_SUCH_KEY_VAR", "--prompt", "hi"]) == 2
    assert "NO_SUCH_KEY_VAR is not set" in capsys.readouterr().err
    assert not server.requests


def test_missing_image_file_is_a_usage_error(server, capsys, tmp_path):
    missing = tmp_path / "nope.png"
    assert main(["--server", server.url, "--model", "small", "--prompt", "hi",
                 "--image", str(missing)]) == 2
    assert f"{missing}: cannot read image" in capsys.readouterr().err


def test_through_tramontane_cli_run(server, capsys, monkeypatch):
    """The real `tramontane-cli run --server` parser (engine/cli/main.py) reaches run_remote with
    its shared run options (min-p, repetition penalty, ignore-eos)."""
    cli = pytest.importorskip("tramontane.engine.cli.main")
    monkeypatch.setenv("K", KEY)
    try:
        code = cli.main(["run", "--server", server.url, "--model", "small", "--api-key-env",
                         "K", "--prompt", "hi", "--min-p", "0.1", "--repetition-penalty",
                         "1.2", "--ignore-eos", "--json"])
    except SystemExit as exc:  # a main() that exits instead of returning
        code = exc.code
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == REPLY
    body = server.requests[0].body
    assert (body["min_p"], body["repetition_penalty"], body["ignore_eos"]) == (0.1, 1.2, True)
