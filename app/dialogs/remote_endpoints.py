"""Remote endpoints in the GUI: the settings page to add, edit, test and remove
OpenAI-compatible servers, and the per-chat model picker ("Local model" + servers' models).

The servers are kept by app/remote_endpoints.py (RemoteEndpointList, in the settings table); the API key
field here is a password field.

Network calls (Test connection, refreshing the model lists) run as background jobs
(app/jobs.py); their results come back on the GUI thread.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
    QListWidget, QPushButton, QVBoxLayout, QWidget)

from ...engine.api import EngineError
from ...engine.remote.transport import fetch_models, parse_base_url
from ..jobs import Jobs
from ..remote_endpoints import EngineChoice, RemoteEndpoint, RemoteEndpointList, url_ok

LOCAL_LABEL = "Local model"
TEST_TIMEOUT_S = 10.0


class RemoteEndpointsWidget(QWidget):
    """Add / edit / remove servers, and test a server's connection (lists its models)."""

    endpointsChanged = Signal()
    testFinished = Signal(bool, str)  # ok, message shown

    def __init__(self, settings: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.servers = RemoteEndpointList(settings)
        self._configs = self.servers.load()
        self.jobs = Jobs(self)
        self._loading = False

        self.list = QListWidget()
        self.add_button = QPushButton("Add")
        self.remove_button = QPushButton("Remove")
        self.name_edit = QLineEdit()
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional")
        self.model_combo = QComboBox()
        self.model_combo.setEditable(True)
        self.test_button = QPushButton("Test connection")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        form.addRow("Base URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("Default model", self.model_combo)
        form.addRow(self.test_button)
        form.addRow(self.status)
        self.form_box = QWidget()
        self.form_box.setLayout(form)

        left = QVBoxLayout()
        left.addWidget(self.list)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.remove_button)
        left.addLayout(buttons)
        layout = QHBoxLayout(self)
        layout.addLayout(left, 1)
        layout.addWidget(self.form_box, 2)

        self.add_button.clicked.connect(self.add_server)
        self.remove_button.clicked.connect(self.remove_current)
        self.test_button.clicked.connect(self.test_connection)
        self.list.currentRowChanged.connect(self._show_row)
        for edit in (self.name_edit, self.url_edit, self.key_edit):
            edit.editingFinished.connect(self.commit_form)
        self.model_combo.currentTextChanged.connect(lambda _text: self.commit_form())

        self._reload_list(0)

    # -- list -------------------------------------------------------------------------------
    def configs(self) -> list[RemoteEndpoint]:
        return list(self._configs)

    def current(self) -> RemoteEndpoint | None:
        row = self.list.currentRow()
        return self._configs[row] if 0 <= row < len(self._configs) else None

    def _reload_list(self, row: int) -> None:
        self._loading = True
        self.list.clear()
        self.list.addItems([c.name for c in self._configs])
        self._loading = False
        if self._configs:
            self.list.setCurrentRow(max(0, min(row, len(self._configs) - 1)))
        else:
            self._show_row(-1)

    def _show_row(self, row: int) -> None:
        if self._loading:
            return
        config = self._configs[row] if 0 <= row < len(self._configs) else None
        self._loading = True
        self.form_box.setEnabled(config is not None)
        self.remove_button.setEnabled(config is not None)
        self.name_edit.setText(config.name if config else "")
        self.url_edit.setText(config.base_url if config else "")
        self.key_edit.setText(config.api_key if config else "")
        self.model_combo.clear()
        if config:
            models = list(config.models)
            if config.default_model and config.default_model not in models:
                models.insert(0, config.default_model)
            self.model_combo.addItems(models)
            self.model_combo.setCurrentText(config.default_model)
        self.status.setText("")
        self._loading = False

    def add_server(self, name: str = "", base_url: str = "http://127.0.0.1:8000/v1") -> None:
        taken = {c.name for c in self._configs}
        if not name:
            n = len(self._configs) + 1
            while f"Server {n}" in taken:
                n += 1
            name = f"Server {n}"
        elif name in taken:
            self._say(False, f"server name {name!r} is already used")
            return
        self._configs.append(RemoteEndpoint(name, base_url))
        self._save()
        self._reload_list(len(self._configs) - 1)
        self.name_edit.setFocus()

    def remove_current(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self._configs):
            del self._configs[row]
            self._save()
            self._reload_list(row)

    # -- form -------------------------------------------------------------------------------
    @Slot()
    def commit_form(self) -> None:
        """Write the form into the selected server and save (called as fields are left)."""
        config = self.current()
        if self._loading or config is None:
            return
        name = self.name_edit.text().strip()
        if not name:
            self._say(False, "server name: must not be empty")
            self.name_edit.setText(config.name)
            return
        if name != config.name and any(c.name == name for c in self._configs):
            self._say(False, f"server name {name!r} is already used")
            self.name_edit.setText(config.name)
            return
        url = self.url_edit.text().strip()
        updated = RemoteEndpoint(name, url, self.key_edit.text().strip(),
                               self.model_combo.currentText().strip(), list(config.models))
        if updated == config:
            return
        if url != config.base_url:
            updated.models = []  # another server: the old list says nothing about it
        self._configs[self.list.currentRow()] = updated
        if name != config.name:
            self.list.currentItem().setText(name)
        try:
            updated.check()
        except EngineError as exc:
            self._say(False, str(exc))
        self._save()

    def _save(self) -> None:
        self.servers.save(self._configs)
        self.endpointsChanged.emit()

    def _say(self, ok: bool, message: str) -> None:
        self.status.setStyleSheet("" if ok else "color: #b00020;")
        self.status.setText(message)

    # -- test connection ---------------------------------------------------------------------
    def test_connection(self) -> None:
        self.commit_form()
        config = self.current()
        if config is None:
            return
        try:
            config.check()
        except EngineError as exc:
            self._say(False, str(exc))
            self.testFinished.emit(False, str(exc))
            return
        self.test_button.setEnabled(False)
        self._say(True, f"Connecting to {parse_base_url(config.base_url).display}…")
        name, url, key = config.name, config.base_url, config.api_key or None
        self.jobs.run(lambda: fetch_models(url, key, timeout=TEST_TIMEOUT_S),
                      lambda result: self._test_done(name, result), self._test_failed)

    def _test_failed(self, error: str) -> None:
        self.test_button.setEnabled(True)
        message = f"Connection failed: {error}"
        self._say(False, message)
        self.testFinished.emit(False, message)

    def _test_done(self, name: str, result: Any) -> None:
        self.test_button.setEnabled(True)
        index = next((i for i, c in enumerate(self._configs) if c.name == name), None)
        models = [m.id for m in result]
        if index is not None:
            config = self._configs[index]
            config.models = models
            if not config.default_model and models:
                config.default_model = models[0]
            self._save()
            if index == self.list.currentRow():
                self._show_row(index)
        listed = ", ".join(models) if models else "none"
        message = f"Connected: {len(models)} model(s): {listed}"
        self._say(True, message)
        self.testFinished.emit(True, message)


class RemoteEndpointsDialog(QDialog):
    """The servers page as a dialog (Settings → Servers…)."""

    def __init__(self, settings: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Servers")
        self.widget = RemoteEndpointsWidget(settings, self)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        layout = QVBoxLayout(self)
        layout.addWidget(self.widget)
        layout.addWidget(buttons)
        self.resize(640, 360)

    def done(self, result: int) -> None:
        self.widget.commit_form()
        super().done(result)


class EngineChoiceCombo(QComboBox):
    """Per-chat model picker: "Local model", then each server's models ("model — server")."""

    choiceChanged = Signal(object)  # EngineChoice
    modelsRefreshed = Signal()

    def __init__(self, settings: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.servers = RemoteEndpointList(settings)
        self.jobs = Jobs(self)
        self._pending = 0
        self.errors: dict[str, str] = {}  # server name -> last refresh error
        # As wide as a short model name, not the longest "model — server" item (the model
        # bar's other lines need the room); the open list is as wide as its items.
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(10)
        self.currentIndexChanged.connect(self._emit_choice)
        self.reload()

    def choices(self) -> list[EngineChoice]:
        return [self.itemData(i) for i in range(self.count())
                if isinstance(self.itemData(i), EngineChoice)]

    def current_choice(self) -> EngineChoice:
        data = self.currentData()
        return data if isinstance(data, EngineChoice) else EngineChoice()

    def set_choice(self, choice: EngineChoice) -> bool:
        for i in range(self.count()):
            if self.itemData(i) == choice:
                self.setCurrentIndex(i)
                return True
        return False

    @Slot()
    def reload(self) -> None:
        """Rebuild the items from the saved servers, keeping the current choice if it stays."""
        keep = self.current_choice() if self.count() else EngineChoice()
        self.blockSignals(True)
        self.clear()
        self.addItem(LOCAL_LABEL, EngineChoice())
        for server in self.servers.load():
            models = list(server.models)
            if server.default_model and server.default_model not in models:
                models.insert(0, server.default_model)
            if models:
                self.insertSeparator(self.count())
            for model in models:
                self.addItem(f"{model} — {server.name}", EngineChoice(server.name, model))
                tip = f"{model} on {parse_base_url(server.base_url).display}" \
                    if url_ok(server.base_url) else model
                self.setItemData(self.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        if not self.set_choice(keep):
            self.setCurrentIndex(0)
        self.view().setMinimumWidth(self.view().sizeHintForColumn(0) + 24)
        self.blockSignals(False)
        if self.current_choice() != keep:  # the chosen server or model went away
            self._emit_choice()

    def refresh_models(self) -> None:
        """Ask every saved server for its models (off the GUI thread), then reload."""
        servers = [s for s in self.servers.load() if url_ok(s.base_url)]
        if not servers:
            self.modelsRefreshed.emit()
            return
        self._pending += len(servers)
        for server in servers:
            name, url, key = server.name, server.base_url, server.api_key or None
            self.jobs.run(lambda url=url, key=key: fetch_models(url, key, timeout=TEST_TIMEOUT_S),
                          lambda result, name=name: self._models_done(name, result),
                          lambda error, name=name: self._models_done(name, None, error))

    def _models_done(self, name: str, result: Any, error: str | None = None) -> None:
        if error is not None:
            self.errors[name] = error
        else:
            self.errors.pop(name, None)
            configs = self.servers.load()
            for config in configs:
                if config.name == name:
                    config.models = [m.id for m in result]
            self.servers.save(configs)
        self._pending -= 1
        if self._pending == 0:
            self.reload()
            self.modelsRefreshed.emit()

    def _emit_choice(self, *_args) -> None:
        self.choiceChanged.emit(self.current_choice())
