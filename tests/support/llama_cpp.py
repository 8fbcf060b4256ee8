"""llama.cpp's own llama-server as a reference: found through TRAMONTANE_LLAMA_CPP_BIN (the folder
that scripts/llama_cpp.sh builds and prints), started on a loopback port, stopped after.

Without it the tests skip, saying how to build it (a developer's machine need not have llama.cpp);
with TRAMONTANE_REQUIRE_LLAMA_CPP=1, which .ci/run sets after building it, they fail instead, so a
CI run can never pass by skipping them.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

BIN_ENV = "TRAMONTANE_LLAMA_CPP_BIN"
REQUIRE_ENV = "TRAMONTANE_REQUIRE_LLAMA_CPP"
START_TIMEOUT_S = 120


def llama_server_binary() -> Path:
    """The llama-server to test against; skips (fails where required) when there is none."""
    folder = os.environ.get(BIN_ENV, "")
    binary = Path(folder) / "llama-server"
    if folder and binary.is_file() and os.access(binary, os.X_OK):
        return binary
    why = f"{BIN_ENV} is not set" if not folder else f"{BIN_ENV}={folder} holds no executable llama-server"
    message = (f"needs llama.cpp's llama-server, and {why} (build it once: "
               f"export {BIN_ENV}=$(scripts/llama_cpp.sh))")
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict, timeout: float = 60) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def _ready(base_url: str) -> bool:
    """llama-server answers /health with 503 while it loads the model, 200 once it serves."""
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def llama_server(model: str | os.PathLike, log_dir: str | os.PathLike, *args: str) -> Iterator[str]:
    """llama-server on `model` at a free loopback port, one slot, two threads; yields its base URL
    (http://127.0.0.1:PORT). Its log is `log_dir`/llama-server.log, quoted when it fails to start."""
    binary = llama_server_binary()
    port = free_port()
    log_path = Path(log_dir) / "llama-server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                                 "--threads", "2", "--parallel", "1", "--no-warmup", *args],
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(base_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited ({proc.returncode})" if proc.poll() is not None else \
                    f"did not answer /health within {START_TIMEOUT_S} s"
                pytest.fail(f"llama-server {state}:\n{log_path.read_text(errors='replace')[-3000:]}",
                            pytrace=False)
            time.sleep(0.2)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
