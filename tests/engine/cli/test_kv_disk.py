"""`run --kv-disk DIR`: a second process-like run on the same folder (a new engine: nothing in
memory) copies the prompt's blocks from disk and answers exactly as the first."""
import json
import os
import stat

from tramontane.engine.cli.main import main as cli_main

from support import FIXTURES

MODEL = os.path.join(FIXTURES, "mistral3_tiny-f32.gguf")
SYSTEM = "You answer questions about sailing boats, tides and the weather at sea. " * 3


def run_json(capsys, *args) -> dict:
    assert cli_main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_a_second_run_reuses_the_first_runs_blocks_from_disk(tmp_path, capsys):
    folder = tmp_path / "kv"
    args = ["run", "--model", MODEL, "--device", "cpu", "--context-length", "512", "--system", SYSTEM,
            "--prompt", "When is high tide?", "--max-tokens", "5", "--temperature", "0", "--ignore-eos",
            "--json", "--kv-disk", str(folder)]
    first = run_json(capsys, *args)
    assert first["cached_tokens"] == 0
    files = os.listdir(folder)
    assert files and all(stat.S_IMODE(os.stat(folder / f).st_mode) == 0o600 for f in files)
    second = run_json(capsys, *args)
    assert second["cached_tokens"] == first["prompt_tokens"] // 32 * 32 > 0
    assert second["token_ids"] == first["token_ids"]
    # without the folder nothing is reused
    assert run_json(capsys, *args[:-2])["cached_tokens"] == 0
