"""The process lock on a data dir: one Tramontane instance per dir, released by the OS on exit."""
from __future__ import annotations

import os
from pathlib import Path

from ...env import variable
from .errors import StoreError, StoreLockedError

DATA_DIR_ENV = variable("data_dir")


class DirLock:
    """An OS lock on `<data dir>/tramontane.lock`. The OS drops it when the process dies,
    so a file left behind by a crash never blocks the next start."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create lock file: {exc.strerror or exc}") from exc
        try:
            _lock_fd(fd)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise StoreLockedError(
                f"Another Tramontane is running{who} with the data dir {self.path.parent} "
                f"(it holds {self.path}). Close it first, or give this one another data "
                f"dir with {DATA_DIR_ENV}."
            ) from None
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                _unlock_fd(fd)
            finally:
                os.close(fd)


if os.name == "nt":
    import msvcrt

    def _lock_fd(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock_fd(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _read_pid(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
        return text if text.isdigit() else ""
    except OSError:  # Windows: the holder's locked byte cannot be read
        return ""
