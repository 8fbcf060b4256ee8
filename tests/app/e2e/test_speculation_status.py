"""The reply's status line while speculative decoding is on (issue 38): tokens a step and the share
of drafts accepted, from the reply's own GenerationStats, on the real window and the tiny model
made to copy the passage it was given (prompt lookup drafts it)."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from tramontane.app.widgets.speculation_status import speculation_note  # noqa: E402
from tramontane.engine.api import GenerationStats  # noqa: E402
from support.app_window import close_window, make_window  # noqa: E402
from support.scripted import ScriptedLogits, script_logits  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

PASSAGE = ("def scale(values, factor): return [value * factor for value in values] "
           "# scale every value by the factor, keeping their order")


def test_note_counts_passes_and_acceptance():
    # 30 tokens, 20 of them accepted drafts of 25 drafted: 10 passes of the model, 3 tokens each
    assert speculation_note(GenerationStats(generated_tokens=30, drafted_tokens=25, accepted_tokens=20)) \
        == "spec 3.0 tok/step, 80 % accepted"
    assert speculation_note(GenerationStats(generated_tokens=10, drafted_tokens=6, accepted_tokens=0)) \
        == "spec 1.0 tok/step, 0 % accepted"
    assert speculation_note(GenerationStats(generated_tokens=10)) == ""  # nothing drafted: no item


def reply(qtbot, window, text: str, reply_ids: list[int]) -> int:
    edit = window.composer.edit
    edit.setFocus()
    edit.setPlainText(text)
    window.session.param_overrides = dict(window.session.param_overrides, max_tokens=len(reply_ids))
    with qtbot.waitSignal(window.replyFinished, timeout=60000) as blocker:
        qtbot.keyClick(edit, Qt.Key.Key_Return)
    return blocker.args[0]


@pytest.mark.parametrize("mode", ["ngram", "off"])
def test_the_status_line_shows_tokens_a_step_while_speculating(qtbot, tmp_path, monkeypatch, mode):
    window = make_window(qtbot, tmp_path / "data")
    try:
        window.settings.sampling = dataclasses.replace(window.settings.sampling, speculation=mode)
        tok = window.worker.engine.tokenizer
        want = tok.encode(PASSAGE)  # the reply copies the message: what prompt lookup drafts from
        script_logits(monkeypatch, ScriptedLogits(want, tok.eos_id))
        reply_id = reply(qtbot, window, PASSAGE, want)

        stats = window.session.live_stats[reply_id]
        stored = window.store.get_chat(window.session.current_chat_id).messages[-1]
        assert stored.text == tok.decode(want)  # lossless: the scripted reply, whatever the mode
        status = window.view.widgets[-1].status.text()
        assert "tok/s" in status
        if mode == "off":
            assert stats.drafted_tokens == 0 and "tok/step" not in status
            return
        # after its first few tokens the reply is a copy: most of it comes as accepted drafts
        assert stats.generated_tokens == len(want)
        assert len(want) // 2 <= stats.accepted_tokens <= stats.drafted_tokens
        per_step = len(want) / (len(want) - stats.accepted_tokens)
        shown = f"spec {per_step:.1f} tok/step, {100 * stats.accepted_tokens / stats.drafted_tokens:.0f} % accepted"
        assert shown in status and status.index("tok/s") < status.index(shown)
    finally:
        close_window(window)
