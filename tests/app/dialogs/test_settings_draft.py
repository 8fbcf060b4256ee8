"""Settings ▸ Speculative decoding ▸ Draft model (issue 38 item 4): the picker lists the files of
the model library that can draft for the loaded model (another file, a model, smaller, the same
vocabulary read from both files), read off the UI thread; the choice is saved in the app's
settings and a reply then asks for speculation 'draft'."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pytestqt")

from gguf import GGUFReader  # noqa: E402

from tramontane.app.dialogs.settings import SettingsDialog  # noqa: E402
from tramontane.app.draft_models import draft_choices, draft_refusal, library_files  # noqa: E402
from tramontane.engine.runtime.generate import check_params  # noqa: E402
from support import FIXTURES  # noqa: E402
from support.gguf_edit import rewrite_gguf  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
DRAFT = FIXTURES / "mistral3_q256-Q4_K_M.gguf"  # the same vocabulary, a little smaller


def other_vocabulary(src, dst):
    """A copy of `src` whose tokens 1500 and 1700 trade places: same size, another vocabulary."""
    field = GGUFReader(src).fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tokens[1500], tokens[1700] = tokens[1700], tokens[1500]
    return rewrite_gguf(src, dst, set_kv={"tokenizer.ggml.tokens": tokens})


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A models folder: the model, a draft, a draft of another vocabulary, a bigger model, a
    projector and a damaged file."""
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("TRAMONTANE_MODELS_DIR", str(models))
    files = {"model": models / MODEL.name, "draft": models / DRAFT.name,
             "f16": models / "mistral3_tiny-f16.gguf", "bigger": models / "ministral3_tiny-f32.gguf",
             "projector": models / "mmproj-mistral3_tiny-f32.gguf"}
    for key, path in files.items():
        shutil.copyfile(FIXTURES / path.name, path)
    files["other"] = other_vocabulary(DRAFT, models / "other-vocab-Q4_K_M.gguf")
    files["damaged"] = models / "damaged.gguf"
    files["damaged"].write_bytes(b"GGUF" + b"\0" * 12)
    return files


def test_the_rule_names_why_each_file_cannot_draft(library):
    model = library["model"]
    assert draft_refusal(model, library["draft"]) == "" and draft_refusal(model, library["f16"]) == ""
    assert draft_refusal(model, model) == f"{model.name} is the model itself"
    assert draft_refusal(model, library["bigger"]).startswith("ministral3_tiny-f32.gguf (")
    assert "is not smaller than mistral3_tiny-f32.gguf" in draft_refusal(model, library["bigger"])
    assert draft_refusal(model, library["projector"]) == \
        "mmproj-mistral3_tiny-f32.gguf is a vision projector, not a model"
    other = draft_refusal(model, library["other"])
    assert other.startswith(f"{library['other']} cannot draft for {model}: token 1500 is ")
    assert str(library["damaged"]) in draft_refusal(model, library["damaged"])
    missing = library["model"].parent / "gone.gguf"
    assert draft_refusal(model, missing).startswith(f"{missing} cannot be read: ")

    fits, refused = draft_choices(model, library_files(None, []))
    assert fits == [(library["f16"], library["f16"].stat().st_size),
                    (library["draft"], library["draft"].stat().st_size)]  # smallest first
    assert set(refused) == {library[k] for k in ("model", "bigger", "projector", "other", "damaged")}


def pick(qtbot, dialog: SettingsDialog) -> None:
    dialog.speculation.setCurrentIndex(dialog.speculation.findData("draft"))
    qtbot.waitUntil(lambda: dialog.draft_picker.is_checked, timeout=30000)


def test_the_picker_offers_the_compatible_files_and_saves_the_choice(qtbot, settings, library):
    dialog = SettingsDialog(settings, loaded_model=str(library["model"]))
    qtbot.addWidget(dialog)
    dialog.show()
    assert [dialog.speculation.itemData(i) for i in range(dialog.speculation.count())] == ["off", "ngram", "draft"]
    assert not dialog.draft_picker.isVisible() and not dialog.draft_picker.is_checked  # nothing read for off
    pick(qtbot, dialog)
    assert dialog.draft_picker.isVisible()
    combo = dialog.draft_picker.combo
    assert [combo.itemData(i) for i in range(combo.count())] == [str(library["f16"]), str(library["draft"])]
    assert combo.itemText(1).startswith(DRAFT.name + "  (")
    assert dialog.draft_picker.note.text() == "2 files can draft for mistral3_tiny-f32.gguf."
    assert "other-vocab-Q4_K_M.gguf: " in dialog.draft_picker.note.toolTip()  # why the others cannot
    combo.setCurrentIndex(1)
    dialog.accept()
    assert dialog.result() and dialog.draft_changed
    assert settings.draft_model == str(library["draft"]) and settings.draft_to_load == str(library["draft"])
    params = settings.sampling.params()
    assert params.speculation == "draft"
    check_params(params)

    again = SettingsDialog(settings, loaded_model=str(library["model"]))
    qtbot.addWidget(again)
    assert again.speculation.currentData() == "draft"
    qtbot.waitUntil(lambda: again.draft_picker.is_checked, timeout=30000)  # read at once: draft mode shows
    assert again.draft_picker.chosen() == str(library["draft"])
    again.speculation.setCurrentIndex(again.speculation.findData("ngram"))
    again.accept()
    assert again.draft_changed and settings.draft_to_load == ""
    assert settings.draft_model == str(library["draft"])  # kept for when draft mode comes back


def test_a_chosen_file_that_no_longer_suits_the_model_is_said_and_not_kept(qtbot, settings, library):
    settings.draft_model = str(library["other"])
    dialog = SettingsDialog(settings, loaded_model=str(library["model"]))
    qtbot.addWidget(dialog)
    pick(qtbot, dialog)
    note = dialog.draft_picker.note.text()
    assert note.startswith("2 files can draft for mistral3_tiny-f32.gguf. The chosen one cannot: ")
    assert f"{library['other']} cannot draft for {library['model']}" in note
    assert dialog.draft_picker.chosen() == str(library["f16"])


def test_no_compatible_file_or_no_model_is_said_and_ok_asks_for_a_choice(qtbot, settings, library):
    for key in ("draft", "f16"):
        library[key].unlink()
    dialog = SettingsDialog(settings, loaded_model=str(library["model"]))
    qtbot.addWidget(dialog)
    pick(qtbot, dialog)
    assert dialog.draft_picker.note.text().startswith("No file on disk can draft for mistral3_tiny-f32.gguf: ")
    dialog.accept()
    assert not dialog.result() and "choose a draft model" in dialog.error.text()
    assert settings.sampling.speculation == "off"

    alone = SettingsDialog(settings)  # no model loaded, none loaded before
    qtbot.addWidget(alone)
    pick(qtbot, alone)
    assert alone.draft_picker.note.text().startswith("Load a model first")
    assert alone.draft_picker.combo.count() == 0

    settings.last_model = (str(library["model"]), "")  # the one the next start loads
    shutil.copyfile(DRAFT, library["draft"])
    last = SettingsDialog(settings)
    qtbot.addWidget(last)
    pick(qtbot, last)
    assert last.draft_picker.note.text() == \
        "1 file can draft for mistral3_tiny-f32.gguf (the model loaded last)."
