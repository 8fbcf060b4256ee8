"""A draft model in the real window (issue 38 item 4): chosen in Settings while a model is loaded,
the model loads again with it (as LM Studio does) and replies ask for speculation 'draft', their
text the plain reply's and the status line showing tokens a step; a draft that cannot draft for the
model, or fails to load, leaves the model loaded without it and the status line says why."""
from __future__ import annotations

import dataclasses
import shutil

import pytest

pytest.importorskip("pytestqt")

from tramontane.app.dialogs.settings import SettingsDialog  # noqa: E402
from support import FIXTURES  # noqa: E402
from support.app_window import MODEL, close_window, load_and_wait, make_window, send  # noqa: E402
from support.gguf_edit import rewrite_gguf  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

DRAFT = FIXTURES / "mistral3_q256-Q4_K_M.gguf"  # the same vocabulary as MODEL, another model
QUESTION = "Tell me about the mistral"


def with_draft_mode(window, draft) -> None:
    window.settings.sampling = dataclasses.replace(window.settings.sampling, speculation="draft")
    window.settings.draft_model = str(draft)


def asked_modes(monkeypatch, window) -> list[str]:
    """The speculation each reply the window sends asks for."""
    modes = []
    send_on = window.worker.chat

    def chat(request):
        modes.append(request.params.speculation)
        send_on(request)

    monkeypatch.setattr(window.worker, "chat", chat)
    return modes


def test_a_draft_chosen_in_settings_reloads_the_model_and_drafts_every_reply(qtbot, tmp_path, monkeypatch):
    models = tmp_path / "models"  # the models folder the window's settings point at (isolate)
    models.mkdir()
    shutil.copyfile(DRAFT, models / DRAFT.name)
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    try:
        modes = asked_modes(monkeypatch, window)
        plain = window.store.get_message(send(qtbot, window, QUESTION)).text
        assert modes == ["off"] and window.model_loading.draft_in_use == ""
        assert window.worker.engine.scheduler.draft_model is None

        def user_picks_the_draft(dialog) -> int:
            dialog.speculation.setCurrentIndex(dialog.speculation.findData("draft"))
            qtbot.waitUntil(lambda: dialog.draft_picker.is_checked, timeout=30000)
            assert dialog.draft_picker.chosen() == str(models / DRAFT.name)
            dialog.accept()
            return 1

        monkeypatch.setattr(SettingsDialog, "exec", user_picks_the_draft)
        with qtbot.waitSignal(window.modelLoaded, timeout=60000):
            window.dialogs.open_settings()  # changed while loaded: the model loads again at once
        assert window.model_loading.draft_in_use == str(models / DRAFT.name)
        assert window.worker.engine.scheduler.draft_model is not None
        assert not window.reload_button.isVisible()

        window.navigation.new_chat()
        reply_id = send(qtbot, window, QUESTION)
        assert modes == ["off", "draft"]
        assert window.store.get_message(reply_id).text == plain  # lossless: the plain reply
        stats = window.session.live_stats[reply_id]
        assert 0 < stats.drafted_tokens and stats.accepted_tokens <= stats.drafted_tokens
        per_step = stats.generated_tokens / (stats.generated_tokens - stats.accepted_tokens)
        shown = f"spec {per_step:.1f} tok/step, {100 * stats.accepted_tokens / stats.drafted_tokens:.0f} % accepted"
        assert shown in window.view.widgets[-1].status.text()  # the speculation status item

        def user_changes_nothing(dialog) -> int:
            qtbot.waitUntil(lambda: dialog.draft_picker.is_checked, timeout=30000)
            dialog.accept()
            return 1

        monkeypatch.setattr(SettingsDialog, "exec", user_changes_nothing)
        window.dialogs.open_settings()
        assert window.session.loading is None and window.model_loading.checking_model is None  # no reload
    finally:
        close_window(window)


def other_vocabulary(dst):
    from gguf import GGUFReader

    field = GGUFReader(DRAFT).fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tokens[1500], tokens[1700] = tokens[1700], tokens[1500]
    return rewrite_gguf(DRAFT, dst, set_kv={"tokenizer.ggml.tokens": tokens})


@pytest.mark.parametrize("broken", ["vocabulary", "weights", "missing"])
def test_a_draft_that_cannot_load_leaves_the_model_loaded_and_the_status_line_says_why(
        qtbot, tmp_path, monkeypatch, broken):
    draft = {"vocabulary": lambda: other_vocabulary(tmp_path / "other-vocab.gguf"),
             # its header and vocabulary pass the checks; a layer's weights are gone
             "weights": lambda: rewrite_gguf(DRAFT, tmp_path / "no-norm.gguf", drop_tensors=["output_norm.weight"]),
             "missing": lambda: tmp_path / "gone.gguf"}[broken]()
    window = make_window(qtbot, tmp_path / "data", load=False)
    try:
        with_draft_mode(window, draft)
        modes = asked_modes(monkeypatch, window)
        load_and_wait(qtbot, window, MODEL)
        assert window.session.engine_info is not None and window.session.engine_info.model_path == str(MODEL)
        assert window.worker.engine.scheduler.draft_model is None and window.model_loading.draft_in_use == ""
        said = window.statusBar().currentMessage()
        words = {"vocabulary": f"{draft} cannot draft for {MODEL}: token 1500 is ",
                 "weights": f"{draft.name} did not load (",
                 "missing": f"{draft} cannot be read: "}[broken]
        assert said.startswith(f"{MODEL.name} loaded without its draft model: {words}"), said
        assert said.endswith(".") and said.count(". ") == 0  # one sentence
        send(qtbot, window, QUESTION)  # the model answers, drafting with nothing
        assert modes == ["draft"]
    finally:
        close_window(window)
