"""GGUF files on this machine: scan the models folder, import, describe, pair, delete.

The models folder holds what the downloader fetched (one sub-folder per repo) and what the
user copied in. Files imported "in place" stay where they are and are remembered in
`imported.json` inside the models folder. Only header bytes are read (memory-mapped), so
scanning many multi-GB files is quick. Nothing in a file is ever executed.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from ...env import read_env
from ..api import EngineError
from .catalog import CatalogEntry
from ..private_files import create_private_file
from .downloads import PART_SUFFIX, SIDECAR_SUFFIX, repo_folder
from .projector import find_projector, is_projector_name, model_folder_path, pair_projector

IMPORTS_FILE = "imported.json"


class LocalModelError(EngineError):
    """A local-file problem; the message names the file."""


def default_models_dir() -> Path:
    """`$TRAMONTANE_MODELS_DIR`, else `<user data dir>/Tramontane/models`."""
    chosen = read_env().models_dir
    if chosen:
        return chosen
    import platformdirs
    return Path(platformdirs.user_data_dir("Tramontane", appauthor=False)) / "models"


@dataclass(frozen=True)
class GGUFHeader:
    architecture: str | None
    name: str | None
    quant: str | None  # most common type among 2-D weights, e.g. 'Q4_K', 'Q8_0', 'F16'
    quant_types: dict[str, int]
    is_projector: bool
    tensor_count: int


@dataclass(frozen=True)
class LocalModel:
    path: Path
    size: int
    header: GGUFHeader | None
    error: str | None  # why the header could not be read (the file is still listed)
    imported_in_place: bool  # lives outside the models folder, referenced from imported.json
    mmproj: Path | None  # for a model: the projector beside it, if any
    # for a model without one: which projectors beside it were refused and why ('' if none was)
    projector_note: str = ""

    @property
    def is_projector(self) -> bool:
        if self.header is not None:
            return self.header.is_projector
        return is_projector_name(self.path.name)

    @property
    def architecture(self) -> str | None:
        return self.header.architecture if self.header else None

    @property
    def quant(self) -> str | None:
        return self.header.quant if self.header else None

    @property
    def folder(self) -> Path:
        """What "open folder" opens."""
        return self.path.parent


def _most_common_quant(types: Counter) -> str | None:
    return types.most_common(1)[0][0] if types else None


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Architecture, name and quantization from a GGUF header (raises LocalModelError)."""
    from ..gguf import open_gguf

    path = Path(path)
    try:
        with open_gguf(path) as gf:
            types = Counter(t.type_name for t in gf.tensors.values() if len(t.shape) == 2)
            is_projector = gf.architecture == "clip" or gf.bool("clip.has_vision_encoder", default=False)
            return GGUFHeader(gf.architecture, gf.string("general.name", default=None),
                              _most_common_quant(types), dict(types.most_common()), is_projector,
                              len(gf.tensors))
    except EngineError as exc:  # GGUFError: the reader's or a metadata key's, naming the file
        raise LocalModelError(str(exc)) from exc
    except OSError as exc:
        raise LocalModelError(f"{path}: cannot read: {exc.strerror or exc}") from exc


# ---------------------------------------------------------------------------------------
# the models folder


def _imports_path(models_dir: Path) -> Path:
    return Path(models_dir) / IMPORTS_FILE


def _load_imports(models_dir: Path) -> list[Path]:
    try:
        data = json.loads(_imports_path(models_dir).read_text("utf-8"))
        return [Path(p) for p in data.get("files", []) if isinstance(p, str)]
    except (OSError, ValueError, AttributeError):
        return []


def _save_imports(models_dir: Path, paths: list[Path]) -> None:
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    tmp = _imports_path(models_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps({"files": [str(p) for p in paths]}, indent=1), "utf-8")
    os.replace(tmp, _imports_path(models_dir))


def _describe(path: Path, imported: bool) -> LocalModel:
    """`path` as the user sees it (a link kept a link): the projector is looked for beside it."""
    try:
        header, error = read_header(path), None
    except LocalModelError as exc:
        header, error = None, str(exc)
    size = path.stat().st_size
    lm = LocalModel(path, size, header, error, imported, None)
    if not lm.is_projector:
        pairing = pair_projector(path)
        lm = replace(lm, mmproj=pairing.projector, projector_note=pairing.note)
    return lm


def describe_model(path: str | os.PathLike) -> LocalModel:
    """One GGUF outside the models folder (a file opened from elsewhere) as the list shows it,
    under the path it was given (a Hugging Face snapshot's link, not its blob)."""
    return _describe(model_folder_path(path), True)


def scan_models(models_dir: str | os.PathLike | None = None) -> list[LocalModel]:
    """Every finished `.gguf` in the models folder (sub-folders too) and every imported one
    that still exists, each once (two links to one file: the first). `.part` downloads are not
    listed: they are not ready. Read afresh on every call (Refresh looks again)."""
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    found: dict[Path, tuple[Path, bool]] = {}  # resolved -> (as the user sees it, imported)
    if models_dir.is_dir():
        for p in sorted(models_dir.rglob("*")):
            if p.is_file() and p.suffix.lower() == ".gguf":
                found.setdefault(p.resolve(), (model_folder_path(p), False))
    for p in _load_imports(models_dir):
        if p.is_file():
            found.setdefault(p.resolve(), (model_folder_path(p), True))
    return [_describe(p, imported) for p, imported in found.values()]


def import_model(src: str | os.PathLike, models_dir: str | os.PathLike | None = None,
                 copy: bool = False) -> LocalModel:
    """Make a GGUF from anywhere available: copy it into the models folder, or reference it
    in place. The header must read as GGUF (so junk is refused with the reason)."""
    src = Path(src).expanduser()
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    if not src.is_file():
        raise LocalModelError(f"{src}: no such file")
    if src.suffix.lower() != ".gguf":
        raise LocalModelError(f"{src}: not a .gguf file")
    read_header(src)  # refuses a broken file with the reason
    if copy:
        dest_dir = models_dir / "imported"
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / src.name
        if dest.exists():
            raise LocalModelError(f"{dest}: a file with this name is already in the models folder")
        part = dest.with_name(dest.name + PART_SUFFIX)
        try:
            os.close(create_private_file(part))  # copyfile keeps an existing file's 0600
            shutil.copyfile(src, part)
            os.replace(part, dest)
        except OSError as exc:
            part.unlink(missing_ok=True)
            raise LocalModelError(f"{src}: cannot copy into {dest_dir}: {exc.strerror or exc}") from exc
        return _describe(dest, False)
    seen = model_folder_path(src)  # remembered as the user sees it: its projector is beside it
    if _inside(seen, models_dir):
        return _describe(seen, False)
    imports = _load_imports(models_dir)
    if seen.resolve() not in [p.resolve() for p in imports]:
        _save_imports(models_dir, imports + [seen])
    return _describe(seen, True)


def catalog_files(models_dir: str | os.PathLike, entry: CatalogEntry,
                  quant: str) -> tuple[Path | None, Path | None]:
    """A catalogue entry's model and projector as they lie in its repository's folder (None
    for each one not there)."""
    v = entry.variant(quant)
    folder = repo_folder(Path(models_dir), entry.repo_id)
    if v.file:
        model = folder / v.file
        if not model.is_file():
            return None, None
    else:
        hits = sorted(p for p in folder.glob(f"*{v.quant}*.gguf")) if folder.is_dir() else []
        hits = [p for p in hits if "mmproj" not in p.name.lower()]
        if not hits:
            return None, None
        model = hits[0]
    mmproj = None
    if entry.vision:
        mmproj = folder / entry.mmproj_file if entry.mmproj_file else find_projector(model)
        if mmproj is None or not mmproj.is_file():
            return model, None
    return model, mmproj


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(Path(folder).resolve())
        return True
    except ValueError:
        return False


def delete_model(path: str | os.PathLike, models_dir: str | os.PathLike | None = None) -> str:
    """Delete a file from the models folder (with any leftover part), or forget an imported
    file without touching it. Returns what was done, in words."""
    path = Path(path).expanduser()
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    resolved = path.resolve()
    imports = _load_imports(models_dir)
    kept = [p for p in imports if p.resolve() != resolved]
    if len(kept) != len(imports):
        _save_imports(models_dir, kept)
        return f"{resolved}: removed from the list (the file itself was left where it is)"
    if not _inside(resolved, models_dir):
        raise LocalModelError(f"{path}: not in the models folder {models_dir}; refusing to delete")
    if not resolved.is_file():
        raise LocalModelError(f"{path}: no such file")
    resolved.unlink()
    for leftover in (resolved.with_name(resolved.name + PART_SUFFIX),
                     resolved.with_name(resolved.name + SIDECAR_SUFFIX)):
        leftover.unlink(missing_ok=True)
    parent = resolved.parent
    if parent != Path(models_dir).resolve() and not any(parent.iterdir()):
        parent.rmdir()
    return f"{resolved}: deleted"
