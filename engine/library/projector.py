"""Which vision projector belongs to which model: the one pairing rule for the CLI, the window
and the hub's file lists.

A projector belongs to a model only when its output width equals the model's hidden size (read
from both headers, nothing loaded). Among those, a name match wins over "the only mmproj in the
folder": the projector's name with `mmproj` and the quantization taken out equals the model's
(llama.cpp's `mmproj-<model>-f16.gguf`), or is the conventional `mistral3-mmproj.gguf`; then
names that merely contain the model's name or mention Mistral; then any other. Ties go to f16
(what converters write by default), then bf16, f32, q8_0, then the name. A projector of another
width is never paired, and never loaded (`mistral3.config.check_pair` refuses it, naming both
files).
"""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from ..api import EngineError
from ..gguf import GGUFError
from ..mistral3.config import model_hidden_size, projector_output_width

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


def projector_candidates(model_path: str | os.PathLike) -> list[Path]:
    """Every projector-looking GGUF beside the model, best name first (widths unchecked)."""
    model = Path(model_path)
    folder = model.resolve().parent
    try:
        files = [p for p in folder.iterdir() if p.is_file() and p.name != model.name
                 and (is_projector_name(p.name) or p.name.lower() == CONVENTIONAL_NAME)]
    except OSError:
        return []
    return sorted(files, key=lambda p: name_rank(model.name, p.name))


def find_projector(model_path: str | os.PathLike) -> Path | None:
    """The projector that belongs to the model, from the files beside it; None when none does
    (or the model itself cannot be read: loading it will say why)."""
    try:
        hidden = model_hidden_size(model_path)
    except (GGUFError, EngineError, OSError):
        return None
    for candidate in projector_candidates(model_path):
        try:
            if projector_output_width(candidate) == hidden:
                return candidate
        except (GGUFError, EngineError, OSError):
            continue  # broken or not a Pixtral projector: never paired
    return None
