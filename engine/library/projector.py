"""Which vision projector belongs to which model: the one pairing rule for the CLI, the window
and the hub's file lists.

A projector belongs to a model only when its output width equals the model's hidden size (read
from both headers, nothing loaded). Among those, a name match wins over "the only mmproj in the
folder": the projector's name with `mmproj` and the quantization taken out equals the model's
(llama.cpp's `mmproj-<model>-f16.gguf`), or is the conventional `mistral3-mmproj.gguf`; then
names that merely contain the model's name or mention Mistral; then any other. Ties go to f16
(what converters write by default), then bf16, f32, q8_0, then the name. A projector of another
width is never paired, and never loaded (`mistral3.config.check_pair` refuses it, naming both
files). "Beside" means in the folder the user sees: a Hugging Face snapshot's links, not the
blobs they point to.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..api import EngineError
from ..gguf import GGUFError
from ..mistral3.config import ProjectorMismatchError, check_pair, model_hidden_size

CONVENTIONAL_NAME = "mistral3-mmproj.gguf"
PROJECTOR_NAME_RE = re.compile(r"mmproj", re.IGNORECASE)
# Quantization names as they appear in GGUF file names (longest alternatives first).
QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(IQ\d_(?:XXS|XS|S|M|NL)|Q\d_K_(?:XL|S|M|L)|Q\d_K|Q\d_\d|TQ\d_\d|"
    r"BF16|F16|F32|FP16|FP32|MXFP4)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
QUANT_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")


def quant_from_name(name: str) -> str | None:
    """'model-Q4_K_M.gguf' -> 'Q4_K_M' (upper case); None when the name carries none."""
    found = QUANT_RE.findall(_stem(name))
    return found[-1].upper() if found else None


def is_projector_name(name: str) -> bool:
    return name.lower().endswith(".gguf") and bool(PROJECTOR_NAME_RE.search(name))


def _stem(name: str) -> str:
    return re.sub(r"\.gguf$", "", SHARD_RE.sub(".gguf", PurePosixPath(name).name), flags=re.IGNORECASE)


def _base(name: str) -> str:
    """The name without extension, shard suffix, quantization and `mmproj`, lower case."""
    s = QUANT_RE.sub("", PROJECTOR_NAME_RE.sub("", _stem(name)))
    return re.sub(r"[-_. ]+", "-", s).strip("-").lower()


def name_rank(model_name: str, projector_name: str) -> tuple:
    """Sort key (smaller = better) of a projector for a model by file names alone."""
    model, proj = _base(model_name), _base(projector_name)
    if proj == model or PurePosixPath(projector_name).name.lower() == CONVENTIONAL_NAME:
        match = 0
    elif model and (model in proj or proj and proj in model):
        match = 1
    elif "istral" in projector_name.lower():
        match = 2
    else:
        match = 3
    quant = quant_from_name(projector_name) or ""
    preference = QUANT_PREFERENCE.index(quant) if quant in QUANT_PREFERENCE else len(QUANT_PREFERENCE)
    return (match, preference, projector_name)


def model_folder_path(path: str | os.PathLike) -> Path:
    """A file's path as the user sees it: absolute, `..` folded, symbolic links kept (a Hugging
    Face snapshot's `model.gguf`, not the blob in `blobs/` it links to)."""
    return Path(os.path.abspath(Path(path).expanduser()))


def projector_candidates(model_path: str | os.PathLike) -> list[Path]:
    """Every projector-looking GGUF beside the model, best name first (widths unchecked).

    "Beside" is the folder the user sees (a Hugging Face snapshot: links into `blobs/`, where
    the names are hashes); a linked model's target folder is looked in after it."""
    model = model_folder_path(model_path)
    folders = [model.parent]
    target = model.resolve().parent
    if target != model.parent:
        folders.append(target)
    seen, out = {model.resolve()}, []
    for folder in folders:
        try:
            files = [p for p in folder.iterdir() if p.is_file()
                     and (is_projector_name(p.name) or p.name.lower() == CONVENTIONAL_NAME)]
        except OSError:
            continue
        for p in sorted(files, key=lambda p: name_rank(model.name, p.name)):
            if p.resolve() not in seen:
                seen.add(p.resolve())
                out.append(p)
    return out


@dataclass(frozen=True)
class ProjectorCheck:
    """One projector for one model: `reason` is '' when it fits, else why it was refused (one
    sentence naming the file)."""

    path: Path
    reason: str = ""

    @property
    def fits(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class Pairing:
    """What the pairing rule found for a model: the projector (None: text only) and the
    projectors beside it that were refused, each with its reason."""

    projector: Path | None
    refused: tuple[ProjectorCheck, ...] = ()

    @property
    def note(self) -> str:
        """'' when a projector was paired or none was beside the model; else which projectors
        were refused and why, for the window to show (the model then loads text only)."""
        if self.projector is not None or not self.refused:
            return ""
        return " ".join(c.reason for c in self.refused) + " The model loads without vision."


def check_projector(model_path: str | os.PathLike, projector_path: str | os.PathLike,
                    hidden: int | None = None) -> ProjectorCheck:
    """Whether a projector (beside the model or picked by hand) fits the model: the width rule
    of `mistral3.config.check_pair`, its refusal's words as the reason."""
    projector = Path(projector_path)
    try:
        check_pair(model_path, projector, hidden)
    except ProjectorMismatchError as exc:
        return ProjectorCheck(projector, f"{exc}.")
    except (GGUFError, EngineError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return ProjectorCheck(projector, f"{projector.name} is not a vision projector this app "
                                         f"reads ({why}).")
    return ProjectorCheck(projector)


def pair_projector(model_path: str | os.PathLike) -> Pairing:
    """The projector that belongs to the model, from the files beside it, with the ones refused
    on the way; none when none fits (or the model itself cannot be read: loading it says why)."""
    try:
        hidden = model_hidden_size(model_path)
    except (GGUFError, EngineError, OSError):
        return Pairing(None)
    refused = []
    for candidate in projector_candidates(model_path):
        check = check_projector(model_path, candidate, hidden)
        if check.fits:
            return Pairing(candidate, tuple(refused))
        refused.append(check)
    return Pairing(None, tuple(refused))


def find_projector(model_path: str | os.PathLike) -> Path | None:
    """The projector that belongs to the model, from the files beside it; None when none does
    (or the model itself cannot be read: loading it says why)."""
    return pair_projector(model_path).projector


def projector_choices(model_path: str | os.PathLike) -> list[ProjectorCheck | None]:
    """What a user may choose for a model by hand: every projector beside it that fits, the
    rule's own choice first, then None ("none": text only). A file picked from elsewhere is
    checked with `check_projector` before it is offered."""
    try:
        hidden = model_hidden_size(model_path)
    except (GGUFError, EngineError, OSError):
        return [None]
    checks = [check_projector(model_path, p, hidden) for p in projector_candidates(model_path)]
    return [c for c in checks if c.fits] + [None]
