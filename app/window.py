"""The main window: chat list | model bar, conversation, composer; its menus and status bar.

The window only composes: it builds the widgets and the menus and wires them to the parts
that act (each a module of its own, none importing this one): `ChatNavigation` (which chat is
open), `ChatCommands` (rename, delete, branch, pin, export...), `ReplyCommands` (send, stop,
regenerate), `Conversation` (what is shown of the open chat), `ModelLoading` (check, then load
on the worker), `RemoteBinding` (local model or a server's, per chat), `ToolsSwitch`,
`Appearance` (theme, zoom), `DropsToComposer`, `WindowDialogs` and `WarmUp` (the first turn
on screen). What happens to the chats is `ChatSession`'s; models are loaded by the engine worker.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QLineEdit, QListView, QMainWindow,
                               QSizePolicy, QSplitter, QStackedWidget, QToolButton, QVBoxLayout, QWidget)

from ..engine.runtime.threads import apply_threads
from .appearance import Appearance
from .chat_commands import ChatCommands
from .chat_navigation import ChatNavigation
from .chat_session import ChatSession
from .config import AppSettings
from .conversation import Conversation
from .drops import DropsToComposer
from .jobs import Jobs
from .model_loading import ModelLoading
from .reply_commands import ReplyCommands
from .remote_binding import RemoteBinding
from .serving import ServerStatusLabel, WindowServer
from .single_instance import InstanceServer
from .store import Store, StoreError
from .tools import ToolBroker
from .tools_switch import ToolsSwitch
from .warm_up import WarmUp
from .widgets.chat_list import ChatListDelegate, ChatListModel
from .widgets.chat_view import ChatView
from .widgets.composer import Composer
from .widgets.find_bar import FindBar
from .widgets.elided_label import ElidedLabel
from .widgets.empty_state import EmptyState
from .widgets.icons import icon
from .widgets.model_bar import ModelBar
from .widgets.reload_button import ReloadButton
from .widgets.undo_button import UndoButton
from .window_dialogs import WindowDialogs
from .worker import DOCUMENT_INDEX_FOLDER, KV_CACHE_FOLDER, EngineWorker


class MainWindow(QMainWindow):
    """The app window. `store` may be given (tests, main()); else the data dir's store is
    opened and closed with the window."""

    replyFinished = Signal(int)  # message id, after the store has the final text
    replyFailed = Signal(str)
    modelLoaded = Signal(object)  # EngineInfo
    firstShown = Signal()  # the window is on screen (the first turn of the event loop after show)

    def __init__(self, store: Store | None = None, *, data_dir: str | Path | None = None,
                 autoload: bool = True):
        super().__init__()
        self._own_store = store is None
        self.store = store if store is not None else Store(data_dir)
        self.settings = AppSettings(self.store)
        self.setWindowTitle("Tramontane")
        self.jobs = Jobs(self)
        self.worker = EngineWorker(kv_disk_dir=self.store.data_dir / KV_CACHE_FOLDER,
                                   documents_dir=self.store.data_dir / DOCUMENT_INDEX_FOLDER)
        self.session = ChatSession(self.store, self.settings, self.worker, self)
        # MCP tool servers (Settings → Tools); a chat with tools on runs its tool loop on the worker
        self.tools = ToolBroker(self.store, self)
        self.session.tools = self.tools
        self._make_parts()
        self._connect_session()
        self.warm_up = WarmUp(self, autoload)  # once the window is on screen
        self._shown_once = False
        self.worker.start()
        # A second launch on this data dir asks us to come to the front (see main.run_app).
        self.instance_server = InstanceServer(self.store.data_dir, self)
        self.instance_server.raiseRequested.connect(self.bring_to_front)

        self._build()
        self._build_menus()
        # Settings' API server switch: other programs share this worker's engine and KV caches.
        self.api_server = WindowServer(self.worker)
        self.statusBar().addPermanentWidget(ServerStatusLabel(self.api_server))
        self.api_server.apply(self.settings.serve, self.settings.serve_port, self.settings.serve_apis,
                              self.settings.serve_ollama_port)
        if self.settings.cpu_threads:  # auto needs nothing: the kernels start with the default
            apply_threads(self.settings.cpu_threads)
        geometry = self.settings.geometry
        if geometry:
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))
        else:
            self.resize(1100, 760)
        self.appearance.apply_at_start()
        self.chat_model.refresh()
        last = self.settings.last_chat_id
        self.navigation.open_chat(last if self.chat_model.row_of(last) >= 0 else None)
        self.conversation.update_model_state()

    def _make_parts(self) -> None:
        """The parts that act on the window's widgets (built next; they look them up on use)."""
        self.model_loading = ModelLoading(self)  # the worker's load signals before the server's
        self.navigation = ChatNavigation(self)
        self.chats = ChatCommands(self)
        self.replies = ReplyCommands(self)
        self.conversation = Conversation(self)
        self.binding = RemoteBinding(self)
        self.tools_switch = ToolsSwitch(self)
        self.appearance = Appearance(self)
        self.dialogs = WindowDialogs(self)

    def _connect_session(self) -> None:
        session = self.session
        session.changed.connect(self.conversation.on_chat_changed)
        session.listChanged.connect(self.navigation.on_list_changed)
        session.streamed.connect(self.replies.on_streamed)
        session.busyChanged.connect(self.replies.on_busy_changed)
        session.unsent.connect(self.replies.on_unsent)
        session.storeFailed.connect(self.conversation.show_status)
        session.replyFinished.connect(self.replyFinished)
        session.replyFailed.connect(self.replyFailed)
        self.tools.cardChanged.connect(self.conversation.on_chat_changed)
        self.tools.toolServerFailed.connect(self.tools_switch.tool_server_failed)

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            QTimer.singleShot(0, self.warm_up.first_turn)

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        sidebar = self._build_sidebar()
        right = self._build_conversation_pane()
        split = QSplitter()
        split.addWidget(sidebar)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([240, 860])
        self.setCentralWidget(split)
        self.drops = DropsToComposer(self, self.composer, pane=self.stack, overlay_parent=right)
        self._build_status_bar()
        self.composer.edit.setFocus()

    def _build_sidebar(self) -> QWidget:
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search chats")
        self.search.textChanged.connect(self.navigation.search_changed)
        self.chat_model = ChatListModel(self.store, self)
        self.chat_list = QListView()
        self.chat_list.setModel(self.chat_model)
        self.chat_list.setAccessibleName("Chats")
        self.chat_list.setObjectName("chatList")
        self.chat_list.setItemDelegate(ChatListDelegate(self.chat_list))  # Today / Yesterday... headings
        self.chat_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.chat_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.chat_list.selectionModel().currentChanged.connect(self.navigation.chat_selected)
        self.chat_list.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        buttons = QHBoxLayout()
        self.new_button = _tool("New chat", "New chat (Ctrl+N)", self.navigation.new_chat)
        self.new_button.setIcon(icon("new-chat"))
        self.new_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.new_button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.rename_button = _tool("Rename", "Rename the chat (F2)", self.chats.rename_selected)
        self.branch_button = _tool("Branch", "Copy the chat into a new one", self.chats.branch_selected)
        self.delete_button = _tool("Delete", "Delete the chat (Del)", self.chats.delete_selected)
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
        return sidebar

    def _build_conversation_pane(self) -> QWidget:
        self.model_bar = ModelBar()
        self.model_bar.models_button.clicked.connect(self.dialogs.open_model_manager)
        self.model_bar.open_button.clicked.connect(self.model_loading.open_model_file)
        self.model_bar.unload_button.clicked.connect(self.model_loading.unload_model)
        self.model_bar.cancel_button.clicked.connect(self.model_loading.cancel_load)
        self.binding.add_server_picker(self.model_bar)

        self.chat_title = ElidedLabel()
        self.chat_title.setAccessibleName("Chat title")
        self.system_button = _tool("System prompt…", "This chat's system prompt", self.chats.edit_system_prompt)
        self.system_button.setObjectName("headerButton")  # shaped as the Tools switch beside it (theme.py)
        header = QHBoxLayout()
        header.setContentsMargins(12, 2, 12, 2)
        header.setSpacing(6)  # the two buttons apart (the pane's layouts have none)
        self.tools_button = _tool("Tools", "", self.tools_switch.toggle)
        self.tools_button.setCheckable(True)
        self.tools_button.setObjectName("toolsSwitch")  # its on state in the accent (theme.py)
        header.addWidget(self.chat_title, 1)
        header.addWidget(self.tools_button)
        header.addWidget(self.system_button)

        self.view = ChatView()
        self.view.editSubmitted.connect(self.replies.edit_and_resend)
        self.view.regenerateRequested.connect(self.replies.regenerate)
        self.view.branchRequested.connect(self.chats.branch_at)
        self.view.versionRequested.connect(self.session.show_version)
        self.session.promptRead.connect(self.view.show_prompt_progress)
        self.worker.imagesReading.connect(self.conversation.on_images_reading)
        self.worker.turnsLeftOut.connect(self.conversation.on_turns_left_out)
        self.view.tool_waiting = self.tools.waiting
        self.view.toolDecided.connect(self.tools.answer)
        self.empty = EmptyState()
        self.empty.recommended_button.clicked.connect(lambda: self.dialogs.open_model_manager(tab=0))
        self.empty.open_button.clicked.connect(self.model_loading.open_model_file)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.view)

        self.composer = Composer()
        self.composer.modelFileOffered.connect(self.model_loading.offer_model_file)
        self.composer.start_folder = self.settings.last_folder("images")
        self.composer.folderUsed.connect(lambda folder: self.conversation.remember_folder("images", folder))
        self.composer.sendRequested.connect(self.replies.send)
        self.composer.stopRequested.connect(self.replies.stop)
        self.composer.regenerateRequested.connect(lambda: self.replies.regenerate(None))

        right = QWidget()
        right.setObjectName("conversationPane")  # bar, conversation and composer on one background
        right.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        main = QVBoxLayout(right)
        main.setContentsMargins(0, 0, 0, 0)
        main.setSpacing(0)
        main.addWidget(self.model_bar)
        main.addLayout(header)
        main.addWidget(self.stack, 1)
        self.find_bar = FindBar(self.view)  # Chat ▸ Find in chat
        self.find_bar.closed.connect(self.composer.edit.setFocus)
        main.addWidget(self.find_bar)
        main.addWidget(self.composer)
        return right

    def _build_status_bar(self) -> None:
        self.status_label = QLabel()
        self.statusBar().addWidget(self.status_label, 1)
        self.reload_button = ReloadButton()
        self.reload_button.clicked.connect(self.model_loading.reload_model)
        self.statusBar().addPermanentWidget(self.reload_button)
        self.undo_button = UndoButton()
        self.undo_button.clicked.connect(self.chats.undo_delete)
        self.undo_button.expired.connect(self.chats.commit_deletes)
        self.statusBar().addPermanentWidget(self.undo_button)

    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcut=None, tip=""):
            a = QAction(text, self)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            a.setStatusTip(tip)
            a.triggered.connect(slot)
            menu.addAction(a)
            return a

        chats, replies, dialogs = self.chats, self.replies, self.dialogs
        chat = self.menuBar().addMenu("&Chat")
        action(chat, "&New chat", self.navigation.new_chat, "Ctrl+N")
        action(chat, "&Search chats", self.navigation.focus_search, "Ctrl+F")
        action(chat, "&Find in chat", self.find_bar.open_bar, "Ctrl+Shift+F",
               tip="Find a word in the open chat: every match marked, Enter for the next")
        action(chat, "Write a &message", lambda: self.composer.edit.setFocus(), "Ctrl+L")
        self.rename_action = action(chat, "&Rename…", chats.rename_selected, "F2")
        self.branch_action = action(chat, "&Branch", chats.branch_selected)
        self.delete_action = action(chat, "&Delete…", chats.delete_selected)
        self.pin_action = action(chat, "&Pin", chats.toggle_pin_selected)
        chat.addSeparator()
        self.export_action = action(chat, "&Export…", chats.export_selected,
                                    tip="Save the chat as JSON (re-importable) or Markdown")
        action(chat, "&Import…", chats.import_selected)
        chat.addSeparator()
        self.chat_settings_action = action(chat, "Chat se&ttings…", chats.edit_chat_settings,
                                           tip="This chat's temperature, top_p, max tokens and seed")
        self.regenerate_action = action(chat, "Regenerate the last reply", lambda: replies.regenerate(None),
                                        "Ctrl+R")
        # Enabled only while a reply is written, so Esc stays free for dialogs and editors.
        self.stop_action = action(chat, "&Stop the reply", replies.stop, "Esc")
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
        delete_key.activated.connect(chats.delete_selected)

        model = self.menuBar().addMenu("&Model")
        action(model, "&Models…", lambda: dialogs.open_model_manager(), "Ctrl+M")
        action(model, "&Open GGUF file…", self.model_loading.open_model_file, "Ctrl+O")
        self.unload_action = action(model, "&Unload", self.model_loading.unload_model)
        self.unload_action.setEnabled(False)
        self.projector_action = action(model, "&Projector…", self.model_loading.choose_projector,
                                       tip="Choose or change the loaded model's vision projector, or none")
        self.projector_action.setEnabled(False)

        view = self.menuBar().addMenu("&View")
        zoom = self.appearance.zoom
        action(view, "Zoom &in", lambda: zoom(+1), QKeySequence.StandardKey.ZoomIn)
        action(view, "Zoom &out", lambda: zoom(-1), QKeySequence.StandardKey.ZoomOut)
        action(view, "&Reset zoom", lambda: zoom(0), "Ctrl+0")

        theme = view.addMenu("&Theme")
        self.theme_actions = {}
        themes = QActionGroup(self)  # one of them: radio items
        themes.setExclusive(True)
        for key, text in (("system", "&System"), ("light", "&Light"), ("dark", "&Dark")):
            a = action(theme, text, lambda _=False, k=key: self.appearance.set_theme(k))
            a.setCheckable(True)
            themes.addAction(a)
            self.theme_actions[key] = a
        self.theme_actions[self.appearance.theme].setChecked(True)

        settings = self.menuBar().addMenu("&Settings")
        action(settings, "&Settings…", dialogs.open_settings, "Ctrl+,")
        action(settings, "S&ervers…", dialogs.open_servers)
        action(settings, "&Tools…", dialogs.open_tools)

        help_menu = self.menuBar().addMenu("&Help")
        action(help_menu, "&Keyboard shortcuts", dialogs.show_shortcuts, "F1")
        action(help_menu, "&About Tramontane", dialogs.show_about)

    # ------------------------------------------------------------------ window events
    def changeEvent(self, event) -> None:  # noqa: N802
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.appearance.palette_changed()
        super().changeEvent(event)

    def bring_to_front(self) -> None:
        """Show the window, restored and raised (another launch asked for it)."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def closeEvent(self, event) -> None:  # noqa: N802
        self.model_loading.memory_timer.stop()
        self.chats.commit_deletes()
        self.instance_server.close()
        # Stop the reply; the worker saves what it has (finish reason 'cancelled') before
        # its thread ends, so nothing written is lost.
        self.session.abandon()
        try:
            self.session.save_draft(self.session.current_chat_id, self.composer.edit.toPlainText())
            self.settings.geometry = bytes(self.saveGeometry().toBase64()).decode()
            if self.session.current_chat_id is not None:
                self.settings.last_chat_id = self.session.current_chat_id
        except StoreError:
            pass
        self.hide()  # gone at once; the worker may take a moment to let go of the model
        QApplication.processEvents()
        self.api_server.stop()  # before the worker: no server job may wait on it
        self.worker.stop()
        self.tools.close()  # after the worker: a tool call it runs ends first
        self.dialogs.shutdown()  # downloads paused: the parts resume next time
        if self._own_store:
            self.store.close()
        super().closeEvent(event)


def _tool(text: str, tip: str, slot) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setToolTip(tip)
    b.clicked.connect(slot)
    return b


__all__ = ["MainWindow"]
