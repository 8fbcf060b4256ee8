"""Review of the engine's end-to-end paths as a `tramontane-cli` / `LocalEngine` user hits them:
odd inputs end as one clear error line (exit 2, no traceback) and the engine stays usable and
correct (every reused-cache turn's logits equal a cold run on the whole prompt)."""
import json
import os
import shutil
import threading

import pytest
import torch

from tramontane.engine.api import ChatMessage, EngineError, SamplingParams
from tramontane.engine.cli.main import main as cli_main
from tramontane.engine.runtime.local import LocalEngine

from support import FIXTURES
from support.batch_runs import PrefillSpy
from support.engines import local_engine_fixture
MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
MMPROJ = os.path.join(FIXTURES, "mmproj-mistral3_tiny-f32.gguf")
Q256 = os.path.join(FIXTURES, "mistral3_q256-Q4_K_M.gguf")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def cli_error(capsys, *argv) -> str:
    assert cli_main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(("error:", "using projector"))
    return err


# ----------------------------------------------------------------------------- CLI inputs

def test_text_run_is_not_broken_by_a_mismatched_projector_beside_the_model(tmp_path, capsys):
    # A folder holding a hidden-256 model and a projector of another (hidden-64) model.
    shutil.copy(Q256, tmp_path / "model.gguf")
    shutil.copy(MMPROJ, tmp_path / "mmproj-mistral-tiny.gguf")
    model = str(tmp_path / "model.gguf")
    assert cli_main(["run", "--model", model, "--prompt", "hi", "--max-tokens", "2", "--device", "cpu",
                     "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) <= 2
    # An image prompt does need it: then the mismatch is the error, naming the projector.
    from PIL import Image

    Image.new("RGB", (20, 20), "red").save(tmp_path / "a.png")
    err = cli_error(capsys, "run", "--model", model, "--image", str(tmp_path / "a.png"), "--prompt", "x",
                    "--device", "cpu")
    assert "mmproj-mistral-tiny.gguf" in err and "different models" in err and "--mmproj" in err


@pytest.mark.parametrize("temperature", ["-0.5", "inf"])
def test_negative_or_infinite_temperature_is_refused(capsys, temperature):
    err = cli_error(capsys, "run", "--model", MODEL, "--prompt", "hi", "--temperature", temperature,
                    "--device", "cpu")
    assert "temperature" in err


@pytest.mark.parametrize("value", ["0", "1", "-5"])
def test_context_length_below_two_is_refused_by_perplexity(tmp_path, capsys, value):
    text = tmp_path / "t.txt"
    text.write_text("hello world, this is a test")
    err = cli_error(capsys, "perplexity", "--model", MODEL, "--file", str(text), "--context-length", value,
                    "--device", "cpu")
    assert "--context-length" in err


@pytest.mark.parametrize("value", ["0", "-3"])
def test_run_context_length_must_be_positive(capsys, value):
    err = cli_error(capsys, "run", "--model", MODEL, "--prompt", "hi", "--context-length", value,
                    "--device", "cpu")
    assert "--context-length" in err


def test_perplexity_default_window_is_bounded_for_long_context_models(tmp_path, capsys):
    """A 128k-context model must not score a long file in one 128k-row window (all-position
    logits of 128k rows x the vocabulary do not fit anywhere); the default window is bounded."""
    from support.gguf_edit import rewrite_gguf

    long_ctx = tmp_path / "long-ctx.gguf"
    rewrite_gguf(MODEL, long_ctx, set_kv={"mistral3.context_length": 1 << 17})
    text = tmp_path / "t.txt"
    text.write_text("hello world, this is a test")
    assert cli_main(["perplexity", "--model", str(long_ctx), "--file", str(text), "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["window"] <= 8192 and out["tokens"] > 0 and out["perplexity"] > 1


@pytest.mark.parametrize("flags, field", [
    (["--prompt-tokens", "0"], "--prompt-tokens"),
    (["--prompt-tokens", "-2"], "--prompt-tokens"),
    (["--gen-tokens", "-1"], "--gen-tokens"),
    (["--prompt-tokens", "600", "--gen-tokens", "8"], "context length"),
])
def test_bench_token_counts_are_checked(capsys, flags, field):
    err = cli_error(capsys, "bench", "--model", MODEL, *flags, "--device", "cpu")
    assert field in err


# ----------------------------------------------------------------------------- LocalEngine sessions

engine = local_engine_fixture(MODEL, context_length=256, kv_host_budget_mb=0)


def first_prefill(engine, messages, params=GREEDY, **kwargs):
    """(result, start position and logits of the turn's first forward)."""
    with PrefillSpy(engine) as spy:
        result = engine.chat(messages, params, **kwargs)
    start, _, logits = spy.prefill
    return result, start, logits


def cold(engine, messages):
    return engine.model.forward(engine.model.embed(engine.encode(messages).ids), 0, None)


def test_bad_sampling_settings_do_not_cost_the_active_chat_its_cache(engine):
    chat = [ChatMessage.text("user", "Tell me about the wind over the sea.")]
    engine.chat(chat, GREEDY, session_key="A")
    with pytest.raises(EngineError, match="top_p"):
        engine.chat([ChatMessage.text("user", "x")], SamplingParams(temperature=0.5, top_p=0.0), session_key="B")
    # No host budget: had the failed call switched chats, A's KV would be gone.
    result, start, logits = first_prefill(engine, chat, session_key="A")
    assert result.stats.reused_tokens == len(result.prompt_token_ids) - 1 == start
    torch.testing.assert_close(logits, cold(engine, chat), rtol=0, atol=1e-5)


def test_context_overflow_message_counts_the_reply_position():
    eng = LocalEngine(MODEL, None, device="cpu", context_length=5)
    chat = [ChatMessage.text("user", "hi")]
    n = len(eng.encode(chat).ids)
    assert n == 5
    with pytest.raises(EngineError, match=r"needs 6 positions.*context length of 5"):
        eng.chat(chat, GREEDY)
    assert eng.chat(chat, SamplingParams(max_tokens=0)).token_ids == []  # a prompt that just fits


def test_a_failing_on_piece_then_cancel_then_regenerate_stay_exact(engine):
    chat = [ChatMessage.text("user", "What do sailors call the north wind?")]

    class Boom(Exception):
        pass

    def explode_third(piece, seen=[]):
        seen.append(piece)
        if len(seen) == 3:
            raise Boom

    with pytest.raises(Boom):
        engine.chat(chat, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
                    on_piece=explode_third, session_key="C")
    result, start, logits = first_prefill(engine, chat, session_key="C")
    assert start == len(result.prompt_token_ids) - 1
    torch.testing.assert_close(logits, cold(engine, chat), rtol=0, atol=1e-5)

    chat2 = chat + [ChatMessage.text("assistant", result.text), ChatMessage.text("user", "And the south one?")]
    stop = threading.Event()

    def cancel_from_another_thread(piece):
        if not stop.is_set():
            t = threading.Thread(target=stop.set)
            t.start()
            t.join()

    cancelled = engine.chat(chat2, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True),
                            on_piece=cancel_from_another_thread, cancel=stop, session_key="C")
    assert cancelled.stats.finish_reason == "cancelled" and 0 < len(cancelled.token_ids) < 50
    # Regenerate: the same prompt again reuses all but its last token and answers like a cold run.
    again, start, logits = first_prefill(engine, chat2, session_key="C")
    assert start == len(again.prompt_token_ids) - 1
    torch.testing.assert_close(logits, cold(engine, chat2), rtol=0, atol=1e-5)
    assert again.token_ids[:len(cancelled.token_ids)] == cancelled.token_ids


def test_many_chats_with_their_blocks_evicted_are_recomputed_exactly():
    eng = LocalEngine(MODEL, None, device="cpu", context_length=128, kv_host_budget_mb=1)
    block_bytes = eng.prefix_cache.block * eng.model.kv_bytes_per_token()
    eng.prefix_cache.budget = 2 * block_bytes  # room for about one other chat's blocks
    chats = {f"k{i}": [ChatMessage.text("user", f"chat number {i} says hello, " * 5)] for i in range(4)}
    answers = {k: eng.chat(m, GREEDY, session_key=k) for k, m in chats.items()}
    assert eng.prefix_cache.used <= eng.prefix_cache.budget
    for k, m in chats.items():
        follow = m + [ChatMessage.text("assistant", answers[k].text), ChatMessage.text("user", "more")]
        result, start, logits = first_prefill(eng, follow, session_key=k)
        assert result.stats.reused_tokens == start
        torch.testing.assert_close(logits, cold(eng, follow), rtol=0, atol=1e-5)


def test_nan_weights_are_one_error_naming_the_model_file(tmp_path, capsys):
    import numpy as np
    from support.gguf_edit import rewrite_gguf

    broken = tmp_path / "nan-weights.gguf"
    rewrite_gguf(MODEL, broken, replace_tensors={"output_norm.weight": np.full((64,), np.nan, np.float32)})
    err = cli_error(capsys, "run", "--model", str(broken), "--prompt", "hi", "--device", "cpu")
    assert str(broken) in err and "invalid logits" in err and "--dtype" not in err  # no such option
    text = tmp_path / "t.txt"
    text.write_text("hello world")
    err = cli_error(capsys, "perplexity", "--model", str(broken), "--file", str(text), "--device", "cpu")
    assert str(broken) in err and "invalid logits" in err


def test_perplexity_on_a_projector_says_it_is_a_projector(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("hello world")
    err = cli_error(capsys, "perplexity", "--model", MMPROJ, "--file", str(text), "--device", "cpu")
    assert MMPROJ in err and "vision projector" in err


def test_a_closed_pipe_on_stdout_ends_quietly(tmp_path):
    """`tramontane-cli run ... | head -c 1`: the reader goes away; no traceback, no noise."""
    import subprocess
    import sys

    exe = shutil.which("tramontane-cli", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "tramontane.engine.cli.main"]
    for extra in ([], ["--json"]):
        proc = subprocess.Popen(cmd + ["run", "--model", MODEL, "--prompt", "hi", "--max-tokens", "20",
                                       "--ignore-eos", "--device", "cpu", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # before the first write: every write gets EPIPE
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_closed_engine_refuses_with_a_clear_error():
    eng = LocalEngine(MODEL, None, device="cpu", context_length=32)
    eng.close()
    with pytest.raises(EngineError, match="closed"):
        eng.chat([ChatMessage.text("user", "hi")], GREEDY, session_key="x")
    eng.forget_session("x")  # harmless


@pytest.mark.parametrize("argv, field", [
    (["run", "--model", MODEL, "--prompt", "a\udcffb", "--device", "cpu"], "--prompt"),
    (["run", "--model", MODEL, "--system", "\udcfe", "--prompt", "x", "--device", "cpu"], "--system"),
    (["tokenize", "--model", MODEL, "\udcff"], "TEXT"),
])
def test_non_utf8_command_line_text_is_one_error(capsys, argv, field):
    # What Python makes of a non-UTF-8 argv byte (surrogateescape), e.g. --prompt $'\xff'.
    err = cli_error(capsys, *argv)
    assert field in err and "not valid UTF-8" in err and ("0xff" in err or "0xfe" in err)


def test_a_message_whose_parts_is_a_bare_string_is_one_text_part(engine):
    # ChatMessage("user", "hi") instead of ChatMessage.text("user", "hi"): never "h\n\ni".
    bare = engine.encode([ChatMessage("user", "hello there")]).ids
    assert bare == engine.encode([ChatMessage.text("user", "hello there")]).ids


def test_a_bare_stop_string_is_one_stop_string():
    from tramontane.engine.runtime.generate import StopStringFilter

    f = StopStringFilter("END")
    shown = f.feed("Nice Day") + f.feed(" then END more")  # N, D alone are no stop
    assert f.stopped and shown == "Nice Day then " and f.text == "Nice Day then "


def test_model_text_on_a_terminal_that_is_not_utf8_does_not_crash():
    import subprocess
    import sys

    exe = shutil.which("tramontane-cli", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "tramontane.engine.cli.main"]
    env = dict(os.environ, PYTHONIOENCODING="latin-1")
    # this tiny model's first greedy tokens for "hello" are Arabic letters: not in latin-1
    proc = subprocess.run(cmd + ["run", "--model", MODEL, "--prompt", "hello", "--max-tokens", "4", "--temperature", "0",
                                 "--device", "cpu"], capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr and proc.stdout.strip()


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79 GiB total)\nmore"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 549755813888 bytes."),
    MemoryError(),
])
def test_out_of_memory_while_loading_is_one_error_line(capsys, monkeypatch, exc):
    """A --context-length too big for the device ends as one line, not a traceback (faked here:
    really allocating that much on a shared CI machine would invite the OOM killer)."""
    import tramontane.engine.runtime.local as local_engine

    def too_big(*args, **kwargs):
        raise exc

    monkeypatch.setattr(local_engine, "LocalEngine", too_big)
    err = cli_error(capsys, "run", "--model", MODEL, "--prompt", "hi", "--context-length", "100000000",
                    "--device", "cpu")
    assert err.count("\n") == 1 and "out of memory" in err and "--context-length" in err


def test_other_runtime_errors_are_not_disguised_as_out_of_memory(monkeypatch):
    import tramontane.engine.runtime.local as local_engine

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch in a kernel")

    monkeypatch.setattr(local_engine, "LocalEngine", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cli_main(["run", "--model", MODEL, "--prompt", "hi", "--device", "cpu"])


def test_lone_surrogate_is_a_tokenizer_error_not_a_type_error():
    from tramontane.engine.gguf import open_gguf
    from tramontane.engine.mistral3.tokenizer import Tokenizer, TokenizerError

    with open_gguf(os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")) as gf:
        tok = Tokenizer.from_gguf(gf)
    with pytest.raises(TokenizerError, match="U\\+D800"):
        tok.encode("abc\ud800def")


def test_cpu_kv_cache_larger_than_free_ram_is_refused(monkeypatch):
    from tramontane.engine import host
    from tramontane.engine.api import EngineError
    from tramontane.engine.mistral3.text import Mistral3Text
    from tramontane.engine.runtime.decoder import new_cache

    m = Mistral3Text.load(os.path.join(FIXTURES, "mistral3_tiny-f32.gguf"),
                          device="cpu")
    monkeypatch.setattr(host, "available_ram", lambda: 1000)
    with pytest.raises(EngineError, match="lower the context length"):
        new_cache(m, 512)
