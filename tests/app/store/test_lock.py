"""app/store/lock.py's DirLock on its own: one holder per data dir, the holder's pid in the
refusal, the lock gone with the holder's process, and a lock file that cannot be made named."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tramontane.app.store import StoreError, StoreLockedError
from tramontane.app.store.lock import DirLock

# A holder in another process: it takes the lock, says so, and waits to be killed.
HOLDER = """
import sys, time
from pathlib import Path
from tramontane.app.store.lock import DirLock
DirLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_the_holder_writes_its_pid_and_a_second_lock_is_refused_until_release(tmp_path):
    path = tmp_path / "tramontane.lock"
    path.write_text("4242424242 stale text from an older holder")
    first = DirLock(path)
    first.acquire()
    if os.name != "nt":  # Windows does not let others read the holder's locked byte
        assert path.read_text() == str(os.getpid())  # the stale text is replaced, not appended to
    second = DirLock(path)
    with pytest.raises(StoreLockedError) as info:
        second.acquire()
    message = str(info.value)
    assert f"with the data dir {tmp_path} (it holds {path})" in message
    assert "TRAMONTANE_DATA_DIR" in message
    if os.name != "nt":
        assert f"(pid {os.getpid()})" in message
    first.release()
    first.release()  # a second release is harmless
    second.acquire()  # free again once released
    second.release()


def test_a_holder_in_another_process_is_named_and_its_death_frees_the_lock(tmp_path):
    path = tmp_path / "tramontane.lock"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(StoreLockedError) as info:
            DirLock(path).acquire()
        if os.name != "nt":
            assert f"(pid {child.pid})" in str(info.value)
    finally:
        child.kill()
        child.wait(30)
    lock = DirLock(path)  # the OS dropped the dead holder's lock: the file left behind blocks nothing
    lock.acquire()
    lock.release()


def test_a_lock_file_that_cannot_be_created_is_a_store_error_naming_it(tmp_path):
    path = tmp_path / "no such folder" / "tramontane.lock"
    with pytest.raises(StoreError, match=re.escape(f"{path}: cannot create lock file: ")) as info:
        DirLock(path).acquire()
    assert not isinstance(info.value, StoreLockedError)  # not "another Tramontane is running"
