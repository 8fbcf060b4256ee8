"""Settings ▸ Speculative decoding ▸ Draft model: a picker of the GGUF files on disk that can draft
for the model (app/draft_models.py's rule), checked off the UI thread on the app's job pool."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QLabel, QVBoxLayout, QWidget

from ...engine.library.sizes import size_text
from ..config import AppSettings
from ..jobs import Jobs
from ..model_places import distinct_names, shown_name

CHECKING = "Looking for files that can draft for {model}…"
NO_TARGET = "Load a model first: a draft model is chosen among the files that share its vocabulary."


def draft_target(settings: AppSettings, loaded_model: str | None) -> tuple[str, str]:
    """(the model a draft is checked against, how it is said): the loaded one, else the one the
    window loads at its next start; ('', '') when neither is there."""
    if loaded_model:
        return loaded_model, Path(loaded_model).name
    last, _mmproj = settings.last_model
    if last and Path(last).is_file():
        return last, f"{Path(last).name} (the model loaded last)"
    return "", ""


class DraftPicker(QWidget):
    """The compatible files, smallest first, the chosen one (AppSettings.draft_model) selected;
    below, what was found, or why the chosen file does not suit the model. `checked` is emitted
    once the files have been read (`is_checked` then holds)."""

    checked = Signal()

    def __init__(self, settings: AppSettings, loaded_model: str | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.target, self.target_words = draft_target(settings, loaded_model)
        self.is_checked = False
        self._started = False
        self.jobs = Jobs(self)  # nothing is delivered once the dialog is gone
        self.combo = QComboBox()
        self.combo.setToolTip("A smaller model with the same vocabulary proposes tokens; the model "
                              "checks them all in one pass and keeps the ones it would have written")
        saved = settings.draft_model
        if saved and Path(saved).is_file():  # until the check says: OK keeps it as chosen
            self.combo.addItem(Path(saved).name, saved)
        self.note = QLabel()
        self.note.setObjectName("draftModelNote")
        self.note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo)
        layout.addWidget(self.note)

    def chosen(self) -> str:
        return self.combo.currentData() or ""

    def look(self) -> None:
        """Read the library's files against the model, once (the first time draft mode is shown)."""
        if self._started:
            return
        self._started = True
        if not self.target:
            self.note.setText(NO_TARGET)
            self._done()
            return
        from ..draft_models import draft_choices, library_files

        target, models_dir = self.target, self.settings.models_dir
        saved = self.settings.draft_model
        recent = self.settings.recent_models + ([saved] if saved else [])  # the chosen one is judged too
        self.note.setText(CHECKING.format(model=Path(target).name))

        def look() -> tuple[list[tuple[Path, int]], list[str], dict[Path, str]]:
            fits, refused = draft_choices(target, library_files(models_dir, recent))
            # listed as the Models dialog lists them: Ollama's blobs by model name, two model.gguf apart
            return fits, distinct_names([(shown_name(p), p) for p, _size in fits]), refused

        self.jobs.run(look, self._show, self._failed)

    def _show(self, outcome: tuple[list[tuple[Path, int]], list[str], dict[Path, str]]) -> None:
        fits, names, refused = outcome
        saved = self.settings.draft_model
        keep = self.chosen() or saved
        self.combo.clear()
        for (path, size), name in zip(fits, names):
            self.combo.addItem(f"{name}  ({size_text(size)})", str(path))
            self.combo.setItemData(self.combo.count() - 1, str(path), Qt.ItemDataRole.ToolTipRole)
        at = self.combo.findData(keep)
        self.combo.setCurrentIndex(at if at >= 0 else 0)
        words = [f"{len(fits)} file{'s' if len(fits) != 1 else ''} can draft for {self.target_words}."
                 if fits else f"No file on disk can draft for {self.target_words}: a draft is a smaller "
                              "GGUF of the same vocabulary (Ministral 3 3B for Mistral Small 3.1/3.2 or "
                              "Ministral 3 8B and 14B)."]
        why_saved = next((why for path, why in refused.items() if saved and str(path) == saved), "")
        if why_saved:
            words.append(f"The chosen one cannot: {why_saved}.")
        self.note.setText(" ".join(words))
        self.note.setToolTip("\n".join(f"{p.name}: {why}" for p, why in refused.items()))
        self._done()

    def _failed(self, message: str) -> None:
        self.note.setText(f"Could not look for draft models: {message}")
        self._done()

    def _done(self) -> None:
        self.is_checked = True
        self.checked.emit()


__all__ = ["DraftPicker", "draft_target"]
