"""The main window: chat list | model bar, conversation, composer; its menus and dialogs.

What happens to the chats (send, stop, regenerate, edit, CRUD) is `ChatSession`'s; the window
shows it and turns clicks into its calls. Models are loaded by the engine worker.
"""
from __future__ import annotations


import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QByteArray, QEvent, QModelIndex, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QActionGroup, QFont, QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (QApplication, QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout,
                               QInputDialog, QLabel, QLineEdit, QListView, QMainWindow, QMenu, QMessageBox,
                               QPlainTextEdit, QPushButton, QSizePolicy, QSplitter, QStackedWidget, QToolButton,
                               QVBoxLayout, QWidget)

from .chat_session import ChatSession
from .jobs import Jobs
from .model_files import why_not_a_model
from .single_instance import InstanceServer
from .tools import REMOTE_TIP, ToolBroker, chat_tools_on, set_chat_tools
from .dialogs.servers import EngineChoiceCombo, ServersDialog
from .config import AppSettings
from .dialogs.settings import SettingsDialog
from ..engine.runtime.threads import apply_threads
from .servers import EngineChoice, ServerList, engine_for_choice
from .store import Store, StoreError
from .widgets import markdown
from .widgets.chat_list import ChatListDelegate, ChatListModel
from .widgets.chat_view import ChatView, context_used
from .widgets.composer import Composer
from .widgets.elided_label import ElidedLabel
from .widgets.empty_state import EmptyState
from .widgets.icons import icon
from .widgets.model_bar import NO_VISION_HINT, ModelBar, device_line, device_tip, escape
from .widgets.theme import is_dark, style_sheet
from .serving import ServerStatusLabel, WindowServer
from .engine_info import EngineInfo
from .worker import KV_CACHE_FOLDER, EngineWorker, can_grow_context, memory_words

log = logging.getLogger(__name__)

GGUF_FILTER = "GGUF models (*.gguf)"
MEMORY_REFRESH_MS = 2000
UNDO_DELETE_MS = 10_000


def running_fit(info: EngineInfo | None):
    """Where the loaded model runs, said like the Models dialog's plans (None: no local model)."""
    if info is None:
        return None
    from ..engine.library.fit import Fit

    kind = "partial" if info.split else "cpu" if info.device == "cpu" else "gpu"
    return Fit(kind, f"Loaded now: {device_line(info)}")


def local_models(models_dir: str | None) -> list[tuple[str, str]]:
    """(model, projector) of the loadable models in the models folder (runs as a job)."""
    from ..engine.library.local import scan_models

    return [(str(m.path), str(m.mmproj or "")) for m in scan_models(models_dir)
            if not m.is_projector and m.error is None]


class MainWindow(QMainWindow):
    """The app window. `store` may be given (tests, main()); else the data dir's store is
    opened and closed with the window."""

    replyFinished = Signal(int)  # message id, after the store has the final text
    replyFailed = Signal(str)
    modelLoaded = Signal(object)  # EngineInfo

    def __init__(self, store: Store | None = None, *, data_dir: str | Path | None = None,
                 autoload: bool = True):
        super().__init__()
        self._own_store = store is None
        self.downloads = None  # the app's Downloads, made when the Models dialog first opens
        self.store = store if store is not None else Store(data_dir)
        self.settings = AppSettings(self.store)
        self.setWindowTitle("Tramontane")
        self.dark = is_dark()
        self._load_errors: set[str] = set()  # load failures shown as chat notices
        self._draft_shown = False  # the composer holds the current chat's draft
        self._wait_note = ""  # the composer's "another chat is writing" line, while true
        self.jobs = Jobs(self)
        self.checking_model: str | None = None  # a picked file whose header a job is reading
        self._local_found: list[tuple[str, str]] | None = None  # models found on this computer
        self._scanning = False

        self.worker = EngineWorker(kv_disk_dir=self.store.data_dir / KV_CACHE_FOLDER)
        self.worker.loadProgress.connect(self._on_load_progress)
        self.worker.warmedUp.connect(self._on_warmed_up)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.loadFailed.connect(self._on_load_failed)
        self.worker.unloaded.connect(self._on_unloaded)
        self.session = ChatSession(self.store, self.settings, self.worker, self)
        self.session.changed.connect(self._on_chat_changed)
        self.session.listChanged.connect(self._on_list_changed)
        self.session.streamed.connect(self._on_streamed)
        self.session.busyChanged.connect(self._on_busy_changed)
        self.session.unsent.connect(self._on_unsent)
        self.session.storeFailed.connect(self._show_status)
        self.session.replyFinished.connect(self.replyFinished)
        self.session.replyFailed.connect(self.replyFailed)
        # MCP tool servers (Settings → Tools); a chat with tools on runs its tool loop on the worker
        self.tools = ToolBroker(self.store, self)
        self.session.tools = self.tools
        self.tools.cardChanged.connect(self._on_chat_changed)
        self.tools.serverFailed.connect(self._tool_server_failed)
        self._new_chat_tools = False  # the switch's state for the chat not saved yet
        self.worker.start()
        self._shown_once = False
        self._warming = 2  # the engine's imports and the lexers', after the window shows
        self._autoload = autoload
        # A second launch on this data dir asks us to come to the front (see main.run_app).
        self.instance_server = InstanceServer(self.store.data_dir, self)
        self.instance_server.raiseRequested.connect(self.bring_to_front)

        self._build()
        self._build_menus()
        # Settings' API server switch: other programs share this worker's engine and KV caches.
        self.api_server = WindowServer(self.worker)
        self.statusBar().addPermanentWidget(ServerStatusLabel(self.api_server))
        self.api_server.apply(self.settings.serve, self.settings.serve_port)
        if self.settings.cpu_threads:  # auto needs nothing: the kernels start with the default
            apply_threads(self.settings.cpu_threads)
        self.setAcceptDrops(True)
        self.setStyleSheet(style_sheet(self.dark))
        self._apply_font_size(self.settings.font_size)
        geometry = self.settings.geometry
        if geometry:
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))
        else:
            self.resize(1100, 760)

        if self.theme != "system":  # the light/dark chosen in View → Theme last time
            self.set_theme(self.theme)
        self.chat_model.refresh()
        last = self.settings.last_chat_id
        self.open_chat(last if self.chat_model.row_of(last) >= 0 else None)
        self._update_model_state()

    firstShown = Signal()  # the window is on screen (the first turn of the event loop after show)

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            QTimer.singleShot(0, self._first_turn)

    def _first_turn(self) -> None:
        """Once the window is on screen: the engine (torch...) is imported on the worker and
        the last model loads behind it, so the window never waits for them."""
        self.firstShown.emit()
        self.worker.warm_up()
        # A chat bound to a server has asked for it already (open_chat): the last local model
        # would take its place and answer its next message.
        if self._autoload and self._chosen().is_local and self.engine_info is None and not self.loading:
            self.load_last_model()
        # the first code block's lexer, off the UI thread
        self.jobs.run(markdown.warm_up, self._warmed, lambda _error: self._warmed())

    def _refresh_memory(self) -> None:
        info = self.engine_info
        if info is None or info.remote:
            return
        memory = memory_words(info.device)
        if memory and memory != info.memory:
            self.session.engine_info = info = replace(info, memory=memory)
            self.model_bar.device_label.setText(device_line(info))
            self.model_bar.device_label.setToolTip(device_tip(info))

    @property
    def warmed_up(self) -> bool:
        """The start-up imports (the engine on the worker, the lexers) are done."""
        return self._warming == 0

    def _warmed(self, _result=None) -> None:
        self._warming -= 1

    @Slot(float)
    def _on_warmed_up(self, seconds: float) -> None:
        """The engine is imported: say it when the native CPU kernels are missing (replies on
        the CPU then run on torch's much slower path), not silently."""
        self._warmed()
        log.info("engine imported on the worker in %.2f s", seconds)
        from ..kernels import cpu_native

        if not cpu_native.AVAILABLE:
            text = f"The native CPU kernels are not built, so CPU replies are slow: {cpu_native.NO_KERNELS_FIX}."
            log.warning("%s (%s)", text, cpu_native.IMPORT_ERROR)
            self.status_label.setText(text)

    # The chat state lives in the session; these read it where the window is asked.
    @property
    def current_chat_id(self) -> int | None:
        return self.session.current_chat_id

    @property
    def pending(self):
        return self.session.pending

    @property
    def engine_info(self) -> EngineInfo | None:
        return self.session.engine_info

    @property
    def loading(self) -> str | None:
        return self.session.loading

    @property
    def notices(self) -> dict:
        return self.session.notices

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search chats")
        self.search.textChanged.connect(self._search_changed)
        self.chat_model = ChatListModel(self.store, self)
        self.chat_list = QListView()
        self.chat_list.setModel(self.chat_model)
        self.chat_list.setAccessibleName("Chats")
        self.chat_list.setObjectName("chatList")
        self.chat_list.setItemDelegate(ChatListDelegate(self.chat_list))  # Today / Yesterday... headings
        self.chat_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.chat_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.chat_list.selectionModel().currentChanged.connect(self._chat_selected)
        self.chat_list.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        buttons = QHBoxLayout()
        self.new_button = self._tool("New chat", "New chat (Ctrl+N)", self.new_chat)
        self.new_button.setIcon(icon("new-chat"))
        self.new_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.new_button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.rename_button = self._tool("Rename", "Rename the chat (F2)", self.rename_selected)
        self.branch_button = self._tool("Branch", "Copy the chat into a new one", self.branch_selected)
        self.delete_button = self._tool("Delete", "Delete the chat (Del)", self.delete_selected)
        for b in (self.rename_button, self.branch_button, self.delete_button):
            b.setAutoRaise(True)
            buttons.addWidget(b)
        buttons.addStretch(1)
        sidebar = QWidget()
        sidebar.setObjectName("sidebar")
        sidebar.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        side = QVBoxLayout(sidebar)
        side.setContentsMargins(8, 8, 8, 6)
        side.addWidget(self.new_button)
        side.addWidget(self.search)
        side.addWidget(self.chat_list, 1)
        side.addLayout(buttons)

        self.model_bar = ModelBar()
        self.model_bar.models_button.clicked.connect(self.open_model_manager)
        self.model_bar.open_button.clicked.connect(self.open_model_file)
        self.model_bar.unload_button.clicked.connect(self.unload_model)
        self._add_server_picker()

        self.chat_title = ElidedLabel()
        self.chat_title.setAccessibleName("Chat title")
        self.system_button = self._tool("System prompt…", "This chat's system prompt", self.edit_system_prompt)
        header = QHBoxLayout()
        header.setContentsMargins(12, 2, 12, 2)
        self.tools_button = self._tool("Tools", "", self._toggle_chat_tools)
        self.tools_button.setCheckable(True)
        header.addWidget(self.chat_title, 1)
        header.addWidget(self.tools_button)
        header.addWidget(self.system_button)

        self.view = ChatView()
        self.view.editSubmitted.connect(self.edit_and_resend)
        self.view.regenerateRequested.connect(self.regenerate)
        self.view.branchRequested.connect(self.branch_at)
        self.view.versionRequested.connect(self.session.show_version)
        self.session.promptRead.connect(self.view.show_prompt_progress)
        self.view.tool_waiting = self.tools.waiting
        self.view.toolDecided.connect(self.tools.answer)
        self.empty = EmptyState()
        self.empty.recommended_button.clicked.connect(lambda: self.open_model_manager(tab=0))
        self.empty.open_button.clicked.connect(self.open_model_file)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.view)

        self.drop_overlay = QLabel("Drop images here to attach them to your message")
        self.drop_overlay.setObjectName("dropOverlay")
        self.drop_overlay.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.drop_overlay.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.drop_overlay.hide()
        self.composer = Composer()
        self.composer.start_folder = self.last_folder("images")
        self.composer.folderUsed.connect(lambda folder: self.remember_folder("images", folder))
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(self.stop)
        self.composer.regenerateRequested.connect(lambda: self.regenerate(None))

        right = QWidget()
        right.setObjectName("conversationPane")  # bar, conversation and composer on one background
        right.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        main = QVBoxLayout(right)
        main.setContentsMargins(0, 0, 0, 0)
        main.setSpacing(0)
        main.addWidget(self.model_bar)
        main.addLayout(header)
        main.addWidget(self.stack, 1)
        main.addWidget(self.composer)
        self.drop_overlay.setParent(right)  # over the conversation, outside the layout

        split = QSplitter()
        split.addWidget(sidebar)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([240, 860])
        self.setCentralWidget(split)
        self.status_label = QLabel()
        self.statusBar().addWidget(self.status_label, 1)
        self.reload_button = QPushButton("Reload to apply")
        self.reload_button.setToolTip("Load the model again with the new context length, device "
                                      "or GPU layers from Settings")
        self.reload_button.clicked.connect(self.reload_model)
        self.reload_button.hide()
        self.statusBar().addPermanentWidget(self.reload_button)
        self._doomed: int | None = None  # a deleted chat that Undo can still bring back
        self.undo_button = QPushButton("Undo")
        self.undo_button.setToolTip("Bring the deleted chat back")
        self.undo_button.clicked.connect(self.undo_delete)
        self.undo_button.hide()
        self.statusBar().addPermanentWidget(self.undo_button)
        self.undo_timer = QTimer(self)
        self.undo_timer.setSingleShot(True)
        self.undo_timer.setInterval(UNDO_DELETE_MS)
        self.undo_timer.timeout.connect(self.commit_deletes)
        # The model bar's memory figure follows the process (it grows as pages are touched).
        self.memory_timer = QTimer(self)
        self.memory_timer.setInterval(MEMORY_REFRESH_MS)
        self.memory_timer.timeout.connect(self._refresh_memory)
        self.memory_timer.start()
        self.composer.edit.setFocus()

    def _tool(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.clicked.connect(slot)
        return b

    def _add_server_picker(self) -> None:
        combo = EngineChoiceCombo(self.store)
        combo.setToolTip("Run on the local model or on a model of a configured server")
        combo.setAccessibleName("Model source")
        combo.choiceChanged.connect(self._model_choice_changed)
        self.model_bar.model_combo = combo
        self.model_bar.buttons.insertWidget(0, combo)

    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcut=None, tip=""):
            a = QAction(text, self)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            a.setStatusTip(tip)
            a.triggered.connect(slot)
            menu.addAction(a)
            return a

        chat = self.menuBar().addMenu("&Chat")
        action(chat, "&New chat", self.new_chat, "Ctrl+N")
        action(chat, "&Search chats", self._focus_search, "Ctrl+F")
        action(chat, "Write a &message", lambda: self.composer.edit.setFocus(), "Ctrl+L")
        self.rename_action = action(chat, "&Rename…", self.rename_selected, "F2")
        self.branch_action = action(chat, "&Branch", self.branch_selected)
        self.delete_action = action(chat, "&Delete…", self.delete_selected)
        self.pin_action = action(chat, "&Pin", self.toggle_pin_selected)
        chat.addSeparator()
        self.export_action = action(chat, "&Export…", self.export_selected, tip="Save the chat as JSON (re-importable) "
               "or Markdown")
        action(chat, "&Import…", self.import_selected)
        chat.addSeparator()
        self.regenerate_action = action(chat, "Regenerate the last reply", lambda: self.regenerate(None),
                                        "Ctrl+R")
        # Enabled only while a reply is written, so Esc stays free for dialogs and editors.
        self.stop_action = action(chat, "&Stop the reply", self.stop, "Esc")
        self.stop_action.setEnabled(False)
        chat.addSeparator()
        action(chat, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        for a in (self.rename_action, self.pin_action, self.branch_action, self.export_action,
                  self.delete_action):
            self.chat_list.addAction(a)
        # Del deletes in the list only (in the message box it deletes text). A QShortcut, not
        # an action: the list's context menu shows its actions, and this one has no label.
        delete_key = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.chat_list)
        delete_key.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete_key.activated.connect(self.delete_selected)

        model = self.menuBar().addMenu("&Model")
        action(model, "&Models…", lambda: self.open_model_manager(), "Ctrl+M")
        action(model, "&Open GGUF file…", self.open_model_file, "Ctrl+O")
        self.unload_action = action(model, "&Unload", self.unload_model)
        self.unload_action.setEnabled(False)

        view = self.menuBar().addMenu("&View")
        action(view, "Zoom &in", lambda: self.zoom(+1), QKeySequence.StandardKey.ZoomIn)
        action(view, "Zoom &out", lambda: self.zoom(-1), QKeySequence.StandardKey.ZoomOut)
        action(view, "&Reset zoom", lambda: self.zoom(0), "Ctrl+0")

        theme = view.addMenu("&Theme")
        self.theme_actions = {}
        themes = QActionGroup(self)  # one of them: radio items
        themes.setExclusive(True)
        for key, text in (("system", "&System"), ("light", "&Light"), ("dark", "&Dark")):
            a = action(theme, text, lambda _=False, k=key: self.set_theme(k))
            a.setCheckable(True)
            themes.addAction(a)
            self.theme_actions[key] = a
        self.theme_actions[self.theme].setChecked(True)

        settings = self.menuBar().addMenu("&Settings")
        action(settings, "&Settings…", self.open_settings, "Ctrl+,")
        action(settings, "S&ervers…", self.open_servers)
        action(settings, "&Tools…", self.open_tools)

        help_menu = self.menuBar().addMenu("&Help")
        action(help_menu, "&Keyboard shortcuts", self.show_shortcuts, "F1")
        action(help_menu, "&About Tramontane", self.show_about)

    # ------------------------------------------------------------------ help
    def show_shortcuts(self):
        from .dialogs.help import show_shortcuts

        actions = [a for menu in self.menuBar().findChildren(QMenu) for a in menu.actions()]
        self.help_dialog = show_shortcuts(self, actions)
        return self.help_dialog

    def show_about(self):
        from ..engine.library.local import default_models_dir
        from .dialogs.help import show_about

        info = self.engine_info
        self.help_dialog = show_about(
            self, data_dir=str(self.store.data_dir), models_dir=self.settings.models_dir or str(default_models_dir()),
            model=info.model_path if info else "", projector=info.mmproj_path if info else "")
        return self.help_dialog

    # ------------------------------------------------------------------ folders
    # File dialogs start where the user last was, per kind of file (models, images, chats).
    def last_folder(self, kind: str) -> str:
        return self.settings.last_folder(kind)

    def remember_folder(self, kind: str, path: str) -> None:
        try:
            self.settings.remember_folder(kind, path)
        except StoreError as exc:
            self.status_label.setText(str(exc))

    # ------------------------------------------------------------------ theme and fonts
    @property
    def theme(self) -> str:
        """'system' (follow the desktop), 'light' or 'dark', as chosen in View → Theme."""
        value = self.store.get_setting("theme", "system")
        return value if value in ("system", "light", "dark") else "system"

    def set_theme(self, theme: str) -> None:
        from .widgets.theme import apply_color_scheme

        self.store.set_setting("theme", theme)
        for key, a in self.theme_actions.items():
            a.setChecked(key == theme)
        app = QApplication.instance()
        app.setProperty("tramontane-theme", theme)  # theme.follow_system_scheme reads it
        apply_color_scheme(app, dark=None if theme == "system" else theme == "dark")

    def changeEvent(self, event) -> None:  # noqa: N802
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            dark = is_dark(self.palette())
            if dark != self.dark:
                self.dark = dark
                # Every message is drawn anew in the new colours. The old ones go first, a few
                # at a time: restyling a window that holds a long chat would stall the UI.
                self.view.clear()
                self.view.after_trash(lambda: self._apply_scheme(dark))
        super().changeEvent(event)

    def _apply_scheme(self, dark: bool) -> None:
        if dark != self.dark:
            return  # switched back meanwhile: that switch applies
        self.setStyleSheet(style_sheet(dark))
        self.new_button.setIcon(icon("new-chat"))
        self.view.dark = dark
        self.refresh_view()

    def _apply_font_size(self, size: int) -> None:
        font = QFont(QApplication.font())
        if size:
            font.setPointSize(size)
        for w in (self.view, self.composer, self.chat_list):
            w.setFont(font)

    def zoom(self, step: int) -> None:
        """One point bigger (+1) or smaller (-1), or back to the system size (0); remembered."""
        base = QApplication.font().pointSize() or 10
        size = self.settings.font_size or base
        size = base if step == 0 else max(6, min(48, size + step))
        self.settings.font_size = 0 if size == base else size
        if self.view.long_chat_shown():
            # A long chat is drawn anew in the new size, a few messages at a time: handing the
            # font to every message at once would stall the UI (see ChatView._build_backlog).
            self.view.clear()
            self.view.after_trash(lambda: (self._apply_font_size(size), self.refresh_view()))
            return
        self._apply_font_size(size)
        self.refresh_view()

    # ------------------------------------------------------------------ chats
    def _search_changed(self, text: str) -> None:
        self.chat_model.refresh(text)
        self._select_current_in_list()

    def _focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _select_current_in_list(self) -> None:
        row = self.chat_model.row_of(self.current_chat_id)
        sel = self.chat_list.selectionModel()
        sel.blockSignals(True)
        if row >= 0:
            self.chat_list.setCurrentIndex(self.chat_model.index(row))
        else:
            # Also drop the current index: Rename/Branch/Delete act on it, and a chat that is
            # neither shown nor highlighted must not be their target.
            self.chat_list.setCurrentIndex(QModelIndex())
            self.chat_list.clearSelection()
        sel.blockSignals(False)
        self._update_chat_actions()

    def _update_chat_actions(self) -> None:
        """The chat actions are on only when there is a chat for them to act on."""
        has_chat = self.selected_chat_id() is not None
        widgets = [self.rename_button, self.branch_button, self.delete_button]
        actions = ("rename_action", "branch_action", "delete_action", "pin_action", "export_action")
        widgets += [getattr(self, name) for name in actions if hasattr(self, name)]
        for widget in widgets:
            widget.setEnabled(has_chat)
        if hasattr(self, "pin_action"):  # says what it will do to the highlighted chat
            row = self.chat_model.row_of(self.selected_chat_id())
            pinned = row >= 0 and self.chat_model.chats[row].pinned
            self.pin_action.setText("Un&pin" if pinned else "&Pin")

    def _chat_selected(self, current, _previous) -> None:
        chat_id = self.chat_model.chat_id(current.row()) if current.isValid() else None
        if chat_id is not None and chat_id != self.current_chat_id:
            self.open_chat(chat_id)

    def _on_list_changed(self) -> None:
        self.composer.show_message("")  # a hint about the last attachment is stale now
        self.refresh_chat_list()

    def refresh_chat_list(self) -> None:
        """Reread the chat list (titles, order, pins) and highlight the open chat."""
        self.chat_model.refresh()
        self._select_current_in_list()
        pending = self.pending
        self.chat_model.set_writing(pending.chat_id if pending is not None else None)

    def open_chat(self, chat_id: int | None) -> None:
        if chat_id != self.current_chat_id or not self._draft_shown:
            self.composer.show_message("")
            # The text typed in the chat we leave is kept for it; the one we open gets its own.
            if self._draft_shown:
                self.session.save_draft(self.current_chat_id, self.composer.edit.toPlainText())
            self.composer.edit.setPlainText(self.session.draft(chat_id))
            self.composer.edit.moveCursor(QTextCursor.MoveOperation.End)
            self._draft_shown = True
        self.session.current_chat_id = chat_id
        if chat_id is not None:
            self.settings.last_chat_id = chat_id
            self._follow_chat_binding(chat_id)
        self._select_current_in_list()
        self.refresh_view()

    def _chosen(self) -> EngineChoice:
        combo = getattr(self.model_bar, "model_combo", None)
        return combo.current_choice() if combo is not None else EngineChoice()

    # A chat remembers what it runs on: the local model, or a model of a server (stored as the
    # server's base URL + model name, so renaming the server keeps the binding).
    def _chat_binding(self) -> dict:
        combo = getattr(self.model_bar, "model_combo", None)
        choice = combo.current_choice() if combo is not None else None
        if choice is None or choice.is_local:
            return {"remote_url": None, "remote_model": None}
        server = ServerList(self.store).find(choice.server)
        return {"remote_url": server.base_url if server else None, "remote_model": choice.model}

    def _follow_chat_binding(self, chat_id: int) -> None:
        combo = getattr(self.model_bar, "model_combo", None)
        if combo is None:
            return
        info = self.store.get_chat_info(chat_id)
        if not info.remote_url:
            wanted = EngineChoice()
        else:
            server = next((s for s in ServerList(self.store).load() if s.base_url == info.remote_url), None)
            if server is None:
                self.notices[chat_id] = (f"This chat ran on {info.remote_model} at {info.remote_url}, "
                                         f"which is no longer in Settings → Servers.")
                return
            wanted = EngineChoice(server.name, info.remote_model)
        if combo.current_choice() != wanted and not combo.set_choice(wanted):
            self.notices[chat_id] = f"{info.remote_model} is not listed by its server any more."

    def new_chat(self) -> None:
        self.open_chat(None)
        self.composer.edit.setFocus()

    def selected_chat_id(self) -> int | None:
        index = self.chat_list.currentIndex()
        return self.chat_model.chat_id(index.row()) if index.isValid() else self.current_chat_id

    # The chat actions of the menu and the list act on the highlighted chat; these ask what
    # they need (a title, a confirmation, a file) and hand the change to the session.
    def rename_chat(self, chat_id: int, title: str) -> None:
        self.session.rename_chat(chat_id, title)
        self._update_header()

    def rename_selected(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is None:
            return
        old = self.store.get_chat_info(chat_id).title
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Rename chat")
        dialog.setLabelText("Title:")
        dialog.setTextValue(old)
        dialog.setMinimumWidth(460)  # a title of a few words fits without scrolling
        self.rename_dialog = dialog
        if dialog.exec():
            self.rename_chat(chat_id, dialog.textValue())

    def delete_chat(self, chat_id: int) -> None:
        """Gone from the list at once; deleted from the store when the Undo offer ends (after
        UNDO_DELETE_MS, at the next delete, or at quit)."""
        self.commit_deletes()  # one undo at a time: the one before goes for good
        try:
            title = self.store.get_chat_info(chat_id).title
        except StoreError as exc:
            self._show_status(str(exc))
            return
        if self.pending is not None and self.pending.chat_id == chat_id:
            self.pending.cancel.set()
        self._doomed = chat_id
        self.chat_model.hidden = {chat_id}
        if self.current_chat_id == chat_id:
            self.open_chat(None)
        self.refresh_chat_list()
        self.undo_button.setText(f"Undo: deleted “{title[:40]}”")
        self.undo_button.show()
        self.undo_timer.start()

    def undo_delete(self) -> None:
        """Bring the chat deleted last back, as it was."""
        chat_id, self._doomed = self._doomed, None
        self.undo_timer.stop()
        self.undo_button.hide()
        self.chat_model.hidden = set()
        if chat_id is not None:
            self.refresh_chat_list()
            self.open_chat(chat_id)

    def commit_deletes(self) -> None:
        chat_id, self._doomed = self._doomed, None
        self.undo_timer.stop()
        self.undo_button.hide()
        self.chat_model.hidden = set()
        if chat_id is not None and self.session.delete_chat(chat_id):
            self.refresh_view()

    def delete_selected(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is None:
            return
        title = self.store.get_chat_info(chat_id).title
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{title}” and its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_chat(chat_id)

    def branch_at(self, message_id: int | None = None, chat_id: int | None = None) -> int | None:
        chat_id = chat_id if chat_id is not None else self.current_chat_id
        if chat_id is None:
            return None
        new_id = self.session.branch(chat_id, message_id)
        if new_id is not None:
            self.open_chat(new_id)
        return new_id

    def branch_selected(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is not None:
            self.branch_at(None, chat_id)

    def set_pinned(self, chat_id: int, pinned: bool) -> None:
        self.session.set_pinned(chat_id, pinned)

    def toggle_pin_selected(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is not None:
            self.session.toggle_pin(chat_id)

    def export_chat(self, chat_id: int, path: str | Path) -> Path | None:
        """JSON (re-importable) or, for a .md path, Markdown with the images beside it."""
        result = self.session.export_chat(chat_id, path)
        self.composer.show_message("")
        if result is not None:
            self.status_label.setText(f"Saved {result}")
        return result

    def import_chat(self, path: str | Path) -> int | None:
        chat_id = self.session.import_chat(path)
        if chat_id is not None:
            self.open_chat(chat_id)
        return chat_id

    def export_selected(self) -> None:
        chat_id = self.selected_chat_id()
        if chat_id is None:
            return
        title = self.store.get_chat_info(chat_id).title
        safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "chat"
        start = Path(self.last_folder("chats") or Path.home())
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", str(start / f"{safe}.json"),
                                              "Chat JSON (*.json);;Markdown (*.md)")
        if path:
            self.remember_folder("chats", path)
            self.export_chat(chat_id, path)

    def import_selected(self) -> None:
        start = self.last_folder("chats") or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Import chat", start, "Chat JSON (*.json)")
        if path:
            self.remember_folder("chats", path)
            self.import_chat(path)

    def edit_system_prompt(self) -> None:
        current = self.session.system_prompt()
        dialog = QDialog(self)
        new_chat = self.current_chat_id is None
        # No chat yet: what is edited is the default every new chat starts with; say so.
        dialog.setWindowTitle("Default system prompt" if new_chat else "System prompt")
        edit = QPlainTextEdit(current)
        edit.setAccessibleName("System prompt")
        edit.setTabChangesFocus(True)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        box.accepted.connect(dialog.accept)
        box.rejected.connect(dialog.reject)
        layout = QVBoxLayout(dialog)
        layout.addWidget(QLabel("Instructions the model reads before every new chat (the default, "
                                "also in Settings):" if new_chat else
                                "Instructions the model reads before this chat:"))
        layout.addWidget(edit)
        layout.addWidget(box)
        dialog.resize(520, 260)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.set_system_prompt(edit.toPlainText())

    def set_system_prompt(self, text: str) -> None:
        self.session.set_system_prompt(text)

    # ------------------------------------------------------------------ view
    def refresh_view(self) -> None:
        """Show the current chat as the store has it, with the reply being written."""
        session = self.session
        chat = session.read_current()
        messages = session.messages
        streaming_id = session.streaming_id(chat.id if chat else None)
        self.view.show_messages(messages, live=session.live_stats, errors=session.errors,
                                busy=session.pending is not None, streaming_id=streaming_id)
        if streaming_id is not None and session.pending.text:
            self.view.stream_text(session.pending.text)
        notice = session.notices.get(self.current_chat_id, "")
        self.view.show_notice(notice)
        queued = self._show_queued()
        if messages or notice or queued:
            self.stack.setCurrentWidget(self.view)
        else:
            self._show_empty_state()
        self._update_header(chat.title if chat else "New chat")
        self._update_busy()
        self._update_context_meter()
        self._update_tools_button(chat.settings.get("tools") is True if chat else self._new_chat_tools)

    def _show_queued(self, progress: float | None = None) -> bool:
        """A message sent here that the worker has not saved yet (it waits for the model to
        load): shown at once, with the load's progress."""
        p = self.pending
        if p is None or p.message_id is not None or p.sent is None or not self.session.writing_here():
            self.view.drop_queued()
            return False
        if self.loading:
            pct = f" ({int(progress * 100)} %)" if progress is not None else ""
            note = f"Queued: sent when {Path(self.loading).name} has loaded{pct}"
        else:
            note = "Sending…"
        self.view.show_queued(*p.sent, note)
        return True

    def _update_context_meter(self) -> None:
        """The model bar's meter: the tokens the open chat's last reply left in the context."""
        info = self.engine_info
        last = next((m for m in reversed(self.session.messages) if m.prompt_tokens), None)
        used, size = 0, info.context_size if info else 0
        if last is not None:
            live = self.session.live_stats.get(last.id)
            used = context_used(live if live is not None else last, size)
        self.model_bar.show_context(used, size)

    def _show_empty_state(self) -> None:
        no_model = self.engine_info is None and not self.loading
        self.empty.show_state(loaded=self.engine_info, loading=bool(self.loading),
                              local_models=self._local_found or [] if no_model else [], on_load=self.load_model)
        self.stack.setCurrentWidget(self.empty)
        if no_model and not self._scanning:
            # The models on this computer are looked for off the UI thread (reading their
            # headers imports the GGUF reader); the buttons come when they are found.
            self._scanning = True
            folder = self.settings.models_dir or None
            self.jobs.run(lambda: local_models(folder), self._local_scanned, lambda _error: self._local_scanned([]))

    def _local_scanned(self, found: list[tuple[str, str]]) -> None:
        self._scanning = False
        changed, self._local_found = found != self._local_found, found
        if changed and self.stack.currentWidget() is self.empty and self.engine_info is None and not self.loading:
            self.empty.show_state(loaded=None, loading=False, local_models=found, on_load=self.load_model)

    def _update_header(self, title: str | None = None) -> None:
        if title is None:
            title = self.session.title()
        self.chat_title.setText(f"<b>{escape(title)}</b>")
        self.setWindowTitle(f"{title} — Tramontane" if title else "Tramontane")

    def _update_busy(self) -> None:
        # Stop belongs to the chat that is writing; another chat shows Send (which says why
        # it must wait) and the sidebar shows which chat is writing.
        here = self.session.writing_here()
        can_regenerate = self.session.can_regenerate()
        self.composer.set_busy(here, can_regenerate=can_regenerate)
        if hasattr(self, "stop_action"):
            self.stop_action.setEnabled(here)
            self.regenerate_action.setEnabled(can_regenerate)
        pending = self.pending
        self.chat_model.set_writing(pending.chat_id if pending is not None else None)
        self.status_label.setText("Waiting for the model to load…" if here and self.loading else "Writing…" if here
                                  else "Writing in another chat…" if pending else "")

    def _show_status(self, text: str) -> None:
        self.status_label.setText(text)

    # ------------------------------------------------------------------ generation
    def send(self, text: str, images: list) -> bool:
        """Start the reply to a new user message. False (and a message) when it cannot be
        sent now; the text and images then stay in the composer."""
        binding = self._chat_binding()
        if self.current_chat_id is None and self._new_chat_tools and self.tools_button.isEnabled():
            binding["settings"] = {"tools": True}
        why_not = self.session.send(text, images, binding)
        if why_not:
            self.composer.show_message(why_not)
            self._wait_note = why_not if self.pending is not None else ""
            return False
        self.composer.accepted()
        self.session.save_draft(self.current_chat_id, "")  # sent: no draft left
        return True

    def stop(self) -> None:
        """Stop the reply being written in the chat on screen; the engine returns at the next
        token. A reply in another chat is stopped there."""
        if self.session.writing_here():
            self.session.stop()
        self._focus_composer()

    def regenerate(self, message_id: int | None = None) -> None:
        """Drop the reply `message_id` (default: the last one) and everything after, and
        write it again."""
        self.session.regenerate(message_id)

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a user message's text, drop everything after it, and reply again."""
        self.session.edit_and_resend(message_id, text)

    def _focus_composer(self) -> None:
        """Keyboard focus to the message box when a reply starts or stops. The clicked button
        (Send, Regenerate, Save & resend, Stop) is about to be disabled or removed, and Qt would
        hand the focus to the first widget, the chat search, where the next message would go."""
        focus = QApplication.focusWidget()
        if focus is None or focus.window() is self:
            self.composer.edit.setFocus()

    @Slot(bool)
    def _on_busy_changed(self, busy: bool) -> None:
        if busy:
            self._focus_composer()
            self._update_busy()
        else:
            self.view.flush()
            if self._wait_note and self.composer.message.text() == self._wait_note:
                self.composer.show_message("")  # "another chat is writing": no longer true
            self._wait_note = ""

    @Slot(object)
    def _on_chat_changed(self, chat_id) -> None:
        self.refresh_chat_list()
        if chat_id == self.current_chat_id:
            self.refresh_view()
        else:
            self._update_busy()

    @Slot(str)
    def _on_streamed(self, text: str) -> None:
        self.view.stream_text(text)
        pending = self.pending
        if pending is not None and pending.pieces % 4 == 0:  # not every token
            rate = self.session.live_rate()
            if rate:
                self.view.set_streaming_note(f"writing… {rate:.1f} tok/s")

    @Slot(str, list)
    def _on_unsent(self, text: str, images: list) -> None:
        """A message that could not be saved goes back to an empty composer."""
        if not self.composer.edit.toPlainText() and not self.composer.images:
            self.composer.edit.setPlainText(text)
            for image in images:
                self.composer.add_image(image)

    # ------------------------------------------------------------------ models
    def load_last_model(self) -> bool:
        model, mmproj = self.settings.last_model
        if model and Path(model).is_file():
            # Loaded before: not read again here (at start that would import the GGUF reader
            # before the window shows); the worker says it in words if the file changed.
            self.load_model(model, mmproj if mmproj and Path(mmproj).is_file() else "", check=False)
            return True
        return False

    def load_model(self, model_path: str, mmproj_path: str = "", check: bool = True) -> None:
        """Load a local GGUF (and its projector) on the worker; the bar shows progress. With
        `check`, a file that is not a model is refused first, in words, and the loaded model
        stays (check_then_load)."""
        if check:
            self.check_then_load(model_path, lambda: mmproj_path)
        else:
            self._start_load(model_path, mmproj_path)

    def check_then_load(self, model_path: str, projector: Callable[[], str]) -> None:
        """Read the file's header, and `projector()` when it is a model, on a job: a slow or
        network disk must not freeze the window. Then load it, or refuse it in words with the
        loaded model kept. A model chosen meanwhile wins over this one."""
        self.checking_model = model_path

        def check() -> tuple[str, str]:
            why_not = why_not_a_model(model_path)
            return why_not, "" if why_not else projector()

        self.jobs.run(check, lambda outcome: self._checked(model_path, *outcome),
                      lambda error: self._checked(model_path, f"Cannot read “{Path(model_path).name}”: {error}", ""))

    def _checked(self, model_path: str, why_not: str, mmproj_path: str) -> None:
        if self.checking_model != model_path:
            return  # another model was chosen while this one was read
        self.checking_model = None
        if why_not:
            info = self.engine_info
            if info is not None:
                why_not += f" {Path(info.model_path).name if not info.remote else info.description} stays loaded."
            self.composer.show_message(why_not)
            return
        self._start_load(model_path, mmproj_path)

    def _start_load(self, model_path: str, mmproj_path: str) -> None:
        self.checking_model = None
        if self.pending is not None:
            self.pending.cancel.set()
        self.session.loading = str(model_path)
        self.session.engine_info = None
        self.reload_button.hide()
        if self.model_bar.model_combo is not None:
            combo = self.model_bar.model_combo
            combo.blockSignals(True)
            combo.setCurrentIndex(0)
            combo.blockSignals(False)
        self.model_bar.show_loading(Path(model_path).name)
        self._update_model_state()
        self.worker.load(model_path, mmproj_path or None, self.settings.device,
                         self.settings.context_length or None, self.settings.gpu_layers)

    def open_model_file(self) -> None:
        start = self.last_folder("models") or self.settings.models_dir or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", start, GGUF_FILTER)
        if path:
            self.remember_folder("models", path)
            from ..engine.library.projector import find_projector

            self.check_then_load(path, lambda: str(find_projector(path) or ""))

    def unload_model(self) -> None:
        if self.engine_info is not None and self.engine_info.remote:
            return  # nothing to free here (the button and menu item are off)
        if self.pending is not None:
            self.pending.cancel.set()
        self.worker.unload()

    def _model_choice_changed(self, choice) -> None:
        self.session.bind_current_chat(self._chat_binding())
        if choice.is_local:
            if not self.load_last_model():
                self.worker.unload()
            return
        try:
            engine = engine_for_choice(choice, ServerList(self.store))
        except Exception as exc:  # noqa: BLE001 - a bad server entry is shown, not raised
            self.model_bar.show_error(str(exc))
            return
        if self.pending is not None:
            self.pending.cancel.set()
        self.checking_model = None  # a file still being read is not loaded after this choice
        self.session.loading = choice.model or "server"
        self.worker.use_engine(engine)

    @Slot(float, str)
    def _on_load_progress(self, frac: float, what: str) -> None:
        if self.loading:
            self.model_bar.show_progress(frac, what)
            if self.view.queued is not None:
                self._show_queued(frac)

    @Slot(object)
    def _on_loaded(self, info: EngineInfo) -> None:
        self.session.loading = None
        self.session.engine_info = info
        if not info.remote:
            self.settings.last_model = (info.model_path, info.mmproj_path)
        self.model_bar.show_info(info)
        self._update_context_meter()
        # What was said about the missing model (no model, no projector, a failed load) is no
        # longer true: in the composer and in every chat.
        stale = self.session.model_hints(info) | self._load_errors
        if self.composer.message.text() in stale:
            self.composer.show_message("")
        for chat_id, text in list(self.notices.items()):
            if text in stale:
                del self.notices[chat_id]
        self._load_errors.clear()
        self.refresh_view()
        self._update_model_state()
        self.modelLoaded.emit(info)

    @Slot(str)
    def _on_load_failed(self, message: str) -> None:
        self.session.loading = None
        self.session.engine_info = None
        self.model_bar.show_info(None)  # the previous model is gone: no stale projector/device line
        self.model_bar.show_error(message)
        self.notices[self.current_chat_id] = message
        self._load_errors.add(message)
        self._update_model_state()
        self.refresh_view()

    @Slot()
    def _on_unloaded(self) -> None:
        if self.loading:
            return  # a new model is on its way
        self.session.engine_info = None
        self.model_bar.show_info(None)
        self._update_model_state()

    def _update_model_state(self) -> None:
        info = self.engine_info
        vision = info is not None and info.has_vision
        self.unload_action.setEnabled(info is not None and not info.remote)
        self.view.set_can_reply(self.session.can_reply())
        if info is None or info.remote:  # a server's context is not ours to raise
            self.view.set_context(0, info is None)
        else:
            self.view.set_context(info.context_size, can_grow_context(info.context_size, info.context_limit))
        self._update_busy()
        if info is None and self.loading:
            self.composer.set_vision(False, "The model is still loading")
        else:
            self.composer.set_vision(vision, "" if vision else NO_VISION_HINT)
        if self.stack.currentWidget() is self.empty:
            self._show_empty_state()
        self._update_tools_button()

    # ------------------------------------------------------------------ tools (app/tools.py)
    def _update_tools_button(self, on: bool | None = None) -> None:
        """`on`: the open chat's switch, when the caller has just read the chat (a store read
        here could wait for the worker's write of a reply)."""
        info = self.engine_info
        remote = info is not None and info.remote
        if on is None:
            on = self.tools_button.isChecked()
        self.tools_button.setEnabled(not remote)
        self.tools_button.setChecked(on and not remote)
        self.tools_button.setToolTip(REMOTE_TIP if remote else
                                     "This chat may call the tools of Settings → Tools (each call asks first)")

    @Slot(str)
    def _tool_server_failed(self, text: str) -> None:
        self.statusBar().showMessage(text, 20000)

    def _toggle_chat_tools(self, on: bool) -> None:
        if self.current_chat_id is None:
            self._new_chat_tools = on
        else:
            try:
                set_chat_tools(self.store, self.current_chat_id, on)
            except StoreError as exc:
                self._show_status(str(exc))
                on = chat_tools_on(self.store, self.current_chat_id)
        self._update_tools_button(on)

    def open_tools(self) -> None:
        from .dialogs.tools_page import ToolsDialog

        ToolsDialog(self.tools, self).exec()

    def open_model_manager(self, tab: int | None = None) -> None:
        from .dialogs.models import ModelManagerDialog
        from .downloads import downloads_in

        try:
            # The window owns the downloads: closing the dialog leaves them running.
            self.downloads = downloads_in(self.downloads, self.settings.models_dir or None, self)
            info = self.engine_info
            local = info if info is not None and not info.remote else None
            dialog = ModelManagerDialog(
                downloads=self.downloads, parent=self, settings=self.settings,
                loaded_model=local.model_path if local else None, loaded_fit=running_fit(local),
                freed_bytes=local.resident_bytes if local else 0,
                context_length=local.context_size if local else self.settings.context_length or 0)
        except Exception as exc:  # noqa: BLE001
            self.model_bar.show_error(f"Cannot open the model manager: {exc}")
            return
        dialog.load_requested.connect(lambda m, p: (self.load_model(m, p), dialog.accept()))
        if tab is not None:
            dialog.tabs.setCurrentIndex(tab)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.model_manager = dialog

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self, servers_dialog=self.open_servers, theme=self.theme)
        if dialog.exec():
            self.api_server.apply(self.settings.serve, self.settings.serve_port)
            apply_threads(self.settings.cpu_threads)
            if dialog.theme_choice and dialog.theme_choice != self.theme:
                self.set_theme(dialog.theme_choice)
            info = self.engine_info
            if dialog.reload_needed and info is not None and not info.remote:
                self.reload_button.show()  # context, device, GPU layers: at the next load

    def reload_model(self) -> None:
        """Load the model again, with the settings that apply at a load."""
        info = self.engine_info
        if info is not None and not info.remote:
            self.load_model(info.model_path, info.mmproj_path)

    def open_servers(self) -> None:
        dialog = ServersDialog(self.store, self)
        dialog.exec()
        if self.model_bar.model_combo is not None:
            self.model_bar.model_combo.reload()

    # ------------------------------------------------------------------ drops anywhere
    def dragEnterEvent(self, event) -> None:  # noqa: N802
        """Images dropped anywhere on the window (the conversation, the empty state) go to
        the composer: its own drop handling decides. While they are dragged over the window
        an overlay says where they will go."""
        self.composer.dragEnterEvent(event)
        if event.isAccepted():
            pane = self.stack
            self.drop_overlay.setGeometry(pane.geometry().adjusted(12, 12, -12, -12))
            self.drop_overlay.raise_()
            self.drop_overlay.show()

    def dragMoveEvent(self, event) -> None:  # noqa: N802
        self.composer.dragMoveEvent(event)

    def dragLeaveEvent(self, event) -> None:  # noqa: N802
        self.drop_overlay.hide()
        super().dragLeaveEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802
        self.drop_overlay.hide()
        self.composer.dropEvent(event)

    def bring_to_front(self) -> None:
        """Show the window, restored and raised (another launch asked for it)."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    # ------------------------------------------------------------------ closing
    def closeEvent(self, event) -> None:  # noqa: N802
        self.memory_timer.stop()
        self.commit_deletes()
        self.instance_server.close()
        # Stop the reply; the worker saves what it has (finish reason 'cancelled') before
        # its thread ends, so nothing written is lost.
        self.session.abandon()
        try:
            self.session.save_draft(self.current_chat_id, self.composer.edit.toPlainText())
            self.settings.geometry = bytes(self.saveGeometry().toBase64()).decode()
            if self.current_chat_id is not None:
                self.settings.last_chat_id = self.current_chat_id
        except StoreError:
            pass
        self.hide()  # gone at once; the worker may take a moment to let go of the model
        QApplication.processEvents()
        self.api_server.stop()  # before the worker: no server job may wait on it
        self.worker.stop()
        self.tools.close()  # after the worker: a tool call it runs ends first
        if self.downloads is not None:  # paused: the parts resume next time
            self.downloads.shutdown()
        if self._own_store:
            self.store.close()
        super().closeEvent(event)


__all__ = ["MainWindow"]
