"""Settings → Tools: the MCP tool servers (a stdio command or a streamable HTTP URL), each with an
enable switch and its tools, each tool with its own switch. Every change is saved at once and
applied by the window's ToolBroker; listing a server's tools starts it, so that runs off the UI
thread (app/jobs.py) and the list says so meanwhile."""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget)

from ...engine.mcp_tools import DEFAULT_TIMEOUT_S, McpError, McpServerConfig
from ..jobs import Jobs


class ToolsDialog(QDialog):
    def __init__(self, broker, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Tools")
        self.resize(640, 480)
        self.broker = broker
        self.configs: list[McpServerConfig] = list(broker.mcp.configs)
        self.jobs = Jobs(self)
        self.listed: dict[str, list] = {}  # server -> its tools, as last listed
        self._filling = False
        self._asking: set[str] = set()  # servers whose tools are being listed
        broker.toolServersChanged.connect(self._mark_failures)  # a chat's background listing ended

        self.servers = QListWidget()
        self.servers.setAccessibleName("Tool servers")
        self.servers.currentRowChanged.connect(lambda _row: self._show_tools())
        self.servers.itemChanged.connect(self._server_switched)
        self.tools = QListWidget()
        self.tools.setAccessibleName("Tools of the server")
        self.tools.itemChanged.connect(self._tool_switched)
        self.tools_status = QLabel()
        self.tools_status.setWordWrap(True)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self._remove)

        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. time")
        self.command = QLineEdit()
        self.command.setPlaceholderText("a command that speaks MCP on stdio, e.g. uvx mcp-server-time")
        self.url = QLineEdit()
        self.url.setPlaceholderText("or a streamable HTTP URL, e.g. http://127.0.0.1:8000/mcp")
        self.timeout = QDoubleSpinBox()
        self.timeout.setRange(1, 600)
        self.timeout.setValue(DEFAULT_TIMEOUT_S)
        self.timeout.setSuffix(" s")
        self.timeout.setToolTip("A call that takes longer fails with an error card; the chat goes on")
        self.add_button = QPushButton("Add server")
        self.add_button.clicked.connect(self._add)
        self.error = QLabel()
        self.error.setStyleSheet("color: #c62828;")
        self.error.setWordWrap(True)

        lists = QHBoxLayout()
        left = QVBoxLayout()
        left.addWidget(QLabel("Servers (the switch turns one on or off):"))
        left.addWidget(self.servers, 1)
        left.addWidget(self.remove_button)
        right = QVBoxLayout()
        right.addWidget(QLabel("Its tools (a chat with tools on may call the ones switched on):"))
        right.addWidget(self.tools, 1)
        right.addWidget(self.tools_status)
        lists.addLayout(left, 1)
        lists.addLayout(right, 2)
        form = QFormLayout()
        form.addRow("&Name:", self.name)
        form.addRow("&Command:", self.command)
        form.addRow("&URL:", self.url)
        form.addRow("&Timeout:", self.timeout)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(lists, 1)
        layout.addLayout(form)
        layout.addWidget(self.add_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self._fill_servers()

    # -- the lists
    def _fill_servers(self, select: str | None = None) -> None:
        self._filling = True
        current = select or (self.servers.currentItem().text() if self.servers.currentItem() else None)
        self.servers.clear()
        for config in self.configs:
            item = QListWidgetItem(config.name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if config.enabled else Qt.CheckState.Unchecked)
            self.servers.addItem(item)
        self._mark_failures()
        self._filling = False
        names = [c.name for c in self.configs]
        self.servers.setCurrentRow(names.index(current) if current in names else (0 if names else -1))
        self.remove_button.setEnabled(bool(names))
        self._show_tools()

    def _mark_failures(self) -> None:
        """A server whose last listing failed is red, "failed: why" in its tooltip and its
        accessible description (a command that does not exist stayed listed with no mark)."""
        filling, self._filling = self._filling, True  # not a switch of the user's
        for row in range(self.servers.count()):
            item = self.servers.item(row)
            config = self._config(item.text())
            reason = self.broker.failure(item.text()) if config is not None else ""
            where = config.command or config.url if config is not None else ""
            item.setToolTip(f"{where}\nFailed: {reason}" if reason else where)
            item.setData(Qt.ItemDataRole.AccessibleDescriptionRole, f"failed: {reason}" if reason else "")
            item.setForeground(QBrush(QColor("#c62828")) if reason else QBrush())
        self._filling = filling

    def _config(self, name: str) -> McpServerConfig | None:
        return next((c for c in self.configs if c.name == name), None)

    def _selected(self) -> McpServerConfig | None:
        item = self.servers.currentItem()
        return self._config(item.text()) if item is not None else None

    def _show_tools(self) -> None:
        self._filling = True
        self.tools.clear()
        self._filling = False
        config = self._selected()
        if config is None:
            self.tools_status.setText("Add a tool server below.")
            return
        if config.name not in self.listed:
            self.tools_status.setText(f"Asking {config.name} for its tools…")
            if config.name not in self._asking:
                self._list(config.name, lambda: self.broker.list_tools(config.name))
            return
        self._filling = True
        for tool in self.listed[config.name]:
            item = QListWidgetItem(tool.remote_name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked if tool.remote_name in config.disabled_tools
                               else Qt.CheckState.Checked)
            item.setToolTip(tool.description or tool.remote_name)
            self.tools.addItem(item)
        self._filling = False
        count = len(self.listed[config.name])
        self.tools_status.setText(f"{count} tool{'s' * (count != 1)}"
                                  + ("" if config.enabled else " (the server is switched off)"))

    def _list(self, name: str, job) -> None:
        """Run `job` (it returns the server's tools) off the UI thread; show them when it ends."""
        def done(tools) -> None:
            self._asking.discard(name)
            self.listed[name] = tools
            self._mark_failures()
            if self._selected() is not None and self._selected().name == name:
                self._show_tools()

        def failed(message: str) -> None:
            self._asking.discard(name)
            self._mark_failures()
            if self._selected() is not None and self._selected().name == name:
                self.tools_status.setText(message)

        self._asking.add(name)
        self.jobs.run(job, done, failed)

    # -- changes: saved and applied at once (off the UI thread: a changed server is stopped)
    def _apply(self) -> None:
        broker, configs = self.broker, list(self.configs)
        self.jobs.run(lambda: broker.apply_servers(configs), lambda _result: None, self.error.setText)

    def _add(self) -> None:
        name = self.name.text().strip()
        if not name:
            self.error.setText("Give the server a name.")
            return
        if self._config(name) is not None:
            self.error.setText(f"There is already a server named {name!r}.")
            return
        try:
            config = McpServerConfig(name, command=self.command.text().strip(), url=self.url.text().strip(),
                                     timeout_s=self.timeout.value())
        except McpError as exc:
            self.error.setText(str(exc))
            return
        self.error.setText("")
        self.configs.append(config)
        self.name.clear()
        self.command.clear()
        self.url.clear()
        broker, configs = self.broker, list(self.configs)
        self.listed.pop(name, None)
        # saved and applied, then listed, in one job: listing needs the server known
        self._list(name, lambda: (broker.apply_servers(configs), broker.list_tools(name))[1])
        self._fill_servers(select=name)

    def _remove(self) -> None:
        config = self._selected()
        if config is None:
            return
        self.configs = [c for c in self.configs if c.name != config.name]
        self.listed.pop(config.name, None)
        self._apply()
        self._fill_servers()

    def _server_switched(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        config = self._config(item.text())
        on = item.checkState() == Qt.CheckState.Checked
        if config is None or config.enabled == on:
            return
        self.configs = [replace(c, enabled=on) if c is config else c for c in self.configs]
        self._apply()
        self._show_tools()

    def _tool_switched(self, item: QListWidgetItem) -> None:
        config = self._selected()
        if self._filling or config is None:
            return
        off = set(config.disabled_tools)
        (off.discard if item.checkState() == Qt.CheckState.Checked else off.add)(item.text())
        self.configs = [replace(c, disabled_tools=tuple(sorted(off))) if c is config else c for c in self.configs]
        self._apply()
