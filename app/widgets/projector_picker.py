"""Model ▸ Projector…: choose the vision projector of the loaded model by hand, or none.

The choices are the pairing rule's (engine/library/projector.py `projector_choices`: the
projectors beside the model that fit it, the rule's own first, then "none"); a file from
elsewhere is checked with `check_projector` (off the UI thread: a network disk may be slow) and
refused with its reason when it does not fit, so only a projector that loads is ever offered.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QLabel, QListWidget, QListWidgetItem,
                               QPushButton, QVBoxLayout, QWidget)

from ..jobs import Jobs

NONE_TEXT = "None (text only)"
PATH_ROLE = Qt.ItemDataRole.UserRole  # the projector's path, '' for none


class ProjectorPicker(QDialog):
    """The projectors that fit `model_path` (`choices`: projector_choices' list, ProjectorCheck
    or None), the loaded one selected; `chosen()` is the path ('' none) once accepted."""

    def __init__(self, model_path: str, current: str, choices: list, parent: QWidget | None = None,
                 start_folder: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Projector")
        self.model_path = model_path
        self.start_folder = start_folder or str(Path(model_path).parent)
        self.jobs = Jobs(self)
        self.list = QListWidget()
        self.list.setAccessibleName("Projectors that fit the model")
        for choice in choices:
            self._add(str(choice.path) if choice is not None else "")
        self._name_rows()
        self._select(current)
        self.list.itemDoubleClicked.connect(lambda _item: self.accept())
        self.other_button = QPushButton("Other file…")
        self.other_button.setToolTip("A projector from another folder (it is checked against the model first)")
        self.other_button.clicked.connect(self.choose_file)
        self.error = QLabel()
        self.error.setObjectName("errorLine")  # the error colour of the theme
        self.error.setWordWrap(True)
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setText("Load with it")
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"The vision projector for {Path(model_path).name}:"))
        layout.addWidget(self.list, 1)
        layout.addWidget(self.other_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.resize(520, 300)

    def _add(self, path: str) -> QListWidgetItem:
        """One row: the file's name (its folder in the tooltip), or "none"; kept before "none"."""
        item = QListWidgetItem(Path(path).name if path else NONE_TEXT)
        item.setData(PATH_ROLE, path)
        item.setToolTip(path or "Load the model without vision")
        rows = [self.list.item(i).data(PATH_ROLE) for i in range(self.list.count())]
        if path and "" in rows:
            self.list.insertItem(rows.index(""), item)
        else:
            self.list.addItem(item)
        return item

    def _name_rows(self) -> None:
        """Each row by its file's name, told apart by its folders from another of that name (a
        projector of the same name picked from another folder) as the Models dialog does."""
        from ..model_places import distinct_names

        items = [item for item in map(self.list.item, range(self.list.count())) if item.data(PATH_ROLE)]
        paths = [Path(item.data(PATH_ROLE)) for item in items]
        for item, name in zip(items, distinct_names([(path.name, path) for path in paths])):
            item.setText(name)

    def _select(self, path: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(PATH_ROLE) == path:
                self.list.setCurrentRow(i)
                return
        self.list.setCurrentRow(0)

    def chosen(self) -> str:
        item = self.list.currentItem()
        return item.data(PATH_ROLE) if item is not None else ""

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a projector", self.start_folder,
                                              "GGUF projectors (*.gguf)")
        if path:
            self.offer_file(path)

    def offer_file(self, path: str) -> None:
        """Check `path` against the model off the UI thread; add and select it when it fits,
        else say why."""
        from ...engine.library.projector import check_projector

        model = self.model_path
        self.other_button.setEnabled(False)
        self.jobs.run(lambda: check_projector(model, path), self._checked,
                      lambda message: self._checked(None, message))

    def _checked(self, check, message: str = "") -> None:
        self.other_button.setEnabled(True)
        if check is None or not check.fits:
            self.error.setText(message or check.reason)
            self.error.show()
            return
        self.error.hide()
        path = str(check.path)
        rows = [self.list.item(i).data(PATH_ROLE) for i in range(self.list.count())]
        if path not in rows:
            self._add(path)
            self._name_rows()
        self._select(path)


__all__ = ["NONE_TEXT", "ProjectorPicker"]
