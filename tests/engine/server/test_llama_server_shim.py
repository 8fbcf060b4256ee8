"""scripts/llama_server_shim.py: llama-server's flags, as llama.cpp's server test suite passes
them, become flags `tramontane-cli serve`'s own parser takes."""
import importlib.util
from pathlib import Path

import pytest

from tramontane.engine.cli.main import build_parser

SHIM = Path(__file__).resolve().parents[3] / "scripts" / "llama_server_shim.py"


@pytest.fixture(scope="module")
def shim():
    spec = importlib.util.spec_from_file_location("llama_server_shim", SHIM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# utils.py's ServerProcess.start for the tinyllama2 preset with a key, aliases and CORS origins
SUITE_ARGV = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1",
              "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size", "32", "--no-slots",
              "--alias", "tinyllama-2,fim", "--ctx-size", "512", "--parallel", "2", "--n-predict", "64",
              "--api-key", "sk-k", "--cors-origins", "localhost, http://a.example", "--no-jinja"]


def test_the_suites_flags_parse_as_serve_with_the_local_model(shim):
    args, dropped = shim.serve_args(SUITE_ARGV, "local.gguf")
    parsed = build_parser().parse_args(["serve", *args])
    assert (parsed.model, parsed.port, parsed.host, parsed.context_length, parsed.parallel, parsed.api_key) \
        == ("local.gguf", 8080, "127.0.0.1", 512, 2, "sk-k")
    assert parsed.alias == ["tinyllama-2", "fim"]
    assert parsed.cors_origin == ["localhost", "http://a.example"]
    assert set(dropped) == {"--temp", "--seed", "--hf-repo", "--batch-size", "--no-slots", "--n-predict",
                            "--no-jinja"}


def test_llama_servers_default_origins_and_a_model_on_disk(shim):
    args, _ = shim.serve_args(["--model", "m.gguf", "--model-draft", "d.gguf"], "unused.gguf")
    parsed = build_parser().parse_args(["serve", *args])
    assert (parsed.model, parsed.draft_model, parsed.spec) == ("m.gguf", "d.gguf", "draft")
    assert parsed.cors_origin == ["*"]  # llama-server's default: every origin


@pytest.mark.parametrize("argv, local, words", [
    (["--frobnicate"], "m.gguf", "--frobnicate: not a llama-server flag"),
    (["--port"], "m.gguf", "--port needs a value"),
    (["--hf-repo", "x/y"], None, "TRAMONTANE_SHIM_MODEL"),
])
def test_what_the_shim_cannot_translate_is_one_sentence(shim, argv, local, words):
    with pytest.raises(SystemExit, match=words):
        shim.serve_args(argv, local)
