"""`tramontane-cli run --document FILE` (issue 37): the document is placed by the window's rule
(engine_documents_prompt): the prompt the CLI sends is token for token the one an in-process
engine builds from the same conversation through that function, whole when it fits the
context, searched when not (its sources in --json); a file that does not read is its one
sentence before any model loads."""
from __future__ import annotations

import json

import pytest

from tramontane.engine.api import ChatMessage, DocumentPart
from tramontane.engine.cli.main import main as cli_main
from tramontane.engine.documents.prompt import engine_documents_prompt
from tramontane.engine.runtime.local import LocalEngine

from support import FIXTURES

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"  # its file's context: 512
NOTE = "The boiler room key hangs behind the blue door.\n"
LONG = "".join(f"## Pier {i}\n\nThe pier {i} crane lifts cargo for the harbour ledger every morning.\n\n"
               for i in range(60)) + "## Lighthouse\n\nThe lighthouse keeper is named Ottoline Brack.\n"


@pytest.fixture(scope="module")
def engine():
    eng = LocalEngine(MODEL, None, device="cpu")
    yield eng
    eng.close()


def run_json(capsys, *args) -> dict:
    assert cli_main(["run", "--model", str(MODEL), "--device", "cpu", "--json", "--max-tokens", "2",
                     "--temperature", "0", *args]) == 0
    return json.loads(capsys.readouterr().out)


def expected_ids(engine, parts: list, max_tokens: int = 2) -> list[int]:
    placed = engine_documents_prompt(engine, [ChatMessage("user", parts)], max_tokens)
    return engine.encode(placed.messages).ids


def test_a_document_that_fits_goes_in_whole(tmp_path, capsys, engine):
    path = tmp_path / "key.md"
    path.write_text(NOTE, encoding="utf-8")
    out = run_json(capsys, "--document", str(path), "--prompt", "Where is the key?")
    assert [(d["name"], d["mode"]) for d in out["documents"]] == [("key.md", "whole")] and out["sources"] == []
    assert out["prompt_token_ids"] == expected_ids(engine, [DocumentPart(NOTE.encode(), "key.md"), "Where is the key?"])
    assert "behind the blue door" in engine.tokenizer.decode(out["prompt_token_ids"])


def test_a_long_document_is_searched_and_two_are_placed_in_order(tmp_path, capsys, engine):
    short, long = tmp_path / "key.md", tmp_path / "harbour.md"
    short.write_text(NOTE, encoding="utf-8")
    long.write_text(LONG, encoding="utf-8")
    question = "Who keeps the lighthouse?"
    out = run_json(capsys, "--document", str(short), "--document", str(long), "--prompt", question)
    # one too long for 512 positions: both are searched (the rule keeps RETRIEVAL_TOKENS for excerpts)
    assert [(d["name"], d["mode"]) for d in out["documents"]] == [("key.md", "retrieved"), ("harbour.md", "retrieved")]
    assert {"file": "harbour.md", "page": None, "heading": "Lighthouse"} in out["sources"]
    parts = [DocumentPart(NOTE.encode(), "key.md"), DocumentPart(LONG.encode(), "harbour.md"), question]
    assert out["prompt_token_ids"] == expected_ids(engine, parts)
    prompt = engine.tokenizer.decode(out["prompt_token_ids"])
    assert "Ottoline Brack" in prompt and "pier 7 crane" not in prompt  # excerpts, not the whole file
    assert len(out["prompt_token_ids"]) < engine.context_size


def test_a_document_that_does_not_read_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"\x00\x01\x02 binary")
    assert cli_main(["run", "--model", str(tmp_path / "no-model.gguf"), "--document", str(bad), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "notes.txt: the file holds binary data" in err  # read before the (missing) model is looked for
    assert cli_main(["run", "--model", str(MODEL), "--document", str(tmp_path / "gone.pdf"), "--prompt", "x"]) == 2
    assert "gone.pdf: cannot read" in capsys.readouterr().err
