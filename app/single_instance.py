"""One app per data dir: a second launch brings the running window to the front and exits."""
from __future__ import annotations


import getpass
import hashlib
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

RAISE = b"raise\n"
CONNECT_TIMEOUT_MS = 500


def server_name(data_dir: str | Path) -> str:
    """A local-socket name per user and data dir (two data dirs may run side by side)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name: the data dir alone still separates
        user = ""
    key = f"{user}\0{Path(data_dir).expanduser().resolve()}"
    return "tramontane-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def ask_running_instance(data_dir: str | Path) -> bool:
    """Ask the app already running on `data_dir` to show its window; False when none answers."""
    socket = QLocalSocket()
    socket.connectToServer(server_name(data_dir))
    if not socket.waitForConnected(CONNECT_TIMEOUT_MS):
        return False
    socket.write(RAISE)
    sent = socket.waitForBytesWritten(CONNECT_TIMEOUT_MS)
    socket.disconnectFromServer()
    return sent


class InstanceServer(QObject):
    """Listens for later launches on the same data dir; `raiseRequested` when one asks.
    Start it only while holding the data dir's lock: a leftover socket of a crashed run is
    removed, which must never be a live one."""

    raiseRequested = Signal()

    def __init__(self, data_dir: str | Path, parent: QObject | None = None):
        super().__init__(parent)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._accept)
        name = server_name(data_dir)
        if not self.server.listen(name):
            QLocalServer.removeServer(name)
            self.server.listen(name)

    @property
    def listening(self) -> bool:
        return self.server.isListening()

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            socket = self.server.nextPendingConnection()
            socket.readyRead.connect(lambda s=socket: self._read(s))
            socket.disconnected.connect(socket.deleteLater)
            self._read(socket)

    def _read(self, socket: QLocalSocket) -> None:
        if socket.bytesAvailable() and bytes(socket.readAll().data()).startswith(RAISE.strip()):
            self.raiseRequested.emit()

    def close(self) -> None:
        self.server.close()
