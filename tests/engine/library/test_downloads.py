"""Downloads from the loopback fake hub: complete, resumed after cuts, pauses and restarts
(with the bytes the server sent counted), verified, refused, cancelled."""
import hashlib
import json
import shutil
import time
from collections import namedtuple

import pytest
from support.fakehub import MODEL_FILE, PROJ_FILE, FakeHub, tiny_repos

from tramontane.engine.library.downloads import (DownloadManager, DownloadRequest, DownloadState,
                                         final_path, part_path, sidecar_path)
from tramontane.engine.library.hub import Hub

REPO = "tiny-org/Tiny-Vision-GGUF"


@pytest.fixture
def fake(tmp_path):
    with FakeHub(tiny_repos(tmp_path / "src"), tokens={"hf_good"}, chunk=8 << 10) as hub:
        yield hub


def manager(fake, models, token=False, **kw):
    kw.setdefault("retry_delay_s", 0.01)
    kw.setdefault("chunk_size", 16 << 10)
    return DownloadManager(models, Hub(endpoint=fake.endpoint, token=token), **kw)


def run(dm, request, timeout=60):
    dm.start(request)
    return dm.wait(request.key, timeout)


def assert_ready(fake, models, name, repo=REPO):
    path = final_path(models, DownloadRequest(repo, name))
    data = fake.repos[repo].files[name]
    assert path.read_bytes() == data
    assert not part_path(path).exists() and not sidecar_path(path).exists()
    return path


def wait_for(cond, timeout=20):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_full_download_of_model_and_projector_in_parallel(fake, tmp_path):
    models = tmp_path / "models"
    dm = manager(fake, models)
    seen = []
    dm.add_listener(seen.append)
    reqs = [DownloadRequest(REPO, MODEL_FILE), DownloadRequest(REPO, PROJ_FILE),
            DownloadRequest(REPO, "README.md")]  # README: git-stored, checked by git oid
    for r in reqs:
        dm.start(r)
    for r in reqs:
        st = dm.wait(r.key, 60)
        assert st.state is DownloadState.DONE, st.error
        assert st.done_bytes == st.total_bytes == len(fake.repos[REPO].files[r.filename])
        assert_ready(fake, models, r.filename)
        assert fake.served(r.filename) == st.total_bytes
    model_events = [s for s in seen if s.key == reqs[0].key]
    done = [s.done_bytes for s in model_events]
    assert done == sorted(done) and done[-1] == model_events[-1].total_bytes
    assert any(s.state is DownloadState.RUNNING and 0 < s.done_bytes < s.total_bytes
               and s.speed_bps > 0 and s.eta_s is not None for s in model_events)
    assert [s.state for s in model_events][-2:] == [DownloadState.VERIFYING, DownloadState.DONE]
    # One repo, one folder: both files land beside each other.
    assert final_path(models, reqs[0]).parent == final_path(models, reqs[1]).parent
    dm.shutdown()


def test_connection_cut_mid_file_resumes_without_refetching(fake, tmp_path):
    size = len(fake.repos[REPO].files[MODEL_FILE])
    fake.faults.cut_at[MODEL_FILE] = [size // 5, size // 2, size - 100]
    dm = manager(fake, tmp_path / "m")
    st = run(dm, DownloadRequest(REPO, MODEL_FILE))
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, tmp_path / "m", MODEL_FILE)
    assert fake.served(MODEL_FILE) == size  # not a byte twice
    ranges = [h.get("range") for m, p, h in fake.requests if m == "GET" and MODEL_FILE in p]
    assert ranges == ["bytes=0-", f"bytes={size // 5}-", f"bytes={size // 2}-",
                      f"bytes={size - 100}-"]


def test_server_ignoring_range_restarts_cleanly(fake, tmp_path):
    size = len(fake.repos[REPO].files[MODEL_FILE])
    fake.faults.cut_at[MODEL_FILE] = [size // 3]
    fake.faults.ignore_range = True
    st = run(manager(fake, tmp_path / "m"), DownloadRequest(REPO, MODEL_FILE))
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, tmp_path / "m", MODEL_FILE)
    assert fake.served(MODEL_FILE) == size + size // 3  # the cut part, then all of it


@pytest.mark.parametrize("name", [MODEL_FILE, "README.md"])
def test_checksum_mismatch_is_rejected_and_never_ready(fake, tmp_path, name):
    fake.faults.corrupt.add(name)
    models = tmp_path / "m"
    st = run(manager(fake, models), DownloadRequest(REPO, name))
    assert st.state is DownloadState.FAILED and st.error_kind == "checksum"
    assert "checksum mismatch" in st.error and name in st.error
    path = final_path(models, DownloadRequest(REPO, name))
    assert not path.exists() and not part_path(path).exists()


def test_expected_sha256_from_caller_is_enforced(fake, tmp_path):
    # LFS file: the hub's etag already says it is another file, so nothing is fetched.
    st = run(manager(fake, tmp_path / "m"), DownloadRequest(REPO, PROJ_FILE, sha256="0" * 64))
    assert st.state is DownloadState.FAILED and st.error_kind == "changed"
    assert fake.served(PROJ_FILE) == 0
    assert not final_path(tmp_path / "m", DownloadRequest(REPO, PROJ_FILE)).exists()
    # git-stored file: fetched, then refused by the caller's sha256.
    st = run(manager(fake, tmp_path / "m"), DownloadRequest(REPO, "README.md", sha256="0" * 64))
    assert st.state is DownloadState.FAILED and st.error_kind == "checksum"
    assert not final_path(tmp_path / "m", DownloadRequest(REPO, "README.md")).exists()


def test_gated_and_missing_are_explained(fake, tmp_path):
    gated = DownloadRequest("tiny-org/Tiny-Gated-GGUF", "Tiny-Gated-Q8_0.gguf")
    st = run(manager(fake, tmp_path / "a"), gated)
    assert st.state is DownloadState.FAILED and st.error_kind == "gated"
    assert "accept its license" in st.error.lower() and "token" in st.error
    st = run(manager(fake, tmp_path / "b", token="hf_good"), gated)
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, tmp_path / "b", gated.filename, repo=gated.repo_id)
    for req, token, code in ((DownloadRequest("nobody/nothing-GGUF", "x.gguf"), False, "401"),
                             (DownloadRequest("nobody/nothing-GGUF", "x.gguf"), "hf_good", "404"),
                             (DownloadRequest(REPO, "no-such-file.gguf"), False, "404")):
        st = run(manager(fake, tmp_path / "c", token=token), req)
        assert st.state is DownloadState.FAILED and st.error_kind == "not_found"
        assert "not found" in st.error and code in st.error and req.repo_id in st.error


def test_disk_full_refuses_before_downloading(fake, tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 4096, 4096))
    models = tmp_path / "m"
    st = run(manager(fake, models), DownloadRequest(REPO, MODEL_FILE))
    assert st.state is DownloadState.FAILED and st.error_kind == "no_space"
    assert "not enough disk space" in st.error
    assert fake.served(MODEL_FILE) == 0
    assert not final_path(models, DownloadRequest(REPO, MODEL_FILE)).exists()


def test_cancel_leaves_nothing(fake, tmp_path):
    fake.faults.delay_per_chunk_s = 0.02
    models = tmp_path / "m"
    dm = manager(fake, models)
    req = DownloadRequest(REPO, MODEL_FILE)
    dm.start(req)
    wait_for(lambda: dm.status(req.key).done_bytes > 0)
    dm.cancel(req.key)
    st = dm.wait(req.key, 20)
    assert st.state is DownloadState.CANCELLED
    path = final_path(models, req)
    assert not path.exists() and not part_path(path).exists() and not sidecar_path(path).exists()


def test_pause_then_resume_continues_the_part(fake, tmp_path):
    fake.faults.delay_per_chunk_s = 0.01
    models = tmp_path / "m"
    dm = manager(fake, models)
    req = DownloadRequest(REPO, MODEL_FILE)
    dm.start(req)
    wait_for(lambda: dm.status(req.key).done_bytes > 50_000)
    dm.pause(req.key)
    st = dm.wait(req.key, 20)
    assert st.state is DownloadState.PAUSED
    path = final_path(models, req)
    assert not path.exists() and part_path(path).stat().st_size == st.done_bytes > 0
    fake.faults.delay_per_chunk_s = 0
    dm.resume(req.key)
    st = dm.wait(req.key, 30)
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, models, MODEL_FILE)
    assert fake.served(MODEL_FILE) <= len(fake.repos[REPO].files[MODEL_FILE]) + (16 << 10)


def test_restart_resumes_from_the_part_on_disk(fake, tmp_path):
    size = len(fake.repos[REPO].files[MODEL_FILE])
    fake.faults.cut_at[MODEL_FILE] = [size // 3]
    models = tmp_path / "m"
    first = manager(fake, models, max_retries=0)  # the "app" dies at the first cut
    st = run(first, DownloadRequest(REPO, MODEL_FILE))
    assert st.state is DownloadState.FAILED and st.error_kind == "network"
    assert "resumed" in st.error
    first.shutdown()
    path = final_path(models, DownloadRequest(REPO, MODEL_FILE))
    assert part_path(path).stat().st_size == size // 3 and not path.exists()

    second = manager(fake, models)  # a new process: only the files on disk
    pending = second.unfinished_requests()
    assert [r.filename for r in pending] == [MODEL_FILE]
    st = run(second, pending[0])
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, models, MODEL_FILE)
    assert fake.served(MODEL_FILE) == size
    gets = [h.get("range") for m, p, h in fake.requests if m == "GET" and MODEL_FILE in p]
    assert gets[-1] == f"bytes={size // 3}-"


def test_restart_after_the_file_changed_starts_over(fake, tmp_path):
    size = len(fake.repos[REPO].files[MODEL_FILE])
    models = tmp_path / "m"
    req = DownloadRequest(REPO, MODEL_FILE)
    path = final_path(models, req)
    path.parent.mkdir(parents=True)
    part_path(path).write_bytes(b"x" * 1000)  # a part of some older version of the file
    sidecar_path(path).write_text(json.dumps({"repo_id": REPO, "filename": MODEL_FILE,
                                              "size": size, "sha256": "1" * 64, "etag": "1" * 64}))
    st = run(manager(fake, models), req)
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, models, MODEL_FILE)
    assert fake.served(MODEL_FILE) == size


def test_cdn_redirect_gets_no_token_and_works(tmp_path):
    repos = tiny_repos(tmp_path / "src")
    with FakeHub(repos, tokens={"hf_good"}, cdn=True) as fake:
        size = len(repos["tiny-org/Tiny-Gated-GGUF"].files["Tiny-Gated-Q8_0.gguf"])
        fake.faults.cut_at["Tiny-Gated-Q8_0.gguf"] = [size // 2]
        req = DownloadRequest("tiny-org/Tiny-Gated-GGUF", "Tiny-Gated-Q8_0.gguf")
        st = run(manager(fake, tmp_path / "m", token="hf_good"), req)
        assert st.state is DownloadState.DONE, st.error
        assert_ready(fake, tmp_path / "m", req.filename, repo=req.repo_id)
        cdn_gets = [h for m, p, h in fake.requests if p.startswith("/blob/")]
        hub_heads = [h for m, p, h in fake.requests if "/resolve/" in p and m == "HEAD"]
        assert len(cdn_gets) == 2 and all("authorization" not in h for h in cdn_gets)
        assert all(h.get("authorization") == "Bearer hf_good" for h in hub_heads)
        assert fake.served(req.filename) == size


def test_offline_mode_downloads_nothing(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = run(manager(fake, tmp_path / "m"), DownloadRequest(REPO, MODEL_FILE))
    assert st.state is DownloadState.FAILED and st.error_kind == "offline"
    assert fake.requests == []


def test_server_errors_are_retried_then_reported(fake, tmp_path):
    fake.faults.fail_status[MODEL_FILE] = 503
    st = run(manager(fake, tmp_path / "m", max_retries=2), DownloadRequest(REPO, MODEL_FILE))
    assert st.state is DownloadState.FAILED and st.error_kind == "network"
    gets = [p for m, p, h in fake.requests if m == "GET" and MODEL_FILE in p]
    assert len(gets) == 3


def test_existing_verified_file_is_not_downloaded_again(fake, tmp_path):
    models = tmp_path / "m"
    dm = manager(fake, models)
    req = DownloadRequest(REPO, PROJ_FILE)
    assert run(dm, req).state is DownloadState.DONE
    served = fake.served(PROJ_FILE)
    dm2 = manager(fake, models)
    st = run(dm2, req)
    assert st.state is DownloadState.DONE and fake.served(PROJ_FILE) == served
    assert hashlib.sha256(st.path.read_bytes()).hexdigest() == fake.sha256(REPO, PROJ_FILE)


def test_listener_errors_do_not_break_downloads(fake, tmp_path):
    dm = manager(fake, tmp_path / "m")
    dm.add_listener(lambda s: 1 / 0)
    assert run(dm, DownloadRequest(REPO, PROJ_FILE)).state is DownloadState.DONE


def test_unsafe_paths_are_refused(tmp_path):
    from tramontane.engine.library.hub import HubError
    for repo, name in ((REPO, "../evil.gguf"), ("/abs", "x.gguf"), (REPO, "a/../../b.gguf")):
        with pytest.raises(HubError, match="not a safe file path"):
            final_path(tmp_path, DownloadRequest(repo, name))
    assert final_path(tmp_path, DownloadRequest(REPO, "sub/x.gguf")) == \
        tmp_path / "tiny-org__Tiny-Vision-GGUF" / "sub" / "x.gguf"


def test_queue_limit_and_cancel_while_queued(fake, tmp_path):
    fake.faults.delay_per_chunk_s = 0.01
    dm = manager(fake, tmp_path / "m", max_parallel=1)
    a, b = DownloadRequest(REPO, MODEL_FILE), DownloadRequest(REPO, PROJ_FILE)
    dm.start(a)
    wait_for(lambda: dm.status(a.key).done_bytes > 0)
    dm.start(b)
    time.sleep(0.1)
    assert dm.status(b.key).state is DownloadState.QUEUED  # one slot, taken by a
    dm.cancel(b.key)
    assert dm.wait(b.key, 30).state is DownloadState.CANCELLED
    fake.faults.delay_per_chunk_s = 0
    assert dm.wait(a.key, 30).state is DownloadState.DONE
    assert not any(PROJ_FILE in p for _, p, _ in fake.requests)


def test_shutdown_pauses_and_keeps_the_part(fake, tmp_path):
    fake.faults.delay_per_chunk_s = 0.02
    dm = manager(fake, tmp_path / "m")
    req = DownloadRequest(REPO, MODEL_FILE)
    dm.start(req)
    wait_for(lambda: dm.status(req.key).done_bytes > 0)
    dm.shutdown(wait=True)
    st = dm.status(req.key)
    assert st.state is DownloadState.PAUSED
    assert part_path(st.path).stat().st_size == st.done_bytes and not st.path.exists()


def test_two_managers_never_write_the_same_part(fake, tmp_path):
    fake.faults.delay_per_chunk_s = 0.01
    req = DownloadRequest(REPO, MODEL_FILE)
    one, two = manager(fake, tmp_path / "m"), manager(fake, tmp_path / "m")
    one.start(req)
    wait_for(lambda: one.status(req.key).done_bytes > 0)
    st = run(two, req)
    assert st.state is DownloadState.FAILED and st.error_kind == "busy"
    fake.faults.delay_per_chunk_s = 0
    assert one.wait(req.key, 30).state is DownloadState.DONE
    assert_ready(fake, tmp_path / "m", MODEL_FILE)


def test_pause_during_a_stalled_read_is_immediate(fake, tmp_path):
    size = len(fake.repos[REPO].files[MODEL_FILE])
    fake.faults.stall_at[MODEL_FILE] = size // 2
    dm = manager(fake, tmp_path / "m", read_timeout_s=60)
    req = DownloadRequest(REPO, MODEL_FILE)
    dm.start(req)
    wait_for(lambda: dm.status(req.key).done_bytes == size // 2)
    time.sleep(0.2)  # now blocked in a read that would wait 60 s
    t0 = time.monotonic()
    dm.pause(req.key)
    st = dm.wait(req.key, 10)
    assert st.state is DownloadState.PAUSED and time.monotonic() - t0 < 5
    assert part_path(st.path).stat().st_size == size // 2
    fake.faults.stall_at.clear()
    fake.faults.release.set()
    assert run(dm, req).state is DownloadState.DONE
    assert_ready(fake, tmp_path / "m", MODEL_FILE)


def test_disk_filling_up_mid_download_is_reported_and_resumable(fake, tmp_path, monkeypatch):
    import builtins
    import errno

    from tramontane.engine.library import downloads

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            if self.f.tell() + len(data) > 100_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def full_open(path, mode="r", *a, **kw):
        f = builtins.open(path, mode, *a, **kw)
        return FullDisk(f) if mode == "ab" else f

    monkeypatch.setattr(downloads, "open", full_open, raising=False)
    models = tmp_path / "m"
    req = DownloadRequest(REPO, MODEL_FILE)
    st = run(manager(fake, models), req)
    assert st.state is DownloadState.FAILED and st.error_kind == "no_space"
    assert "No space left" in st.error and MODEL_FILE in st.error
    assert not st.path.exists() and 0 < part_path(st.path).stat().st_size <= 100_000
    monkeypatch.undo()  # space freed: the retry continues the part
    st = run(manager(fake, models), req)
    assert st.state is DownloadState.DONE, st.error
    assert_ready(fake, models, MODEL_FILE)
