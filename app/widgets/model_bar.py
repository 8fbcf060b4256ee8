"""The bar above the conversation: the loaded model, device and memory, load/unload."""
from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QVBoxLayout,
                               QWidget)

from ..engine_info import EngineInfo
from .elided_label import ElidedLabel

NO_VISION_HINT = ("Images need a vision projector (mmproj-….gguf): load one together with the "
                  "model (Models… or Open…).")


class ModelBar(QFrame):
    """Which model/projector is loaded, device and memory, load/unload, load progress."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("modelBar")
        # File names elide in the middle: the quant and ".gguf" at the end stay visible.
        self.model_label = ElidedLabel("No model loaded", mode=Qt.TextElideMode.ElideMiddle)
        self.model_label.setAccessibleName("Loaded model")
        self.model_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # A chip, "vision" or "text only", the projector's file in its
        # tooltip: the file's ~50 characters have no room in the bar of a 1100 px window, and
        # cut they said nothing ("Project…16.gguf").
        self.projector_label = QLabel()
        self.projector_label.setObjectName("quantChip")
        self.projector_label.hide()
        # Where it runs first, then the memory and context figures: cut from the left, the
        # figures are the last to go.
        self.device_label = ElidedLabel(mode=Qt.TextElideMode.ElideLeft)
        self.quant_label = QLabel()  # Q4_K_M, F16...: how the weights are stored
        self.quant_label.setObjectName("quantChip")
        self.quant_label.hide()
        self.context_meter = QProgressBar()  # this chat's share of the context
        self.context_meter.setObjectName("contextMeter")
        self.context_meter.setTextVisible(False)
        self.context_meter.setFixedSize(80, 6)
        self.context_meter.setAccessibleName("Context used")
        self.context_meter.hide()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.models_button = QPushButton("Models…")
        self.models_button.setToolTip("Recommended models, downloads and the models on this "
                                      "computer (Ctrl+M)")
        self.open_button = QPushButton("Open…")
        self.open_button.setToolTip("Load a GGUF file (its mmproj projector beside it is "
                                    "loaded too)")
        self.unload_button = QPushButton("Unload")
        self.unload_button.setToolTip("Free the memory the model uses")
        self.unload_button.setEnabled(False)
        self.cancel_button = QPushButton("Cancel")  # only while a model loads (a 24B takes a minute)
        self.cancel_button.setToolTip("Stop loading this model: the one loaded before comes back")
        self.cancel_button.hide()
        self.model_combo = None  # the servers' model picker, added by the window when available
        # Two rows: the name, the load's progress and the buttons; under them, across the whole
        # bar, the projector chip, where it runs, the memory and the context. Beside the
        # buttons the second row had ~200 px at a width of 800 and its figures were cut to
        # nothing; the name elides instead (its path is in the tooltip).
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.setSpacing(0)
        top = QHBoxLayout()
        top.setSpacing(8)
        top.addWidget(self.model_label)
        top.addWidget(self.quant_label)
        top.addStretch(1)
        top.addWidget(self.progress)
        self.buttons = QHBoxLayout()
        self.buttons.addWidget(self.models_button)
        self.buttons.addWidget(self.open_button)
        self.buttons.addWidget(self.cancel_button)
        self.buttons.addWidget(self.unload_button)
        top.addLayout(self.buttons)
        layout.addLayout(top)
        line = QHBoxLayout()
        line.setSpacing(16)
        line.addWidget(self.projector_label, 0)  # here, not beside the name: the name comes first
        line.addWidget(self.device_label, 0)
        # Right after "context 512", which it measures: alone at the bar's far end, under
        # Unload, it read as a load that had stalled.
        line.addWidget(self.context_meter, 0, Qt.AlignmentFlag.AlignVCenter)
        line.addStretch(1)
        layout.addLayout(line)

    def show_loading(self, name: str) -> None:
        """The model `name` is loading: what the bar said about the previous one goes (its
        quant, "vision"/"text only", device and memory, context meter)."""
        self._clear_badges()
        self._loading_name = name
        self.model_label.setText(f"Loading {name}…")
        self.model_label.setToolTip("")
        self.model_label.setStyleSheet("")
        self.progress.setValue(0)
        self.progress.setFormat("%p %")
        self.progress.show()
        self.unload_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.cancel_button.show()

    def show_progress(self, frac: float, what: str) -> None:
        self.progress.setValue(int(1000 * max(0.0, min(1.0, frac))))
        self.progress.setToolTip(what)
        # The stage goes beside the name, which has the room (elided); in the bar it wrapped
        # and was cut.
        self.progress.setFormat("%p %")
        name = getattr(self, "_loading_name", "")
        if name:
            self.model_label.setText(f"Loading {name}… · {what}" if what else f"Loading {name}…")

    def show_cancelling(self) -> None:
        """Cancel was pressed: the load stops at its next layer."""
        self.cancel_button.setEnabled(False)
        name = getattr(self, "_loading_name", "")
        self.model_label.setText(f"Cancelling the load of {name}…" if name else "Cancelling…")

    def show_info(self, info: EngineInfo | None) -> None:
        self.progress.hide()
        self.cancel_button.hide()
        self.model_label.setStyleSheet("")
        if info is None:
            self.model_label.setText("No model loaded")
            self.model_label.setToolTip("")
            self._clear_badges()
            return
        if info.remote:
            self.model_label.setText(f"<b>{escape(info.description)}</b>")
            self.model_label.setToolTip(info.description)
            self.quant_label.hide()  # the local file's, not the server's
            self.projector_label.setText("server")
            self.projector_label.setToolTip("The model runs on a server")
            self.projector_label.show()
            self.device_label.setText("")
            self.device_label.setToolTip("")
            # Nothing of it is in this computer's memory; the model box switches back.
            self.unload_button.setEnabled(False)
            self.unload_button.setToolTip("A server's model takes no memory here: choose "
                                          "“Local model” in the box to use a local one")
            return
        else:
            self.model_label.setText(f"<b>{escape(Path(info.model_path).name)}</b>")
            self.model_label.setToolTip(info.model_path)
            quant = quant_of(info.model_path)
            self.quant_label.setText(quant)
            self.quant_label.setToolTip(f"Weights stored as {quant}" if quant else "")
            self.quant_label.setVisible(bool(quant))
            if info.mmproj_path:
                self.projector_label.setText("vision")
                self.projector_label.setToolTip(info.mmproj_path)
                self.projector_label.setAccessibleName(f"Projector {Path(info.mmproj_path).name}")
            else:
                self.projector_label.setText("text only")
                self.projector_label.setToolTip(f"No projector: {NO_VISION_HINT}")
                self.projector_label.setAccessibleName("No projector (text only)")
            self.projector_label.show()
            self.device_label.setText(device_line(info))
            self.device_label.setToolTip(device_tip(info))
        self.unload_button.setEnabled(True)
        self.unload_button.setToolTip("Free the memory the model uses")

    def show_projector_note(self, note: str) -> None:
        """The model loaded without vision because the projectors beside it do not fit it:
        which, and why, in the "text only" chip's tooltip."""
        self.projector_label.setToolTip(f"{note}\n{NO_VISION_HINT}")
        self.projector_label.setAccessibleDescription(note)

    def _clear_badges(self) -> None:
        """No model's quant, projector chip, device line or context meter."""
        self.projector_label.setText("")
        self.projector_label.setToolTip("")
        self.projector_label.setAccessibleDescription("")
        self.projector_label.hide()
        self.device_label.setText("")
        self.device_label.setToolTip("")
        self.quant_label.setText("")
        self.quant_label.hide()
        self.show_context(0, 0)
        self.unload_button.setEnabled(False)

    def show_context(self, used: int, size: int) -> None:
        """The meter of the context the open chat takes (hidden without a model or a size)."""
        self.context_meter.setVisible(size > 0)
        if size > 0:
            self.context_meter.setRange(0, size)
            self.context_meter.setValue(min(used, size))
            self.context_meter.setToolTip(f"Context: this chat takes {used} of {size} tokens")

    def show_error(self, text: str) -> None:
        self.progress.hide()
        self.cancel_button.hide()
        self.model_label.setText(text)
        self.model_label.setToolTip(text)  # the whole message; the chat shows it too
        self.model_label.setStyleSheet("color: #c62828;")


_QUANT = re.compile(r"(?i)(?:^|[-_.])((?:IQ|Q)\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?=\.gguf$)")


def quant_of(path: str) -> str:
    """The quantisation a GGUF file name ends with (…-Q4_K_M.gguf -> 'Q4_K_M'), or ''."""
    m = _QUANT.search(Path(path).name)
    return m.group(1).upper() if m else ""


def context_words(info: EngineInfo) -> str:
    """'context 256', and when Settings asked for more than the file allows, says so (what
    was asked is in the tooltip: the bar has no room for it at 1100 px)."""
    if not info.context_size:
        return ""
    if info.context_asked > info.context_size:  # the whole story is in the tooltip
        return f"context {info.context_size} (file limit)"
    return f"context {info.context_size}"


def device_line(info: EngineInfo) -> str:
    """'cpu · 551.9 MB RAM · context 256': where it runs, the memory it takes, its context
    (a model split between GPU and CPU says so: '34 of 40 layers on GPU, 6 on CPU · …')."""
    memory = info.memory.replace(" (process)", "")
    where = info.placement if info.split else info.device
    return " · ".join(bit for bit in (where, memory, context_words(info)) if bit)


def device_tip(info: EngineInfo) -> str:
    lines = [device_line(info), f"Runs on: {info.device}"]
    if info.placement:
        lines.append(f"Layers: {info.placement}")
    if info.memory:
        lines.append(f"Memory: {info.memory}")
    if info.context_size:
        lines.append(f"Context: {info.context_size} tokens")
        if info.context_limit:
            lines.append(f"The model file allows up to {info.context_limit} tokens")
        if info.context_asked > info.context_size:
            lines.append(f"Settings asks {info.context_asked}: more than the file allows, so "
                         f"{info.context_size} is used")
    return "\n".join(lines)


def escape(text: str) -> str:
    """Plain text made safe inside the bar's `<b>…</b>` labels."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
