"""A loopback fake of the Hugging Face hub, enough for huggingface_hub and our downloader.

Serves, for repos held in memory:
  GET  /api/models?search=&filter=gguf          list_models
  GET  /api/models/{repo}[/revision/{rev}]      model_info
  GET  /api/models/{repo}/tree/{rev}[/{path}]   list_repo_tree (sizes, LFS sha256)
  HEAD/GET /{repo}/resolve/{rev}/{file}         X-Repo-Commit, ETag, X-Linked-Etag/-Size, Range
Optionally LFS files redirect (302) to a second server on another port, like the hub's CDN.

Fault injection: cut a transfer after a byte offset (connection closed mid-body), corrupt
served bytes, ignore Range, slow transfers down, gate repos behind a token. It counts body
bytes served per file so tests can prove nothing was downloaded twice.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    downloads: int = 0
    likes: int = 0

    def is_lfs(self, name: str) -> bool:
        return name.endswith(".gguf")


@dataclass
class Faults:
    # filename -> list of absolute byte offsets; each GET that crosses the first offset is cut
    # there (the connection closes mid-body) and the offset is consumed.
    cut_at: dict[str, list[int]] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)  # serve flipped bytes, advertise the real sha
    ignore_range: bool = False
    delay_per_chunk_s: float = 0.0
    fail_status: dict[str, int] = field(default_factory=dict)  # filename -> HTTP status on GET
    # filename -> byte offset where the server stops sending (connection left open) until
    # `release` is set: a stalled network.
    stall_at: dict[str, int] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # clients hanging up is expected here
        import sys
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


class FakeHub:
    def __init__(self, repos: dict[str, FakeRepo], tokens: set[str] = frozenset(),
                 cdn: bool = False, chunk: int = 16 << 10):
        self.repos = repos
        self.tokens = set(tokens)
        self.faults = Faults()
        self.chunk = chunk
        self.bytes_served: dict[str, int] = {}
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, lower-cased headers)
        self.lock = threading.Lock()
        self.server = _QuietServer(("127.0.0.1", 0), self._handler(cdn=False))
        self.server.daemon_threads = True
        self.cdn_server = None
        if cdn:
            self.cdn_server = _QuietServer(("127.0.0.1", 0), self._handler(cdn=True))
            self.cdn_server.daemon_threads = True
        self._threads = []

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def cdn_endpoint(self) -> str | None:
        return f"http://127.0.0.1:{self.cdn_server.server_address[1]}" if self.cdn_server else None

    def start(self) -> "FakeHub":
        for srv in (self.server, self.cdn_server):
            if srv is not None:
                t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                                     daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def stop(self) -> None:
        self.faults.release.set()
        for srv in (self.server, self.cdn_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- helpers -------------------------------------------------------------------------

    def sha256(self, repo_id: str, name: str) -> str:
        return hashlib.sha256(self.repos[repo_id].files[name]).hexdigest()

    def served(self, name: str) -> int:
        with self.lock:
            return self.bytes_served.get(name, 0)

    def _handler(self, cdn: bool):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_HEAD(self):
                self._route(head=True)

            def do_GET(self):
                self._route(head=False)

            # ---------------------------------------------------------------------------
            def _json(self, obj, status=200, extra=None):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, status, code, message):
                self._json({"error": message}, status, {"X-Error-Code": code,
                                                        "X-Error-Message": message})

            def _authorized(self, repo: FakeRepo) -> bool:
                if not repo.gated:
                    return True
                auth = self.headers.get("Authorization", "")
                return auth.startswith("Bearer ") and auth[7:] in hub.tokens

            def _route(self, head: bool):
                url = urlsplit(self.path)
                path = unquote(url.path)
                query = parse_qs(url.query)
                with hub.lock:
                    hub.requests.append((self.command, self.path,
                                         {k.lower(): v for k, v in self.headers.items()}))
                if cdn:
                    m = re.fullmatch(r"/blob/([0-9a-f]{64})/(.+?)/resolve/([^/]+)/(.+)", path)
                    if not m:
                        return self._error(404, "EntryNotFound", "no such blob")
                    repo_id, name = m.group(2), m.group(4)
                    return self._serve_file(repo_id, name, head, redirect=False, signed=True)
                if path == "/api/models":
                    return self._list_models(query)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
                if m:
                    return self._tree(m.group(1), m.group(3) or "", query)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
                if m:
                    return self._model_info(m.group(1))
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    return self._serve_file(m.group(1), m.group(3), head,
                                            redirect=hub.cdn_server is not None)
                return self._error(404, "RepoNotFound", "unknown route")

            def _repo_not_found(self, repo_id):
                # Like the hub: without a token an unknown repo could be private -> 401.
                status = 404 if self.headers.get("Authorization") else 401
                self._error(status, "RepoNotFound", f"Repository {repo_id} not found")

            def _repo_or_error(self, repo_id):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._repo_not_found(repo_id)
                    return None
                if not self._authorized(repo):
                    auth = self.headers.get("Authorization")
                    self._error(401 if not auth else 403, "GatedRepo",
                                f"Access to model {repo_id} is restricted.")
                    return None
                return repo

            def _list_models(self, query):
                search = (query.get("search") or [""])[0].lower()
                want_gguf = "gguf" in query.get("filter", [])
                out = []
                for repo_id, repo in hub.repos.items():
                    if search and search not in repo_id.lower():
                        continue
                    if want_gguf and not any(n.endswith(".gguf") for n in repo.files):
                        continue
                    out.append({"id": repo_id, "_id": repo_id, "modelId": repo_id,
                                "downloads": repo.downloads, "likes": repo.likes,
                                "gated": "manual" if repo.gated else False, "private": False,
                                "lastModified": "2025-03-18T00:00:00.000Z",
                                "tags": ["gguf"], "library_name": "gguf"})
                out.sort(key=lambda r: -r["downloads"])
                limit = int((query.get("limit") or [len(out)])[0])
                self._json(out[:limit])

            def _model_info(self, repo_id):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._repo_not_found(repo_id)
                # Like the hub: metadata of a gated repo is public, its files are not.
                self._json({"id": repo_id, "_id": repo_id, "modelId": repo_id, "sha": COMMIT,
                            "gated": "manual" if repo.gated else False, "private": False,
                            "downloads": repo.downloads, "likes": repo.likes, "tags": ["gguf"],
                            "siblings": [{"rfilename": n} for n in sorted(repo.files)]})

            def _tree(self, repo_id, sub, query):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._repo_not_found(repo_id)
                recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
                prefix = sub.strip("/") + "/" if sub.strip("/") else ""
                entries, folders = [], set()
                for name in sorted(repo.files):
                    if not name.startswith(prefix):
                        continue
                    rest = name[len(prefix):]
                    if "/" in rest and not recursive:
                        folders.add(prefix + rest.split("/")[0])
                        continue
                    if recursive:
                        parts = rest.split("/")[:-1]
                        for i in range(len(parts)):
                            folders.add(prefix + "/".join(parts[: i + 1]))
                    data = repo.files[name]
                    entry = {"type": "file", "oid": git_oid(data), "size": len(data), "path": name}
                    if repo.is_lfs(name):
                        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(),
                                        "size": len(data), "pointerSize": 134}
                    entries.append(entry)
                dirs = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f}
                        for f in sorted(folders)]
                self._json(dirs + entries)

            def _serve_file(self, repo_id, name, head, redirect, signed=False):
                # A CDN URL is signed by the hub: it needs no token (and must get none).
                repo = hub.repos.get(repo_id) if signed else self._repo_or_error(repo_id)
                if repo is None:
                    if signed:
                        self._error(404, "EntryNotFound", "no such blob")
                    return
                data = repo.files.get(name)
                if data is None:
                    return self._error(404, "EntryNotFound", f"{name} not found in {repo_id}")
                lfs = repo.is_lfs(name)
                etag = hashlib.sha256(data).hexdigest() if lfs else git_oid(data)
                common = {"X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes"}
                if lfs:
                    common["X-Linked-Etag"] = f'"{etag}"'
                    common["X-Linked-Size"] = str(len(data))
                if redirect and lfs:
                    loc = f"{hub.cdn_endpoint}/blob/{etag}/{repo_id}/resolve/main/{name}"
                    self.send_response(302)
                    self.send_header("Location", loc)
                    self.send_header("ETag", f'"{git_oid(data)}"')
                    self.send_header("Content-Length", "0")
                    for k, v in common.items():
                        self.send_header(k, v)
                    self.end_headers()
                    return
                if not head and name in hub.faults.fail_status:
                    return self._error(hub.faults.fail_status[name], "Fault", "injected")
                body = data
                if name in hub.faults.corrupt:
                    body = bytes([data[0] ^ 0xFF]) + data[1:]
                start, end = 0, len(body) - 1
                rng = self.headers.get("Range")
                status = 200
                if rng and not hub.faults.ignore_range:
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
                    if m:
                        start = int(m.group(1))
                        end = int(m.group(2)) if m.group(2) else end
                        if start >= len(body):
                            self.send_response(416)
                            self.send_header("Content-Range", f"bytes */{len(body)}")
                            self.send_header("Content-Length", "0")
                            self.end_headers()
                            return
                        status = 206
                self.send_response(status)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Length", str(end - start + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
                for k, v in common.items():
                    self.send_header(k, v)
                self.end_headers()
                if head:
                    return
                cut = None
                with hub.lock:
                    cuts = hub.faults.cut_at.get(name)
                    if cuts and start < cuts[0] <= end:
                        cut = cuts.pop(0)
                pos = start
                stop_at = cut if cut is not None else end + 1
                stall = hub.faults.stall_at.get(name)
                while pos < stop_at:
                    if stall is not None and pos >= stall:
                        hub.faults.release.wait(30)
                        stall = None
                    n = min(hub.chunk, stop_at - pos, (stall - pos) if stall else hub.chunk)
                    try:
                        self.wfile.write(body[pos:pos + n])
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    with hub.lock:
                        hub.bytes_served[name] = hub.bytes_served.get(name, 0) + n
                    pos += n
                    if hub.faults.delay_per_chunk_s:
                        time.sleep(hub.faults.delay_per_chunk_s)
                if cut is not None:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(2)  # socket.SHUT_RDWR: drop mid-body
                    except OSError:
                        pass

        return Handler


def make_gguf_bytes(path, arch: str = "llama", n_embd: int = 64, n_layers: int = 2,
                    quant: str = "Q8_0", mmproj: bool = False, seed: int = 0) -> bytes:
    """Write a small, valid GGUF with 2-D weights in `quant` (Q8_0/Q4_0/F16/F32) and 1-D
    F32 norms; returns its bytes. A projector gets arch 'clip' and `clip.has_vision_encoder`."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip" if mmproj else arch)
    w.add_name("tiny-projector" if mmproj else "tiny-model")
    if mmproj:
        w.add_bool("clip.has_vision_encoder", True)
        w.add_string("clip.projector_type", "pixtral")
    else:
        w.add_uint32(f"{arch}.embedding_length", n_embd)
        w.add_uint32(f"{arch}.block_count", n_layers)
    qtype = GGMLQuantizationType[quant]
    prefix = "v.blk" if mmproj else "blk"
    for layer in range(n_layers):
        for t in ("attn_q", "attn_k", "ffn_up"):
            x = rng.standard_normal((n_embd, n_embd)).astype(np.float32)
            if qtype in (GGMLQuantizationType.F32,):
                w.add_tensor(f"{prefix}.{layer}.{t}.weight", x)
            elif qtype == GGMLQuantizationType.F16:
                w.add_tensor(f"{prefix}.{layer}.{t}.weight", x.astype(np.float16))
            else:
                q = quantize(x, qtype)
                w.add_tensor(f"{prefix}.{layer}.{t}.weight", q, raw_shape=q.shape, raw_dtype=qtype)
        w.add_tensor(f"{prefix}.{layer}.attn_norm.weight", np.ones(n_embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


_GGUF_CACHE: dict[tuple, bytes] = {}


def tiny_model_q4_0(tmp_dir) -> bytes:
    """The tiny fixture model with its 2-D weights quantized to Q4_0 by gguf.quants (memoised)."""
    key = ("tiny-model-q4_0",)
    if key not in _GGUF_CACHE:
        import os

        import numpy as np
        from gguf import GGMLQuantizationType, GGUFReader
        from gguf.quants import dequantize, quantize

        from . import FIXTURES
        from .gguf_edit import rewrite_gguf

        src = FIXTURES / "mistral3_tiny-f32.gguf"
        q4 = GGMLQuantizationType.Q4_0
        replace = {}
        for t in GGUFReader(src).tensors:
            if len(t.shape) == 2:
                rows, cols = int(t.shape[1]), int(t.shape[0])
                dense = dequantize(t.data, t.tensor_type).reshape(rows, cols).astype(np.float32)
                replace[t.name] = (quantize(dense, q4), q4)
        os.makedirs(str(tmp_dir), exist_ok=True)
        out = os.path.join(str(tmp_dir), "tiny-model-q4_0.gguf")
        rewrite_gguf(src, out, replace_tensors=replace, set_kv={"general.file_type": 2})
        with open(out, "rb") as f:
            _GGUF_CACHE[key] = f.read()
    return _GGUF_CACHE[key]


MODEL_FILE = "Tiny-Vision-Q8_0.gguf"
PROJ_FILE = "mmproj-Tiny-Vision-f16.gguf"


def tiny_repos(tmp_dir) -> dict[str, FakeRepo]:
    """A public vision repo (model + two projectors + a README), a gated one, a text one.

    The vision repo serves the real tiny fixture model and its projectors (llama.cpp-converted),
    so a download pairs and loads like a real one (the pairing rule reads both headers)."""
    from . import FIXTURES

    model = (FIXTURES / "mistral3_tiny-q8_0.gguf").read_bytes()
    model_q4 = tiny_model_q4_0(tmp_dir)
    proj = (FIXTURES / "mmproj-mistral3_tiny-f16.gguf").read_bytes()
    proj32 = (FIXTURES / "mmproj-mistral3_tiny-f32.gguf").read_bytes()
    return {
        "tiny-org/Tiny-Vision-GGUF": FakeRepo(
            {MODEL_FILE: model, "Tiny-Vision-Q4_0.gguf": model_q4, PROJ_FILE: proj,
             "mmproj-Tiny-Vision-f32.gguf": proj32, "README.md": b"# Tiny vision model\n"},
            downloads=100, likes=3),
        "tiny-org/Tiny-Gated-GGUF": FakeRepo({"Tiny-Gated-Q8_0.gguf": model}, gated=True,
                                             downloads=50),
        "other/Text-Only-GGUF": FakeRepo({"text-only-Q4_0.gguf": model_q4}, downloads=7),
        "other/not-a-gguf-repo": FakeRepo({"model.safetensors": b"\0" * 10}, downloads=1000),
    }
