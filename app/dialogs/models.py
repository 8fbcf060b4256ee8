"""The model manager dialog: recommended models, hub search, files on this computer, and
the downloads with progress, speed, ETA, pause, resume and cancel.

All network work runs off the UI thread: hub calls as background jobs (app/jobs.py), the
downloads in the app's `Downloads` (app/downloads.py), which the window owns so that closing
this dialog leaves them running. `load_requested(model_path, mmproj_path)` asks the chat
window to load a model ('' when there is no projector): the Load buttons, or a double-click.

Every row says what the model can do in chips ("Can": vision / reasoning / tools / coding): a
catalogue entry from the catalogue's own fields, a file found on disk from what is read from it
off the UI thread (its tokenizer's chat format: [THINK] control tokens, [TOOL_CALLS]; the
projector paired with it), and coding where the file is a catalogue model's.

Every catalogue entry and local model says whether it fits this machine ("on the GPU", "partly
on the CPU", "too big"), planned off the UI thread by the engine's device planner
(engine/library/fit.py). With the app's settings the dialog remembers its tab and the import's
"copy" choice, and lists the model files loaded lately from outside the models folder.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, QUrl, Signal, Slot
from PySide6.QtGui import QColor, QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QDialog, QFileDialog, QHBoxLayout,
                               QHeaderView, QInputDialog, QLabel, QLineEdit, QMessageBox,
                               QProgressBar, QPushButton, QScrollArea, QSplitter, QStyledItemDelegate,
                               QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from ...engine.library.downloads import DownloadManager, DownloadRequest, DownloadState, DownloadStatus
from ...engine.api import EngineError
from ...engine.library.catalog import CAPABILITIES, CatalogEntry, load_catalog, resolve_catalog_entry
from ...engine.library.fit import (Fit, catalog_bytes, catalog_size_text, fit_of_catalog_entry,
                                  fit_of_file, machine_for, machine_for_a_switch, without_the_loaded_model)
from ...engine.library.hub import Hub, ModelChoice
from ...engine.library.models_folder import (LocalModel, catalog_files, delete_model, describe_model,
                                     import_model, scan_models)
from ...engine.library.sizes import size_text
from ...engine.mistral3.tokenizer import FileChatFormat, read_chat_format
from ...engine.runtime.device_map import UNKNOWN_RAM, Budget, Machine
from ..downloads import Downloads
from ..jobs import Jobs
from ..model_places import distinct_names, find_models, home_path, looked_in_words, shown_name, usual_places
from ..model_prompt import catalog_entry_for
from ..widgets.model_bar import quant_of
from ..config import AppSettings


def human_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s} s left"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s left"
    return f"{s // 3600} h {s % 3600 // 60:02d} min left"


def describe_progress(st: DownloadStatus) -> str:
    """'3.20 GB of 14.33 GB · 41.0 MB/s · 4 min 31 s left', or the state / error in words."""
    if st.state is DownloadState.FAILED:
        return st.error or "failed"
    if st.state is DownloadState.DONE:
        return f"ready · {size_text(st.total_bytes)} verified"
    if st.state is DownloadState.CANCELLED:
        return "cancelled"
    if st.state is DownloadState.VERIFYING:
        return "checking the sha256…"
    parts = [f"{size_text(st.done_bytes)} of {size_text(st.total_bytes)}"]
    if st.state is DownloadState.PAUSED:
        parts.append("paused")
    elif st.state is DownloadState.QUEUED:
        parts.append("waiting")
    elif st.speed_bps > 0:
        parts.append(f"{size_text(st.speed_bps)}/s")
        if st.eta_s is not None:
            parts.append(human_eta(st.eta_s))
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------
# one download row


class DownloadRow(QWidget):
    """One download: name, progress bar, pause/resume, cancel; "Load in chat" once its
    pair (model and projector) is verified."""

    load_requested = Signal(str, str)  # model path, projector path ('' if none)

    def __init__(self, request: DownloadRequest, manager: DownloadManager, parent=None):
        super().__init__(parent)
        self.request, self.key, self.manager = request, request.key, manager
        title = Path(request.filename).name
        self._load_paths = ("", "")
        self.state: DownloadState | None = None
        self.title = QLabel(title)
        self.title.setMinimumWidth(220)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(True)
        self.detail = QLabel("waiting")
        self.detail.setWordWrap(True)
        self.pause_button = QPushButton("Pause")
        self.cancel_button = QPushButton("Cancel")
        # Present from the start (hidden) so every row's bar has the same width.
        self.load_button = QPushButton("Load in chat")
        policy = self.load_button.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.load_button.setSizePolicy(policy)
        self.load_button.hide()
        self.load_button.clicked.connect(lambda: self.load_requested.emit(*self._load_paths))
        self.pause_button.clicked.connect(self._pause_or_resume)
        self.cancel_button.clicked.connect(lambda: self.manager.cancel(self.key))
        top = QHBoxLayout()
        top.addWidget(self.title, 2)
        top.addWidget(self.bar, 3)
        top.addWidget(self.pause_button)
        top.addWidget(self.cancel_button)
        top.addWidget(self.load_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.addLayout(top)
        layout.addWidget(self.detail)

    def offer_load(self, model: str, projector: str) -> None:
        self._load_paths = (model, projector)
        self.load_button.show()

    def _pause_or_resume(self) -> None:
        if self.state in (DownloadState.PAUSED, DownloadState.FAILED):
            self.manager.start(self.request)  # continues the part on disk
        else:
            self.manager.pause(self.key)

    def update_status(self, st: DownloadStatus) -> None:
        self.state = st.state
        frac = st.fraction
        self.bar.setValue(int(1000 * frac) if frac is not None else 0)
        self.bar.setFormat(f"{100 * frac:.1f} %" if frac is not None else "")
        self.detail.setText(describe_progress(st))
        failed = st.state is DownloadState.FAILED
        self.detail.setStyleSheet("color: #b00020;" if failed else "")
        # A failed download can be retried (after setting a token, freeing space...);
        # a network failure keeps its part, so the retry continues where it stopped.
        label = {DownloadState.PAUSED: "Resume", DownloadState.FAILED: "Retry"}.get(st.state,
                                                                                   "Pause")
        self.pause_button.setText(label)
        self.pause_button.setEnabled(not st.state.finished or failed)
        self.cancel_button.setEnabled(st.state not in (DownloadState.DONE,
                                                       DownloadState.CANCELLED))


# ---------------------------------------------------------------------------------------
# the dialog


def _item(text: str, data=None) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    it.setFlags(it.flags() & ~Qt.ItemIsEditable)
    if data is not None:
        it.setData(Qt.UserRole, data)
    return it


def _resolved(path: str | os.PathLike | None) -> Path | None:
    return Path(path).expanduser().resolve() if path else None


def _show_fit(cell: QTableWidgetItem, fit: Fit | None, unknown: str) -> None:
    """A "fits this machine" cell: the words, the plan's arithmetic as its tooltip."""
    cell.setText(fit.words if fit else "?")
    cell.setToolTip(fit.detail if fit else unknown)
    cell.setData(Qt.ForegroundRole, QColor("#b00020") if fit and fit.kind == "too_big" else None)


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setSelectionBehavior(QAbstractItemView.SelectRows)
    t.setSelectionMode(QAbstractItemView.SingleSelection)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    # One line per row; a long folder or file name loses its middle, not its end.
    t.setWordWrap(False)
    t.setTextElideMode(Qt.ElideMiddle)
    return t


CHIPS = ("vision", *CAPABILITIES)  # the "Can" column's chips, in this order


def catalog_chips(entry: CatalogEntry) -> list[str]:
    """A catalogue row's chips, from its own fields: vision (it has a projector), and its
    capabilities (reasoning, tools, coding)."""
    return [c for c in CHIPS if (entry.vision if c == "vision" else c in entry.capabilities)]


def file_chips(fmt: FileChatFormat | None, projector: Path | None, entry: CatalogEntry | None) -> tuple[list[str], str]:
    """(chips, their tooltip) of a model file found on disk, from what is read from the file: its
    chat format (`fmt`, None while unread or unreadable: [THINK] control tokens, a [TOOL_CALLS]
    token) and the projector paired with it; coding only where the file is a catalogue model's
    (nothing in a file says it was trained for code)."""
    have, why = set(), []
    if fmt is not None:
        why.append(f"Its tokenizer: Mistral chat format v{fmt.version}"
                   + (" with [THINK] / [/THINK] control tokens (it reasons before it answers)" if fmt.can_think else "")
                   + (", [TOOL_CALLS] (it calls tools)" if fmt.tool_calls else "") + ".")
        have |= {"reasoning"} if fmt.can_think else set()
        have |= {"tools"} if fmt.tool_calls else set()
    if projector is not None:
        have.add("vision")
        why.append(f"Vision: the projector {projector.name} is paired with it.")
    if entry is not None and "coding" in entry.capabilities:
        have.add("coding")
        why.append(f"Coding: it is the catalogue's {entry.name}.")
    return [c for c in CHIPS if c in have], "\n".join(why)


def read_file_format(path: Path) -> FileChatFormat | None:
    """The file's chat format (off the UI thread); None for a file whose tokenizer cannot tell."""
    from ...engine.gguf import open_gguf

    try:
        with open_gguf(path) as gf:
            return read_chat_format(gf.kv, str(path))
    except (EngineError, OSError):
        return None


def chips_cell(names: list[str], tip: str) -> QWidget:
    """A table cell of chips, one label each (the model bar's chip style)."""
    cell = QWidget()
    cell.setObjectName("chips")
    row = QHBoxLayout(cell)
    row.setContentsMargins(4, 0, 4, 0)
    row.setSpacing(3)
    for name in names:
        chip = QLabel(name)
        chip.setObjectName("quantChip")
        row.addWidget(chip)
    row.addStretch(1)
    cell.setToolTip(tip)
    return cell


def cell_chips(table: QTableWidget, row: int, column: int = 1) -> list[str]:
    """The chips shown in a cell (for a test, or a screen reader's text)."""
    cell = table.cellWidget(row, column)
    return [label.text() for label in cell.findChildren(QLabel)] if cell is not None else []


class KeepTheEnd(QStyledItemDelegate):
    """A column of folders cut at their start ('…/Jan/data/llamacpp/models'): the end of a path
    tells two folders apart, its middle ('opene…tures') nothing; the whole one is in the
    cell's tooltip."""

    def initStyleOption(self, option, index) -> None:  # noqa: N802 - Qt override
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideLeft


def describe_machine(machine: Machine, context: int = 0, in_use: bool = False) -> str:
    """What the "On this machine" column is planned for, in one line: the memory free once
    the loaded model is unloaded, and the context planned for (the one in use when a model
    is loaded, else Settings', else the loader's default)."""
    parts = []
    for d in machine.devices:
        name = f"{d.name} {d.description}" if d.kind == "cuda" else d.description or d.name
        parts.append(name if d.free_bytes >= UNKNOWN_RAM else f"{name}: {size_text(d.free_bytes)} free")
    which = " (the one in use)" if in_use else ""
    return (f"This machine: {' · '.join(parts)}. Planned for a {context or Budget().max_seq_len}-token "
            f"context{which}.")


class ModelManagerDialog(QDialog):
    load_requested = Signal(str, str)  # model path, projector path ('' if none)

    def __init__(self, models_dir: str | os.PathLike | None = None, hub: Hub | None = None,
                 downloads: Downloads | None = None,
                 catalog: list[CatalogEntry] | None = None, parent=None, *,
                 settings: AppSettings | None = None, loaded_model: str | None = None,
                 loaded_mmproj: str | None = None, machine: Machine | None = None, loaded_fit: Fit | None = None, freed_bytes: int = 0,
                 context_length: int = 0):
        """`downloads`: the app's (keeps running after the dialog closes); without one the
        dialog makes its own in `models_dir` with `hub`, paused when the dialog closes.
        `settings`: the app's (tab, copy choice, models loaded lately, device); `loaded_model`:
        the path of the model loaded now, marked in the lists, with `loaded_mmproj`, the
        projector it was loaded with (shown on its row, not the one paired by name); `loaded_fit` where it runs
        now and `freed_bytes` the RAM it holds (free once another model replaces it);
        `context_length`: the context to plan for (the one in use); `machine`: what to plan
        for (default: this machine, detected off the UI thread)."""
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(980, 680)
        self._own_downloads = downloads is None
        self.downloads = downloads or Downloads(models_dir, hub, parent=self)
        self.models_dir = self.downloads.models_dir
        self.hub = self.downloads.hub
        self.manager: DownloadManager = self.downloads.manager
        self.catalog = catalog if catalog is not None else load_catalog()
        self.jobs = Jobs(self)  # hub searches and listings: their results die with the dialog
        self._rows: dict[str, DownloadRow] = {}
        self.settings = settings
        self.loaded_model = _resolved(loaded_model)
        self.loaded_mmproj = Path(loaded_mmproj) if loaded_mmproj else None
        self.loaded_fit = loaded_fit
        self.freed_bytes = freed_bytes
        self.context_length = context_length
        self.machine = machine
        self.listed = self.downloads.catalog_sizes  # the hub's sizes, kept by the app's downloads
        self._recent: set[Path] = set()  # rows from settings.recent_models
        self._found: list[tuple[str, LocalModel, str]] = []  # (where, model, shown name) found elsewhere (model_places)
        self._found_in: dict[Path, str] = {}
        self._looked_elsewhere = False
        self._formats: dict[Path, FileChatFormat | None] = {}  # model files' chat formats, once read
        self._plans = 0  # planning jobs started: only the latest one's results are shown
        self.downloads.status_changed.connect(self._on_status)
        self.downloads.pair_ready.connect(self._on_pair_ready)
        self.downloads.started.connect(self._on_started)
        self.downloads.notice.connect(self.show_message)
        self._build()
        self._fill_and_restore(settings)

    def _build(self) -> None:
        """The tabs over the downloads, the machine line above, the message and folder below."""
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_catalog_tab(), "Recommended")
        self.tabs.addTab(self._build_search_tab(), "Search the hub")
        self.tabs.addTab(self._build_local_tab(), "On this computer")
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.tabs)
        split.addWidget(self._build_downloads_pane())
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)

        self.token_button = QPushButton("Hub token…")
        self.token_button.clicked.connect(self._ask_token)
        self.folder_label = QLabel(f"Models folder: {home_path(self.models_dir)}")
        self.folder_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        bottom = QHBoxLayout()
        bottom.addWidget(self.folder_label, 1)
        bottom.addWidget(self.token_button)
        layout = QVBoxLayout(self)
        if self.hub.offline:
            banner = QLabel("Offline mode: only files already on this computer are shown; "
                            "the hub is not contacted.")
            banner.setStyleSheet("background: #fff3cd; padding: 6px;")
            layout.addWidget(banner)
        self.machine_label = QLabel("Working out what this machine can run…")
        self.machine_label.setWordWrap(True)
        self.machine_label.setToolTip("Each model is placed by the same planner that loads it, from "
                                      "its size alone, before anything is loaded: layers on the GPU "
                                      "while they fit, the rest on the CPU.")
        layout.addWidget(self.machine_label)
        layout.addWidget(split, 1)
        layout.addWidget(self.message)
        layout.addLayout(bottom)

    def _build_downloads_pane(self) -> QWidget:
        self.downloads_box = QWidget()
        self.downloads_layout = QVBoxLayout(self.downloads_box)
        self.downloads_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.downloads_box)
        scroll.setMinimumHeight(120)
        downloads_pane = QWidget()
        dl = QVBoxLayout(downloads_pane)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(QLabel("<b>Downloads</b>"))
        dl.addWidget(scroll)
        return downloads_pane

    def _fill_and_restore(self, settings: AppSettings | None) -> None:
        """The lists filled, the tab and copy choice restored, offline mode's buttons off; then
        the user's later choices kept in `settings`."""
        self.refresh_local()
        self._show_downloads()
        self._refresh_catalog_status()
        if settings is not None:
            self.tabs.setCurrentIndex(min(settings.models_tab, self.tabs.count() - 1))
            self.local_copy.setChecked(settings.import_copy)
        if self.hub.offline:
            self.tabs.setCurrentIndex(2)
            for w in (self.search_button, self.search_edit, self.catalog_download,
                      self.repo_download, self.token_button):
                w.setEnabled(False)
        for button in self.findChildren(QPushButton):  # Enter in a table or field starts nothing
            button.setAutoDefault(False)
            button.setDefault(False)
        # A message (a hub error...) belongs to the tab it came from.
        self.tabs.currentChanged.connect(lambda _index: self.show_message(""))
        if settings is not None:  # connected last: the restore above is not a choice
            self.tabs.currentChanged.connect(lambda i: setattr(settings, "models_tab", i))
            self.local_copy.toggled.connect(lambda on: setattr(settings, "import_copy", on))
        self._list_unknown_sizes()

    # -- helpers --------------------------------------------------------------------------

    @Slot(str, bool)
    def show_message(self, text: str, error: bool = False) -> None:
        self.message.setText(text)
        self.message.setStyleSheet("color: #b00020;" if error else "")

    def run_in_background(self, fn: Callable[[], Any], on_done: Callable[[Any], None],
                          what: str) -> None:
        self.show_message(what)
        self.jobs.run(fn, on_done, lambda text: self.show_message(text, error=True))

    # -- recommended --------------------------------------------------------------------

    def _build_catalog_tab(self) -> QWidget:
        self.catalog_table = _table(["Model", "Can", "Quant", "Download", "On this machine", "License",
                                     "Status"])
        for entry in self.catalog:
            for v in entry.variants:
                r = self.catalog_table.rowCount()
                self.catalog_table.insertRow(r)
                name = entry.name + ("" if entry.vision else " (text only)")
                self.catalog_table.setItem(r, 0, _item(name, (entry, v.quant)))
                chips = catalog_chips(entry)
                self.catalog_table.setItem(r, 1, _item("", ", ".join(chips)))
                self.catalog_table.setCellWidget(r, 1, chips_cell(chips, "From the catalogue: " + (
                    ", ".join(chips) if chips else "a text model without tools")))
                self.catalog_table.setItem(r, 2, _item(v.quant))
                self.catalog_table.setItem(r, 3, _item(""))
                self.catalog_table.setItem(r, 4, _item(""))
                self.catalog_table.setItem(r, 5, _item(entry.license))
                self.catalog_table.setItem(r, 6, _item(""))
                self.catalog_table.item(r, 0).setToolTip(
                    f"{entry.repo_id}\n{entry.description}\n{entry.notes}".strip())
                self._show_catalog_size(r)
        self.catalog_download = QPushButton("Download")
        self.catalog_load = QPushButton("Load in chat")
        self.catalog_download.clicked.connect(self._download_catalog_row)
        self.catalog_load.clicked.connect(self._load_catalog_row)
        self.catalog_table.itemSelectionChanged.connect(self._refresh_catalog_status)
        self.catalog_table.cellDoubleClicked.connect(self._load_catalog_row)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.catalog_download)
        buttons.addWidget(self.catalog_load)
        w = QWidget()
        layout = QVBoxLayout(w)
        layout.addWidget(self.catalog_table)
        layout.addLayout(buttons)
        # Nothing chosen for the user: the first row is a 15 GB download, and Enter must not
        # start it (no default button either, see __init__).
        return w

    def catalog_bytes(self, entry: CatalogEntry, quant: str) -> tuple[int | None, int | None]:
        """(model, projector) sizes in bytes: the hub's once listed, else the catalogue's."""
        if (entry.id, quant) in self.listed:
            return self.listed[entry.id, quant]
        return catalog_bytes(entry, quant)

    def _show_catalog_size(self, row: int) -> None:
        entry, quant = self.catalog_table.item(row, 0).data(Qt.UserRole)
        model, mmproj = self.catalog_bytes(entry, quant)
        cell = self.catalog_table.item(row, 3)
        # Every vision row says "+ projector": with its size once known (a sum alone read
        # like a text-only model beside rows whose projector size is still open).
        cell.setText(f"{size_text(model)} + {size_text(mmproj)} projector" if model and mmproj
                     else catalog_size_text((model, mmproj)))
        if model is None:
            cell.setToolTip("The size is shown once the hub has been asked.")
        elif mmproj is None:
            cell.setToolTip("The projector's size is shown once the hub has been asked.")
        else:
            cell.setToolTip(f"model {size_text(model)}" + (f" + projector {size_text(mmproj)}"
                                                            if mmproj else ""))

    def _list_unknown_sizes(self) -> None:
        """Ask the hub (off the UI thread) for the sizes the catalogue leaves open."""
        if self.hub.offline:
            return
        for entry in self.catalog:
            for v in entry.variants:
                if None not in self.catalog_bytes(entry, v.quant):
                    continue
                self.jobs.run(lambda e=entry, q=v.quant: resolve_catalog_entry(self.hub, e, q),
                              lambda choice, q=v.quant: self._on_listed(choice, q),
                              lambda text, e=entry: self._on_listing_failed(e, text))

    def _on_listed(self, choice, quant: str) -> None:
        entry = choice.entry
        self.listed[entry.id, quant] = (choice.model.size,
                                        choice.mmproj.size if choice.mmproj else 0)
        for r in range(self.catalog_table.rowCount()):
            if self.catalog_table.item(r, 0).data(Qt.UserRole) == (entry, quant):
                self._show_catalog_size(r)
        self._plan()

    def _on_listing_failed(self, entry: CatalogEntry, text: str) -> None:
        for r in range(self.catalog_table.rowCount()):
            if self.catalog_table.item(r, 0).data(Qt.UserRole)[0] == entry:
                self.catalog_table.item(r, 3).setToolTip(f"The hub could not be asked: {text}")

    def _refresh_catalog_status(self) -> None:
        for r in range(self.catalog_table.rowCount()):
            entry, quant = self.catalog_table.item(r, 0).data(Qt.UserRole)
            model, mmproj = catalog_files(self.models_dir, entry, quant)
            busy = self.downloads.busy(entry.repo_id)
            if model and (mmproj or not entry.vision):
                status = "loaded" if _resolved(model) == self.loaded_model else "ready"
            elif busy:
                status = "downloading…"
            elif model:
                status = "projector missing"
            else:
                status = ""
            self.catalog_table.item(r, 6).setText(status)
        row = self.catalog_table.currentRow()
        ready = row >= 0 and self.catalog_table.item(row, 6).text() in ("ready", "loaded")
        self.catalog_load.setEnabled(ready)
        busy_row = row >= 0 and self.catalog_table.item(row, 6).text() == "downloading…"
        self.catalog_download.setEnabled(row >= 0 and not ready and not busy_row
                                         and not self.hub.offline)

    def _selected_catalog(self) -> tuple[CatalogEntry, str] | None:
        row = self.catalog_table.currentRow()
        return self.catalog_table.item(row, 0).data(Qt.UserRole) if row >= 0 else None

    def _download_catalog_row(self) -> None:
        sel = self._selected_catalog()
        if sel is None:
            return
        self.downloads.start_catalog_entry(*sel)

    def _load_catalog_row(self) -> None:
        sel = self._selected_catalog()
        if sel is None or not self.catalog_load.isEnabled():  # a double-click on a row not ready
            return
        model, mmproj = catalog_files(self.models_dir, *sel)
        if model is not None:
            self.load_requested.emit(str(model), str(mmproj) if mmproj else "")

    # -- search -------------------------------------------------------------------------

    def _build_search_tab(self) -> QWidget:
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search GGUF models, e.g. “Mistral Small 3.1”")
        self.search_button = QPushButton("Search")
        self.search_edit.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self.search)
        self.results_table = _table(["Repository", "Downloads", "Access"])
        self.results_table.itemSelectionChanged.connect(self._list_selected_repo)
        self.results_table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.files_table = _table(["Model file", "Quant", "Size with projector",
                                   "Vision projector"])
        self.files_table.itemSelectionChanged.connect(
            lambda: self.repo_download.setEnabled(self.files_table.currentRow() >= 0
                                                  and not self.hub.offline))
        self.with_projector = QCheckBox("Also download the vision projector")
        self.with_projector.setChecked(True)
        self.repo_download = QPushButton("Download")
        self.repo_download.setEnabled(False)
        self.repo_download.clicked.connect(self._download_selected_file)
        top = QHBoxLayout()
        top.addWidget(self.search_edit, 1)
        top.addWidget(self.search_button)
        split = QSplitter(Qt.Horizontal)
        split.addWidget(self.results_table)
        split.addWidget(self.files_table)
        split.setSizes([420, 520])
        buttons = QHBoxLayout()
        buttons.addWidget(self.with_projector)
        buttons.addStretch(1)
        buttons.addWidget(self.repo_download)
        w = QWidget()
        layout = QVBoxLayout(w)
        layout.addLayout(top)
        layout.addWidget(split, 1)
        layout.addLayout(buttons)
        return w

    def search(self) -> None:
        query = self.search_edit.text().strip()
        self.run_in_background(lambda: self.hub.search(query), self._show_results,
                               f"Searching the hub for “{query}”…")

    def _show_results(self, results) -> None:
        self.results_table.setRowCount(0)
        self.files_table.setRowCount(0)
        for r in results:
            row = self.results_table.rowCount()
            self.results_table.insertRow(row)
            self.results_table.setItem(row, 0, _item(r.repo_id, r.repo_id))
            self.results_table.setItem(row, 1, _item(f"{r.downloads or 0:,}"))
            self.results_table.setItem(row, 2, _item("gated: accept license on the hub"
                                                     if r.gated else "open"))
        self.show_message(f"{len(results)} GGUF repositories found." if results
                          else "No GGUF repositories match.")

    def _list_selected_repo(self) -> None:
        row = self.results_table.currentRow()
        if row < 0:
            return
        repo_id = self.results_table.item(row, 0).data(Qt.UserRole)
        self.files_table.setRowCount(0)
        self.run_in_background(lambda: self.hub.model_choices(repo_id), self._show_files,
                               f"Listing {repo_id}…")

    def _show_files(self, choices: list[ModelChoice]) -> None:
        self.files_table.setRowCount(0)
        for c in choices:
            row = self.files_table.rowCount()
            self.files_table.insertRow(row)
            self.files_table.setItem(row, 0, _item(c.model.path, c))
            self.files_table.setItem(row, 1, _item(c.model.quant or "?"))
            self.files_table.setItem(row, 2, _item(size_text(c.total_size or c.model.size)))
            self.files_table.setItem(row, 3, _item(
                f"{c.mmproj.path} ({size_text(c.mmproj.size)})" if c.mmproj else "none (text only)"))
        self.show_message(f"{len(choices)} model files." if choices
                          else "This repository has no GGUF model files.")

    def _download_selected_file(self) -> None:
        row = self.files_table.currentRow()
        if row < 0:
            return
        choice: ModelChoice = self.files_table.item(row, 0).data(Qt.UserRole)
        self.start_pair(choice.model, choice.mmproj if self.with_projector.isChecked() else None)

    # -- downloads ----------------------------------------------------------------------

    def start_pair(self, model, mmproj) -> None:
        """Download a model file and its projector (HubFile objects) together."""
        for r in self.downloads.start_pair(model, mmproj):
            self._ensure_row(r)
        self._refresh_catalog_status()

    def _ensure_row(self, req: DownloadRequest) -> DownloadRow:
        row = self._rows.get(req.key)
        if row is None:
            row = DownloadRow(req, self.manager)
            row.title.setToolTip(req.key)
            row.load_requested.connect(self.load_requested)
            self._rows[req.key] = row
            self.downloads_layout.insertWidget(self.downloads_layout.count() - 1, row)
        return row

    def _show_downloads(self) -> None:
        """On opening: the app's downloads as they stand (running ones included), then
        parts left by an earlier session, paused, ready to resume."""
        for st in self.downloads.statuses() + self.downloads.unfinished():
            self._ensure_row(st.request).update_status(st)
        for key, (model, proj) in self.downloads.ready.items():
            self._rows[key].offer_load(str(model), str(proj) if proj else "")

    @Slot(str)
    def _on_started(self, what: str) -> None:
        self.show_message(what)

    @Slot(object)
    def _on_status(self, st: DownloadStatus) -> None:
        row = self._ensure_row(st.request)
        row.update_status(st)
        if st.state is DownloadState.FAILED:
            self.show_message(st.error or "download failed", error=True)
        if st.state is DownloadState.DONE:
            self.refresh_local()
        if st.state.finished or st.state is DownloadState.PAUSED:
            self._refresh_catalog_status()

    @Slot(str, str, str)
    def _on_pair_ready(self, key: str, model: str, proj: str) -> None:
        self._ensure_row(self.downloads.pairs[key][0]).offer_load(model, proj)
        self.show_message(f"{Path(model).name} is ready.")

    # -- local files --------------------------------------------------------------------

    def _build_local_tab(self) -> QWidget:
        self.local_table = _table(["File", "Can", "Kind", "Architecture", "Quant", "Size",
                                   "On this machine", "Projector", "Folder"])
        self.folder_delegate = KeepTheEnd(self.local_table)
        self.local_table.setItemDelegateForColumn(8, self.folder_delegate)
        self.local_table.itemSelectionChanged.connect(self._local_selection_changed)
        self.local_table.cellDoubleClicked.connect(self._load_local)
        self.local_load = QPushButton("Load in chat")
        self.local_import = QPushButton("Import GGUF…")
        self.local_copy = QCheckBox("copy into the models folder")
        self.local_delete = QPushButton("Delete")
        self.local_open = QPushButton("Open folder")
        self.local_refresh = QPushButton("Refresh")
        self.local_load.clicked.connect(self._load_local)
        self.local_import.clicked.connect(self._import_dialog)
        self.local_delete.clicked.connect(self._delete_local)
        self.local_open.clicked.connect(self._open_folder)
        self.local_refresh.clicked.connect(self.look_again)
        buttons = QHBoxLayout()
        for b in (self.local_import, self.local_copy):
            buttons.addWidget(b)
        buttons.addStretch(1)
        for b in (self.local_refresh, self.local_open, self.local_delete, self.local_load):
            buttons.addWidget(b)
        # An empty list says where it looked (once the other apps' places have been read).
        self.local_empty = QLabel()
        self.local_empty.setWordWrap(True)
        self.local_empty.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.local_empty.hide()
        w = QWidget()
        layout = QVBoxLayout(w)
        layout.addWidget(self.local_table)
        layout.addWidget(self.local_empty)
        layout.addLayout(buttons)
        return w

    def look_again(self) -> None:
        """Refresh: the models folder and the other apps' places read again (a file downloaded
        or deleted since the dialog opened shows up or goes)."""
        self._looked_elsewhere = False
        self._found = []
        self._formats = {}  # a file replaced since is read again
        self.local_empty.hide()
        self.refresh_local()

    def refresh_local(self) -> None:
        """The models folder, imported files, and the files loaded lately from elsewhere."""
        self.local_models = scan_models(self.models_dir)
        listed = {m.path for m in self.local_models}
        self._recent = set()
        for path in map(Path, self.settings.recent_models if self.settings else []):
            resolved = _resolved(path)
            if resolved is not None and resolved not in listed and resolved.is_file():
                self.local_models.append(describe_model(resolved))
                listed.add(resolved)
                self._recent.add(resolved)
        shown = {}
        for what, m, name in self._found:  # elsewhere on this computer (looked for as a job)
            if m.path not in listed and m.path.is_file():
                self.local_models.append(m)
                listed.add(m.path)
                self._found_in[m.path] = what
                shown[m.path] = name
        t = self.local_table
        t.setRowCount(0)
        # two "model.gguf" (two Hugging Face snapshots) told apart by their folders, whole
        names = distinct_names([(shown.get(m.path, m.path.name), m.path) for m in self.local_models])
        for m, name in zip(self.local_models, names):
            row = t.rowCount()
            t.insertRow(row)
            loaded = m.path == self.loaded_model
            t.setItem(row, 0, _item(name + ("  (loaded)" if loaded else ""), m))
            t.setItem(row, 1, _item(""))
            t.setItem(row, 2, _item("projector" if m.is_projector else "model"))
            t.setItem(row, 3, _item(m.architecture or ("unreadable" if m.error else "?")))
            # The file's own name says Q4_K_M; the header's commonest type only Q4_K.
            t.setItem(row, 4, _item(quant_of(str(m.path)) or m.quant or "?"))
            t.setItem(row, 5, _item(size_text(m.size)))
            t.setItem(row, 6, _item(""))
            # The loaded model's row shows the projector in use (an f32 picked by hand, or none),
            # not the one its name pairs it with (the f16 beside it).
            mmproj = self.loaded_mmproj if loaded else m.mmproj
            t.setItem(row, 7, _item(mmproj.name if mmproj else "none (text only)" if loaded and m.mmproj else ""))
            t.item(row, 7).setToolTip(f"In use: {mmproj}" if loaded and mmproj else str(mmproj or ""))
            self._show_chips(row, m, mmproj)
            how = ("opened from: " if m.path in self._recent
                   else f"found in {self._found_in[m.path]}: " if m.path in self._found_in
                   else "imported in place: " if m.imported_in_place else "")
            t.setItem(row, 8, _item(how + str(m.folder)))  # a long one loses its start (KeepTheEnd)
            t.item(row, 8).setToolTip(how + str(m.path))
            if m.error:
                t.item(row, 0).setToolTip(m.error)
            if loaded:
                bold = t.item(row, 0).font()
                bold.setBold(True)
                t.item(row, 0).setFont(bold)
        self._local_selection_changed()
        self._plan()
        self._read_formats()
        if not self._looked_elsewhere:
            self._looked_elsewhere = True
            skip = set(listed)
            # Listed by the name people know: a cache's link, not the blob it points to.
            self.jobs.run(lambda: [(what, replace(describe_model(path), path=path), shown_name(path))
                                   for what, path in find_models(usual_places(), skip)],
                          self._on_found_elsewhere)

    def _show_chips(self, row: int, m: LocalModel, mmproj: Path | None) -> None:
        """A model file's chips (file_chips): what its header says once read, the projector its
        row shows (for the loaded model, the one in use)."""
        if m.is_projector or m.error is not None:
            return
        fmt = self._formats.get(m.path)
        chips, tip = file_chips(fmt, mmproj, catalog_entry_for(m.path, self.catalog))
        if m.path not in self._formats:
            tip = "\n".join(filter(None, ["Reading the file's tokenizer…", tip]))
        elif fmt is None:
            tip = "\n".join(filter(None, ["Its tokenizer does not say which Mistral chat format it has.", tip]))
        self.local_table.item(row, 1).setData(Qt.UserRole, ", ".join(chips))
        self.local_table.setCellWidget(row, 1, chips_cell(chips, tip))

    def _read_formats(self) -> None:
        """The chat formats of the model files not read yet, read off the UI thread (their
        tokenizer's control tokens and template), then their chips shown."""
        todo = [m.path for m in self.local_models
                if not m.is_projector and m.error is None and m.path not in self._formats]
        if todo:
            self.jobs.run(lambda: {path: read_file_format(path) for path in todo}, self._on_formats)

    def _on_formats(self, found: dict) -> None:
        self._formats.update(found)
        for row in range(self.local_table.rowCount()):
            m = self.local_table.item(row, 0).data(Qt.UserRole)
            if m.path in found:
                loaded = m.path == self.loaded_model
                self._show_chips(row, m, self.loaded_mmproj if loaded else m.mmproj)

    def _on_found_elsewhere(self, found: list) -> None:
        """Models already on this computer (Downloads, other apps' folders): listed too."""
        self._found = found
        if found:
            self.refresh_local()
        self.local_empty.setText(looked_in_words(Path(self.models_dir) if self.models_dir else None, usual_places()))
        self.local_empty.setVisible(not self.local_models)

    def set_loaded_model(self, path: str | None, mmproj: str | None = None) -> None:
        """Mark another model as the loaded one (or none), loaded with `mmproj` (or none)."""
        self.loaded_model = _resolved(path)
        self.loaded_mmproj = Path(mmproj) if mmproj else None
        self.refresh_local()
        self._refresh_catalog_status()

    # -- fits this machine ----------------------------------------------------------------

    def _plan(self) -> None:
        """Plan every catalogue entry and local model off the UI thread (headers only, and
        the machine detected once); the results fill the "On this machine" columns."""
        device = self.settings.device if self.settings else "auto"
        catalog = []
        for r in range(self.catalog_table.rowCount()):
            entry, quant = self.catalog_table.item(r, 0).data(Qt.UserRole)
            catalog.append((entry, quant, self.catalog_bytes(entry, quant),
                            catalog_files(self.models_dir, entry, quant)))
        local = [(m.path, m.mmproj) for m in self.local_models
                 if not m.is_projector and m.error is None]
        known = self.machine
        self._plans += 1
        generation = self._plans
        loaded, loaded_fit, freed = self.loaded_model, self.loaded_fit, self.freed_bytes
        budget = Budget(max_seq_len=self.context_length) if self.context_length > 0 else None
        # the draft model a load would take beside the model (Settings): planned with it
        draft = self.settings.draft_to_load if self.settings else ""
        draft = draft if draft and os.path.isfile(draft) else None

        def fit_or_running(path, fit_of):
            # The model running now is judged by where it runs, not planned against the memory
            # it takes itself.
            if loaded_fit is not None and path is not None and _resolved(path) == loaded:
                return loaded_fit
            return fit_of()

        def plan() -> tuple[int, Machine, dict]:
            detected = known or machine_for_a_switch()  # kept as detected: re-plans add `freed` once
            machine = machine_for(without_the_loaded_model(detected, freed), device)
            fits: dict[tuple, Fit | None] = {}  # ("catalog", id, quant) / ("local", path) -> fit
            for entry, quant, sizes, files in catalog:
                fits["catalog", entry.id, quant] = fit_or_running(files[0], lambda: fit_of_catalog_entry(
                    entry, sizes, files, machine, device, budget))
            for path, proj in local:
                fits[("local", path)] = fit_or_running(path, lambda: fit_of_file(path, proj, machine, device, budget, draft))
            return generation, detected, fits

        self.jobs.run(plan, self._show_fits, lambda text: self.show_message(
            f"Could not work out where models would run: {text}", error=True))

    def _show_fits(self, outcome: tuple[int, Machine, dict]) -> None:
        generation, self.machine, fits = outcome
        if generation != self._plans:  # a later plan (more sizes known) is on its way
            return
        device = self.settings.device if self.settings else "auto"
        self.machine_label.setText(describe_machine(
            machine_for(without_the_loaded_model(self.machine, self.freed_bytes), device),
            self.context_length, in_use=self.loaded_fit is not None))
        for r in range(self.catalog_table.rowCount()):
            entry, quant = self.catalog_table.item(r, 0).data(Qt.UserRole)
            if ("catalog", entry.id, quant) in fits:
                _show_fit(self.catalog_table.item(r, 4), fits["catalog", entry.id, quant],
                          "Not known yet: the size of this model is not known until the hub is asked.")
        for r in range(self.local_table.rowCount()):
            m = self.local_table.item(r, 0).data(Qt.UserRole)
            if ("local", m.path) in fits:
                _show_fit(self.local_table.item(r, 6), fits["local", m.path],
                          "Not a Mistral 3 model this app runs: loading it says why.")

    def _selected_local(self) -> LocalModel | None:
        row = self.local_table.currentRow()
        return self.local_table.item(row, 0).data(Qt.UserRole) if row >= 0 else None

    def _local_selection_changed(self) -> None:
        m = self._selected_local()
        self.local_load.setEnabled(m is not None and not m.is_projector and m.error is None)
        for b in (self.local_delete, self.local_open):
            b.setEnabled(m is not None)

    def _load_local(self) -> None:
        m = self._selected_local()
        if m is not None and self.local_load.isEnabled():  # not on a projector or a broken file
            self.load_requested.emit(str(m.path), str(m.mmproj) if m.mmproj else "")

    def import_file(self, path: str, copy: bool) -> None:
        try:
            m = import_model(path, self.models_dir, copy=copy)
        except Exception as exc:  # noqa: BLE001 - LocalModelError and OSError, in words
            self.show_message(str(exc), error=True)
            return
        self.refresh_local()
        self.show_message(f"Imported {m.path.name} ({m.architecture}, {m.quant}).")

    def _import_dialog(self) -> None:
        # Where Open… was last (kept per kind of file), like Open… itself.
        start = (self.settings.last_folder("models") if self.settings else "") or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF model", start, "GGUF models (*.gguf)")
        if path:
            if self.settings:
                self.settings.remember_folder("models", path)
            self.import_file(path, self.local_copy.isChecked())

    def _delete_local(self) -> None:
        m = self._selected_local()
        if m is None:
            return
        what = ("forget this imported file (it stays on disk)" if m.imported_in_place
                else f"delete {m.path.name} ({size_text(m.size)})")
        if QMessageBox.question(self, "Delete model", f"Really {what}?") != QMessageBox.Yes:
            return
        self.delete_file(m.path)

    def delete_file(self, path: Path) -> None:
        """Delete a file of the models folder, or forget an imported or lately opened one."""
        if self.settings is not None and _resolved(path) in self._recent:
            self.settings.recent_models = [p for p in self.settings.recent_models
                                           if _resolved(p) != _resolved(path)]
            self.show_message(f"{path}: removed from the list (the file itself was left where it is)")
            self.refresh_local()
            return
        try:
            self.show_message(delete_model(path, self.models_dir))
        except Exception as exc:  # noqa: BLE001
            self.show_message(str(exc), error=True)
        self.refresh_local()
        self._refresh_catalog_status()

    def _open_folder(self) -> None:
        m = self._selected_local()
        folder = m.folder if m else self.models_dir
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    # -- settings -----------------------------------------------------------------------

    def _ask_token(self) -> None:
        token, ok = QInputDialog.getText(
            self, "Hub token", "Access token for gated models (create one in your hub "
            "account settings, after accepting the model's license):", QLineEdit.Password)
        if ok:
            self.hub.token = token.strip() or None
            self.show_message("Token set for this session." if token.strip()
                              else "Token cleared.")

    def _on_close(self) -> None:
        # Downloads the dialog made itself die with it: pause them (the parts resume next
        # time). The app's downloads keep going.
        if self._own_downloads:
            self.downloads.shutdown()

    def closeEvent(self, event) -> None:
        self._on_close()
        super().closeEvent(event)

    def done(self, result: int) -> None:  # Esc / reject / accept hide without closeEvent
        self._on_close()
        super().done(result)
