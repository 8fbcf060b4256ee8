"""The Chat settings dialog: one chat's own temperature, top_p, max tokens and seed, or the
app's (Settings) when "Use the defaults" is ticked; and, for a model that can think, the
chat's reasoning switch (app/reasoning.py), with what it can and cannot do for that model; whether
the chat's system prompt is sent alone, without the model's shipped one after it (app/model_prompt.py);
and, where the chat may call tools, whether its replies must call one first (app/tools.py)."""
from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QLabel, QLineEdit, QSpinBox, QVBoxLayout, QWidget)

from ..config import SAMPLING_RANGES, Sampling, seed_from_text
from ..reasoning import switch_words
from ..worker import OVERFLOW_CHOICES


class ChatSettingsDialog(QDialog):
    """After OK, `values()` is the chat's own values (CHAT_SAMPLING_FIELDS), or None for the
    defaults."""

    def __init__(self, own: dict[str, Any] | None, defaults: Sampling, parent: QWidget | None = None, *,
                 new_chat: bool = False, reasoning: bool = True, can_think: bool = False, chat_version: int = 0,
                 overflow: str = "stop", own_prompt_only: bool = False, tools_required: bool | None = None,
                 recommended: str = ""):
        """`defaults`: what a chat that uses the defaults samples with (Settings', with the loaded
        model's recommended values where Settings leaves them at theirs); `recommended`: those
        values in words ('' none). `reasoning`: the chat's switch; shown only where the loaded model `can_think`.
        `overflow`: what the chat does when it outgrows the context (worker.OVERFLOW_CHOICES).
        `own_prompt_only`: the chat's system prompt alone. `tools_required`: the chat's replies
        must call a tool first; None where tools are off for the chat (the box is hidden)."""
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.defaults = defaults
        shown = defaults.overlaid(own) if own is not None else defaults
        self.use_defaults = QCheckBox(f"Use the defaults (Settings; {recommended}: the model's recommended)"
                                      if recommended else "Use the defaults (Settings)")
        self.use_defaults.setToolTip("This chat follows the sampling settings of Settings, also when they "
                                     "change later; where Settings leaves temperature or top-p at its default, "
                                     "the loaded model's recommended value (its card's) is used")
        form = self._sampling_form(shown)
        self.error = QLabel()
        self.error.setStyleSheet("color: #c62828;")
        self._overflow_choice(overflow)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("How replies are sampled in the chat you start now:" if new_chat
                                else "How replies are sampled in this chat:"))
        layout.addWidget(self.use_defaults)
        layout.addLayout(form)
        layout.addWidget(self.error)
        overflow_row = QFormLayout()
        overflow_row.addRow("When the chat is &longer than the context:", self.overflow)
        layout.addLayout(overflow_row)
        self._chat_switches(layout, can_think, chat_version, reasoning, own_prompt_only, tools_required)
        layout.addWidget(box)
        self.use_defaults.toggled.connect(self._defaults_toggled)
        self.use_defaults.setChecked(own is None)
        self._defaults_toggled(own is None)

    def _sampling_form(self, shown: Sampling) -> QFormLayout:
        """The sampling knobs, set to what the chat samples with now."""
        self.temperature = self._double("temperature", 0.05, shown.temperature)
        self.temperature.setToolTip("0 = always the most likely token (greedy)")
        self.top_p = self._double("top_p", 0.05, shown.top_p)
        self.top_p.setToolTip("Nucleus sampling; 1 = off")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(*(int(v) for v in SAMPLING_RANGES["max_tokens"][1:]))
        self.max_tokens.setValue(shown.max_tokens)
        self.max_tokens.setToolTip("Longest reply, in tokens")
        self.seed = QLineEdit("" if shown.seed is None else str(shown.seed))
        self.seed.setPlaceholderText("random")
        self.seed.setToolTip("A number makes replies repeatable; empty = random")
        form = QFormLayout()
        form.addRow("&Temperature:", self.temperature)
        form.addRow("Top &p:", self.top_p)
        form.addRow("&Max tokens:", self.max_tokens)
        form.addRow("S&eed:", self.seed)
        return form

    def _overflow_choice(self, overflow: str) -> None:
        self.overflow = QComboBox()  # not a sampling knob: "Use the defaults" leaves it alone
        for key, words in OVERFLOW_CHOICES.items():
            self.overflow.addItem(words, key)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(overflow)))
        self.overflow.setToolTip("When the chat no longer fits the model's context: stop with a "
                                 "sentence, or leave earlier turns out of the prompt (they stay "
                                 "in the chat); the system prompt and your last message are always read")

    def _chat_switches(self, layout: QVBoxLayout, can_think: bool, chat_version: int, reasoning: bool,
                       own_prompt_only: bool, tools_required: bool | None) -> None:
        """Reasoning, the model's own system prompt and tools required: the chat's switches."""
        label, note = switch_words(can_think, chat_version, reasoning)
        self.reasoning = QCheckBox("&Reasoning: the model thinks before it answers")
        self.reasoning.setChecked(reasoning)
        self.reasoning.setVisible(bool(label))
        self.reasoning_note = QLabel(note)  # said, not hidden in a tooltip: off may change nothing
        self.reasoning_note.setObjectName("statusLine")
        self.reasoning_note.setWordWrap(True)
        self.reasoning_note.setVisible(bool(label))
        layout.addWidget(self.reasoning)
        layout.addWidget(self.reasoning_note)
        self.own_prompt_only = QCheckBox("Send only this chat's &system prompt, without the model's own after it")
        self.own_prompt_only.setChecked(own_prompt_only)
        self.own_prompt_only.setToolTip("Some models ship a system prompt (Magistral's tells it how to think): "
                                        "it is appended after this chat's, as the model's card asks, unless "
                                        "this is ticked")
        layout.addWidget(self.own_prompt_only)
        self.tools_required = QCheckBox("Each reply must &call a tool first")
        self.tools_required.setChecked(bool(tools_required))
        self.tools_required.setVisible(tools_required is not None)
        self.tools_required.setToolTip("The reply's first round must call one of the chat's tools "
                                       "(tool_choice 'required'); later rounds choose")
        layout.addWidget(self.tools_required)

    def _double(self, name: str, step: float, value: float) -> QDoubleSpinBox:
        _, lo, hi = SAMPLING_RANGES[name]
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setDecimals(2)
        box.setSingleStep(step)
        box.setValue(value)
        return box

    def _fields(self) -> tuple[QWidget, ...]:
        return self.temperature, self.top_p, self.max_tokens, self.seed

    def _defaults_toggled(self, on: bool) -> None:
        """Ticked: the fields show the defaults, greyed; unticked: the chat's to change."""
        for widget in self._fields():
            widget.setEnabled(not on)
        if on:
            self.temperature.setValue(self.defaults.temperature)
            self.top_p.setValue(self.defaults.top_p)
            self.max_tokens.setValue(self.defaults.max_tokens)
            self.seed.setText("" if self.defaults.seed is None else str(self.defaults.seed))
            self.error.setText("")

    def values(self) -> dict[str, Any] | None:
        """The fields as the chat's own values; None when it uses the defaults. ValueError
        (a sentence) for a seed that is not a number."""
        if self.use_defaults.isChecked():
            return None
        return {"temperature": self.temperature.value(), "top_p": self.top_p.value(),
                "max_tokens": self.max_tokens.value(), "seed": seed_from_text(self.seed.text())}

    def overflow_choice(self) -> str:
        return str(self.overflow.currentData())

    def accept(self) -> None:
        try:
            self.values()
        except ValueError as exc:
            self.error.setText(str(exc))
            self.seed.setFocus()
            return
        super().accept()


__all__ = ["ChatSettingsDialog"]
