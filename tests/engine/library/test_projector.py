"""The one projector-pairing rule (engine/library/projector.py), used by the CLI and the window:
same output width as the model's hidden size, then the model's own name, then f16."""
from __future__ import annotations

import json
import shutil

import pytest
from support import FIXTURES

from tramontane.engine.api import ChatMessage, SamplingParams
from tramontane.engine.cli.main import main as cli_main
from tramontane.engine.library.models_folder import scan_models
from tramontane.engine.library.projector import find_projector, name_rank
from tramontane.engine.mistral3.config import ProjectorMismatchError, check_pair
from tramontane.engine.runtime.local import LocalEngine

TINY = "mistral3_tiny-f32.gguf"  # hidden 64
GELU = "mistral3_tiny_gelu-f32.gguf"  # hidden 64, another model with its own projector
Q256 = "mistral3_q256-Q4_K_M.gguf"  # hidden 256: no projector here fits it
TINY_PROJ, GELU_PROJ = "mmproj-mistral3_tiny-f32.gguf", "mmproj-mistral3_tiny_gelu-f32.gguf"


def folder_with(tmp_path, *names):
    for name in names:
        shutil.copy(FIXTURES / name, tmp_path / name)
    return tmp_path


def cli_projector(capsys, model) -> str | None:
    assert cli_main(["info", "--json", str(model)]) == 0
    return json.loads(capsys.readouterr().out)["projector_found"]


def gui_projector(folder, model) -> str | None:
    """What the window's model list pairs (scan of the models folder)."""
    found = {m.path.name: m for m in scan_models(folder)}
    mmproj = found[model].mmproj
    return str(mmproj) if mmproj else None


def test_each_model_gets_its_own_projector_when_widths_tie(tmp_path, capsys):
    d = folder_with(tmp_path, TINY, GELU, TINY_PROJ, GELU_PROJ)
    assert find_projector(d / TINY) == d / TINY_PROJ
    assert find_projector(d / GELU) == d / GELU_PROJ
    for model, proj in ((TINY, TINY_PROJ), (GELU, GELU_PROJ)):
        assert cli_projector(capsys, d / model) == gui_projector(d, model) == str(d / proj)


def test_the_only_projector_of_the_right_width_is_paired(tmp_path, capsys):
    d = folder_with(tmp_path, TINY, GELU_PROJ)
    (d / TINY).rename(d / "some-model.gguf")
    assert find_projector(d / "some-model.gguf") == d / GELU_PROJ
    assert cli_projector(capsys, d / "some-model.gguf") == gui_projector(d, "some-model.gguf")


def test_a_projector_of_another_width_is_never_paired_and_refused_naming_both(tmp_path, capsys):
    d = folder_with(tmp_path, Q256, TINY_PROJ)
    assert find_projector(d / Q256) is None
    assert cli_projector(capsys, d / Q256) is None and gui_projector(d, Q256) is None
    with pytest.raises(ProjectorMismatchError) as exc:
        check_pair(d / Q256, d / TINY_PROJ)
    assert TINY_PROJ in str(exc.value) and Q256 in str(exc.value)
    # an explicit --mmproj of the wrong width: one line naming both files, nothing loaded
    assert cli_main(["run", "--model", str(d / Q256), "--mmproj", str(d / TINY_PROJ), "--prompt", "x",
                     "--device", "cpu", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert TINY_PROJ in err and Q256 in err


def test_no_projector_loads_text_only(tmp_path):
    d = folder_with(tmp_path, Q256, TINY_PROJ)
    engine = LocalEngine(d / Q256, None, device="cpu", context_length=64)
    try:
        assert not engine.has_vision
        result = engine.chat([ChatMessage.text("user", "hi")], SamplingParams(max_tokens=2, temperature=0.0))
        assert len(result.token_ids) >= 1
    finally:
        engine.close()


def test_name_rank_orders_own_name_then_f16():
    model = "Mistral-Small-3.1-24B-Instruct-2503-Q4_K_M.gguf"
    names = ["mmproj-other-model-f16.gguf", "mmproj-Mistral-Small-3.1-24B-Instruct-2503-f32.gguf",
             "mmproj-Mistral-Small-3.1-24B-Instruct-2503-f16.gguf", "mmproj-F16.gguf"]
    ranked = sorted(names, key=lambda n: name_rank(model, n))
    assert ranked[:2] == ["mmproj-Mistral-Small-3.1-24B-Instruct-2503-f16.gguf",
                          "mmproj-Mistral-Small-3.1-24B-Instruct-2503-f32.gguf"]
    assert name_rank(model, "mistral3-mmproj.gguf")[0] == 0  # the conventional name


def hf_snapshot(root, files: dict[str, str]):
    """A Hugging Face cache repo as the hub client lays it out: the snapshot folder holds links
    named as in the repository, pointing into blobs/ (files named by their hash)."""
    repo = root / "hub" / "models--x--y"
    snapshot, blobs = repo / "snapshots" / "abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, (name, fixture) in enumerate(files.items()):
        blob = blobs / f"{i:064x}"
        shutil.copy(FIXTURES / fixture, blob)
        (snapshot / name).symlink_to(blob)
    return snapshot


def test_a_model_in_the_hugging_face_cache_keeps_its_projector(tmp_path, capsys):
    """Issue 35, item 1: paired by the folder the user sees, not the link's target in blobs/."""
    from tramontane.engine.library.models_folder import describe_model

    snapshot = hf_snapshot(tmp_path, {"model.gguf": TINY, "mmproj-model-f16.gguf": TINY_PROJ})
    assert find_projector(snapshot / "model.gguf") == snapshot / "mmproj-model-f16.gguf"
    m = describe_model(snapshot / "model.gguf")
    assert m.path == snapshot / "model.gguf" and m.mmproj == snapshot / "mmproj-model-f16.gguf"
    assert cli_projector(capsys, snapshot / "model.gguf") == str(snapshot / "mmproj-model-f16.gguf")
    # a models folder that links a snapshot's files in: listed under the link's name, paired
    models = tmp_path / "models"
    models.mkdir()
    for name in ("model.gguf", "mmproj-model-f16.gguf"):
        (models / name).symlink_to(snapshot / name)
    assert gui_projector(models, "model.gguf") == str(models / "mmproj-model-f16.gguf")


def test_a_refused_projector_is_named_with_its_reason(tmp_path):
    """Issue 35, item 6: a projector of another width is not dropped without a word."""
    from tramontane.engine.library.models_folder import scan_models
    from tramontane.engine.library.projector import pair_projector

    d = folder_with(tmp_path, Q256, TINY_PROJ)
    pairing = pair_projector(d / Q256)
    assert pairing.projector is None and [c.path for c in pairing.refused] == [d / TINY_PROJ]
    note = {m.path.name: m for m in scan_models(d)}[Q256].projector_note
    assert note == pairing.note
    assert TINY_PROJ in note and "outputs 64 features" in note and "hidden size 256" in note
    assert note.endswith("The model loads without vision.")
    (tmp_path / "paired").mkdir()
    d2 = folder_with(tmp_path / "paired", TINY, TINY_PROJ)
    assert {m.path.name: m for m in scan_models(d2)}[TINY].projector_note == ""


def test_projector_choices_list_those_that_fit_then_none(tmp_path):
    """The library side of choosing a projector by hand: the ones that fit, best first, then
    "none"; a file from elsewhere is checked with the same rule."""
    from tramontane.engine.library.projector import check_projector, projector_choices

    d = folder_with(tmp_path, TINY, Q256, TINY_PROJ, GELU_PROJ)
    assert [c and c.path for c in projector_choices(d / TINY)] == [d / TINY_PROJ, d / GELU_PROJ, None]
    assert projector_choices(d / Q256) == [None]
    assert check_projector(d / TINY, d / GELU_PROJ).fits
    refused = check_projector(d / Q256, d / TINY_PROJ)
    assert not refused.fits and TINY_PROJ in refused.reason and Q256 in refused.reason
    not_one = check_projector(d / TINY, d / Q256)
    assert not not_one.fits and Q256 in not_one.reason
