"""`tramontane-cli`: one parser lists every subcommand; errors are one line and exit 2."""
from __future__ import annotations

import pytest

from tramontane.engine.api import SamplingParams
from tramontane.engine.cli.main import build_parser, main

SUBCOMMANDS = ("info", "tokenize", "run", "perplexity", "serve", "bench", "models", "self-test")


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert f"    {name} " in text or f"    {name}\n" in text, name


def test_run_has_one_set_of_defaults_for_local_and_server():
    parser = build_parser()
    local = parser.parse_args(["run", "--model", "m.gguf", "--prompt", "x"])
    remote = parser.parse_args(["run", "--server", "http://127.0.0.1:9/v1", "--model", "m", "--prompt", "x"])
    app = SamplingParams()
    for args in (local, remote):
        assert (args.temperature, args.max_tokens, args.top_p, args.top_k, args.min_p,
                args.repetition_penalty) == (app.temperature, app.max_tokens, app.top_p, app.top_k,
                                             app.min_p, app.repetition_penalty)


@pytest.mark.parametrize("argv, names", [
    (["info", "/no/such/model.gguf"], "/no/such/model.gguf"),
    (["tokenize", "--model", "/no/such/model.gguf", "hi"], "/no/such/model.gguf"),
    (["run", "--model", "/no/such/model.gguf", "--prompt", "hi"], "/no/such/model.gguf"),
    (["perplexity", "--model", "/no/such/model.gguf", "--file", "/no/such/text.txt"], "/no/such/text.txt"),
    (["bench", "--model", "/no/such/model.gguf", "--prompt-tokens", "0"], "--prompt-tokens"),
    (["models", "download", "no-such-catalogue-id", "--offline"], "no-such-catalogue-id"),
])
def test_every_subcommand_error_is_one_line_and_exit_2(argv, names, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and names in err[0], err


@pytest.mark.parametrize("command", ["run", "perplexity", "bench", "serve"])
def test_local_model_options_are_one_set(command):
    """--device, --context-length, --device-map and --threads mean the same for every local command."""
    parser = build_parser()
    extra = {"run": ["--prompt", "x"], "perplexity": ["--file", "t.txt"], "bench": [], "serve": []}[command]
    args = parser.parse_args([command, "--model", "m.gguf", *extra, "--device", "cpu", "--context-length", "64",
                              "--device-map", "cpu=2", "--threads", "3"])
    assert (args.device, args.context_length, args.device_map, args.threads) == ("cpu", 64, "cpu=2", 3)


def test_threads_reach_the_cpu_kernels(capsys):
    from tramontane.kernels import cpu_native
    from support import FIXTURES

    before = cpu_native.threads()
    try:
        assert main(["run", "--model", str(FIXTURES / "mistral3_tiny-q8_0.gguf"), "--prompt", "hi",
                     "--max-tokens", "1", "--device", "cpu", "--threads", "1"]) == 0
        assert cpu_native.threads() == 1 or not cpu_native.AVAILABLE
    finally:
        cpu_native.set_threads(before)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", "m.gguf", "--prompt", "hi", "--threads", "0"])
    assert exc.value.code == 2 and "--threads" in capsys.readouterr().err


# ----------------------------------------------------------------------------- as a new user finds it
TINY = "tests/fixtures/mistral3_tiny-f32.gguf"


def test_a_bad_option_value_is_one_line_that_says_where_help_is(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", TINY, "--prompt", "x", "--threads", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threads" in err and "usage:" not in err
    assert "tramontane-cli run --help" in err


@pytest.mark.parametrize("command, shown", [
    ("run", ["--max-tokens MAX_TOKENS", "(default: 1024)", "(default: 0.15)", "--top-k TOP_K", "(default: 0)"]),
    ("serve", ["(default 127.0.0.1;", "(default: 8080)", "(default: 30.0)", "(default: 300.0)"]),
])
def test_help_shows_the_defaults(command, shown, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in shown:
        assert " ".join(text.split()) in out, text


def test_version_is_spelled_as_the_app_spells_it(capsys):
    from tramontane import __version__
    from tramontane.app.main import APP_NAME

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"{APP_NAME} {__version__}"


def test_a_file_that_is_not_an_image_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from tramontane.engine.runtime import local

    not_image = tmp_path / "photo.jpg"
    not_image.write_text("this is a text file")
    monkeypatch.setattr(local, "LocalEngine", lambda *a, **k: pytest.fail("the model was loaded first"))
    assert main(["run", "--model", TINY, "--image", str(not_image), "--prompt", "what is it?"]) == 2
    err = capsys.readouterr().err
    assert "photo.jpg" in err and "image" in err and err.count("\n") == 1


def test_a_context_beyond_the_file_is_capped_and_said(capsys):
    assert main(["run", "--model", TINY, "--prompt", "hi", "--max-tokens", "2", "--temperature", "0",
                 "--context-length", "100000000"]) == 0
    assert "note: --context-length 100000000 is more than mistral3_tiny-f32.gguf allows: using 512 tokens" \
        in capsys.readouterr().err


def test_bench_with_its_defaults_fits_a_short_context(capsys):
    assert main(["bench", "--model", TINY, "--json"]) == 0  # the file allows 512 tokens: 512 + 64 would not fit
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["prompt_tokens"] + 1 + report["gen_tokens"] <= 512
    assert report["gen_tokens"] == 64 and report["prompt_tokens"] == 512 - 1 - 64
