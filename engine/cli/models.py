"""`tramontane-cli models list|search|download|verify|delete`.

Registered in the one parser (engine/cli/main.py), whose handler turns errors into one line and
exit code 2; `verify` exits 1 when a file's checksum does not match.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from ..library.catalog import load_catalog, resolve_catalog_entry
from ..library.downloads import (DownloadManager, DownloadRequest, DownloadState, final_path,
                                 git_blob_oid, load_manifest, sha256_file, size_text)
from ..library.fit import catalog_bytes, catalog_size_text, fit_of_catalog_entry
from ..library.hub import Hub, HubError, ModelChoice
from ..library.models_folder import (LocalModelError, catalog_files, default_models_dir, delete_model,
                             read_header, scan_models)


def _models_dir(args) -> Path:
    return Path(args.dir).expanduser() if getattr(args, "dir", None) else default_models_dir()


def _hub(args) -> Hub:
    return Hub(endpoint=getattr(args, "endpoint", None), token=getattr(args, "token", None),
               offline=True if getattr(args, "offline", False) else None)


# ---------------------------------------------------------------------------------------


def _list(args) -> int:
    models_dir = _models_dir(args)
    if args.catalog:
        return _list_catalog(args, models_dir)
    models = scan_models(models_dir)
    offline_dm = DownloadManager(models_dir, hub=Hub(offline=True))
    pending = offline_dm.unfinished_requests()
    if args.json:
        print(json.dumps({
            "models_dir": str(models_dir),
            "files": [{"path": str(m.path), "size": m.size, "architecture": m.architecture,
                       "quant": m.quant, "projector": m.is_projector,
                       "mmproj": str(m.mmproj) if m.mmproj else None,
                       "imported_in_place": m.imported_in_place, "error": m.error}
                      for m in models],
            "unfinished_downloads": [r.key for r in pending],
        }, indent=2))
        return 0
    print(f"models folder: {models_dir}")
    if not models:
        print("  (no GGUF files; try `tramontane-cli models download <catalogue id>`)")
    for m in models:
        kind = "projector" if m.is_projector else "model"
        facts = m.error or f"{m.architecture or '?'} {m.quant or '?'}"
        extra = f"  + {m.mmproj.name}" if m.mmproj else ""
        print(f"  {kind:<9} {size_text(m.size):>9}  {facts:<18} {m.path}{extra}")
    for r in pending:
        part = offline_dm.partial_bytes(r)
        print(f"  unfinished {size_text(part):>8}  {r.key}  (resume with `models download "
              f"{r.repo_id} --file {r.filename}`)")
    return 0


def _list_catalog(args, models_dir: Path) -> int:
    """The catalogue with what the Models dialog shows: the download's size and where the
    planner would run each entry on this machine (the files' own plan once downloaded)."""
    from ..runtime.device_map import detect_machine

    machine = detect_machine()
    local = {m.path.name for m in scan_models(models_dir)}
    rows, shown = [], []
    for e in load_catalog():
        for v in e.variants:
            sizes = catalog_bytes(e, v.quant)
            fit = fit_of_catalog_entry(e, sizes, catalog_files(models_dir, e, v.quant), machine)
            rows.append({"id": e.id, "name": e.name, "repo": e.repo_id, "quant": v.quant,
                         "file": v.file, "size_gb": v.size_gb, "memory_gb": v.memory_gb,
                         "projector": e.mmproj_file, "license": e.license,
                         "installed": bool(v.file and v.file in local),
                         "fits": fit.kind if fit else None, "fit_detail": fit.detail if fit else None})
            shown.append((catalog_size_text(sizes), fit.words if fit else "? (size not known)"))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r, (size, fit) in zip(rows, shown):
        mark = "*" if r["installed"] else " "
        print(f"{mark} {r['id']:<34} {r['quant']:<7} {size:>20}  {fit:<18}  {r['license']}  {r['repo']}")
    return 0


def _search(args) -> int:
    hub = _hub(args)
    if args.repo:
        choices = hub.model_choices(args.repo)
        if args.json:
            print(json.dumps([_choice_json(c) for c in choices], indent=2))
            return 0
        if not choices:
            print(f"{args.repo}: no GGUF model files")
        for c in choices:
            proj = f"  + {c.mmproj.path} ({size_text(c.mmproj.size)})" if c.mmproj else ""
            print(f"  {c.model.quant or '?':<8} {size_text(c.model.size):>9}  {c.model.path}{proj}")
        return 0
    found = hub.search(args.query or "", limit=args.limit)
    if args.json:
        print(json.dumps([r.__dict__ for r in found], indent=2))
        return 0
    if not found:
        print(f"no GGUF repositories match {args.query!r}")
    for r in found:
        gated = "  (gated: accept the license on the hub)" if r.gated else ""
        print(f"  {r.repo_id:<60} {r.downloads or 0:>9} downloads{gated}")
    return 0


def _choice_json(c: ModelChoice) -> dict:
    f = lambda h: None if h is None else {"path": h.path, "size": h.size,  # noqa: E731
                                         "sha256": h.sha256, "quant": h.quant}
    return {"model": f(c.model), "mmproj": f(c.mmproj)}


def _pick_files(hub: Hub, args) -> list[DownloadRequest]:
    """Catalogue id, or repo id (+ --file or --quant): the model and its projector."""
    target = args.target
    catalog = {e.id: e for e in load_catalog()}
    if target in catalog:
        resolved = resolve_catalog_entry(hub, catalog[target], args.quant)
        for w in resolved.warnings:
            print(f"warning: {w}", file=sys.stderr)
        model, mmproj = resolved.model, resolved.mmproj
    else:
        if "/" not in target:
            raise HubError(f"{target!r}: not a catalogue id ({', '.join(catalog)}) nor a "
                           "repository id like owner/name", "not_found")
        choices = hub.model_choices(target)
        if args.file:
            files = {f.path: f for f in hub.list_files(target)}
            if args.file not in files:
                raise HubError(f"{target}: file {args.file!r} not found in the repository "
                               "(404).", "not_found")
            match = [c for c in choices if c.model.path == args.file]
            model = files[args.file]
            mmproj = match[0].mmproj if match else None
        else:
            if args.quant:
                choices = [c for c in choices if (c.model.quant or "").upper() == args.quant.upper()]
            if len(choices) != 1:
                options = ", ".join(c.model.path for c in hub.model_choices(target)) or "none"
                raise HubError(f"{target}: choose a file with --file or --quant (GGUF models: "
                               f"{options})", "not_found")
            model, mmproj = choices[0].model, choices[0].mmproj
    files = [model] + ([mmproj] if mmproj is not None and not args.no_mmproj else [])
    return [DownloadRequest(f.repo_id, f.path, f.revision, f.sha256, f.size) for f in files]


def _download(args) -> int:
    hub = _hub(args)
    models_dir = _models_dir(args)
    requests = _pick_files(hub, args)
    dm = DownloadManager(models_dir, hub=hub)
    lock = threading.Lock()
    last_print = [0.0]
    tty = sys.stderr.isatty()

    def show(st):
        now = time.monotonic()
        with lock:
            if st.state is DownloadState.RUNNING and now - last_print[0] < (0.5 if tty else 5):
                return
            last_print[0] = now
            pct = f"{100 * st.fraction:5.1f}%" if st.fraction is not None else "  ?  "
            eta = f" ETA {st.eta_s:4.0f}s" if st.eta_s is not None else ""
            speed = f" {st.speed_bps / 1e6:6.1f} MB/s" if st.speed_bps else ""
            line = (f"{st.state.value:<9} {pct} {size_text(st.done_bytes)}/{size_text(st.total_bytes)}"
                    f"{speed}{eta}  {Path(st.request.filename).name}")
            print(("\r" if tty and st.state is DownloadState.RUNNING else "") + line,
                  end="" if tty and st.state is DownloadState.RUNNING else "\n",
                  file=sys.stderr, flush=True)

    if not args.quiet:
        dm.add_listener(show)
    for r in requests:
        dm.start(r)
    failed = []
    try:
        for r in requests:
            st = dm.wait(r.key)
            if st.state is not DownloadState.DONE:
                failed.append(st)
    except KeyboardInterrupt:
        dm.shutdown(wait=True)
        print("\npaused; the partial files are kept — run the same command to resume",
              file=sys.stderr)
        return 130
    dm.shutdown()
    for st in failed:
        print(f"error: {st.error}", file=sys.stderr)
    if failed:
        return 2
    for r in requests:
        print(final_path(models_dir, r))
    return 0


def _verify(args) -> int:
    models_dir = _models_dir(args)
    manifest = load_manifest(models_dir)
    paths = [Path(p) for p in args.paths] if args.paths else [m.path for m in scan_models(models_dir)]
    bad = 0
    for path in paths:
        try:
            rel = path.resolve().relative_to(models_dir.resolve()).as_posix()
        except ValueError:
            rel = None
        record = manifest.get(rel) if rel else None
        if not path.is_file():
            print(f"MISSING   {path}")
            bad += 1
            continue
        problem = None
        try:
            read_header(path)
        except LocalModelError as exc:
            problem = str(exc)
        if problem is None and record and record.get("size") not in (None, path.stat().st_size):
            problem = f"size {path.stat().st_size}, expected {record['size']}"
        if problem is None and record and record.get("sha256"):
            digest = sha256_file(path)
            if digest != record["sha256"]:
                problem = f"sha256 {digest}, expected {record['sha256']}"
        elif problem is None and record and record.get("git_oid"):
            if git_blob_oid(path) != record["git_oid"]:
                problem = "git oid differs from the hub's"
        if problem:
            bad += 1
            print(f"BAD       {path}: {problem}")
        else:
            how = "sha256 ok" if record and record.get("sha256") else "header ok (no checksum recorded)"
            print(f"OK        {path} ({how})")
    return 1 if bad else 0


def _delete(args) -> int:
    models_dir = _models_dir(args)
    for p in args.paths:
        print(delete_model(p, models_dir))
    return 0


# ---------------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser, hub: bool = False) -> None:
    p.add_argument("--dir", help="models folder (default: $TRAMONTANE_MODELS_DIR or the "
                                 "user data folder)")
    p.add_argument("--json", action="store_true")
    if hub:
        p.add_argument("--endpoint", help="hub URL or mirror (default: $HF_ENDPOINT)")
        p.add_argument("--token", help="hub token for gated repos (default: HF_TOKEN / login)")
        p.add_argument("--offline", action="store_true", help="never touch the network")


def add_parsers(subparsers) -> argparse.ArgumentParser:
    models = subparsers.add_parser("models", help="list, search, download, verify, delete models")
    sub = models.add_subparsers(dest="models_command", required=True)

    p = sub.add_parser("list", help="GGUF files on disk (never uses the network)")
    _common(p)
    p.add_argument("--catalog", action="store_true", help="the recommended models instead")
    p.set_defaults(models_func=_list)

    p = sub.add_parser("search", help="GGUF repos on the hub, or one repo's files")
    _common(p, hub=True)
    p.add_argument("query", nargs="?")
    p.add_argument("--repo", help="list this repository's GGUF files with their projector")
    p.add_argument("--limit", type=int, default=30)
    p.set_defaults(models_func=_search)

    p = sub.add_parser("download", help="download a catalogue model or a repo's file "
                                        "(resumes unfinished downloads)")
    _common(p, hub=True)
    p.add_argument("target", help="catalogue id or repository id")
    p.add_argument("--quant", help="quantization, e.g. Q4_K_M")
    p.add_argument("--file", help="file path inside the repository")
    p.add_argument("--no-mmproj", action="store_true", help="skip the vision projector")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(models_func=_download)

    p = sub.add_parser("verify", help="re-check files against the recorded sha256")
    _common(p)
    p.add_argument("paths", nargs="*")
    p.set_defaults(models_func=_verify)

    p = sub.add_parser("delete", help="delete a file from the models folder (imported "
                                      "files are only forgotten)")
    _common(p)
    p.add_argument("paths", nargs="+")
    p.set_defaults(models_func=_delete)

    models.set_defaults(func=lambda args: args.models_func(args))
    return models
