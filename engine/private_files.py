"""Private by default: the data folder, chats, photos and partial downloads are the user's alone.

On a shared machine a world-readable `chats.sqlite3` or `images/` lets every other account read
every chat and photo, so folders we own are 0700 and their files 0600 (on POSIX; Windows keeps
its per-user profile ACLs). Three layers, each cheap:
- the app and the CLI start with umask 077, so whatever they create later is private;
- the places that create files on purpose (the store, image files, `.part` downloads) ask for
  0600 / 0700 themselves, so they are private whoever calls them (a library user, a test);
- at start-up an existing data folder made by an older version is tightened once.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
POSIX = os.name == "posix"


def restrict_umask() -> int:
    """Make every file this process creates from now on private; returns the previous umask."""
    return os.umask(PRIVATE_UMASK) if POSIX else 0


def make_private_dir(path: str | Path, tighten_existing: bool = True) -> Path:
    """Create `path` and its missing parents as 0700 folders, and make `path` itself 0700
    (unless it existed and `tighten_existing` is false: a models folder the user chose and
    shares with other apps). Parents that already existed (the home folder) are not ours."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass  # made by another thread or process meanwhile
    if POSIX and (missing or tighten_existing):
        os.chmod(path, DIR_MODE)
    return path


def create_private_file(path: str | Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """os.open with mode 0600 (umask can only remove bits); an existing file is made 0600 too."""
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    if POSIX:
        os.fchmod(fd, FILE_MODE)
    return fd


def tighten_tree(root: str | Path) -> int:
    """Take group and other permissions off every folder and file under `root` (itself
    included) that this user owns; symlinks are not followed. Returns how many were changed."""
    if not POSIX:
        return 0
    changed = 0
    uid = os.getuid()
    for top, dirs, files in os.walk(root):
        for path in [top, *(os.path.join(top, f) for f in files)]:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or st.st_uid != uid or not (st.st_mode & 0o077):
                continue
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
                changed += 1
            except OSError:
                pass  # a file we cannot change stays as it is; the rest is still tightened
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
    return changed
