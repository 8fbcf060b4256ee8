"""The catalogue of recommended models (resources/catalog.json): entries, their variants, and
how an entry becomes concrete files of its hub repository."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ..api import Part, ThinkPart
from .hub import Hub, HubError, HubFile, pair_projectors
from .projector import SHARD_RE, quant_from_name


@dataclass(frozen=True)
class CatalogVariant:
    quant: str
    file: str | None  # None: resolved from the repo listing by quant at download time
    size_gb: float | None
    memory_gb: float | None


@dataclass(frozen=True)
class ModelShape:
    """The decoder's dimensions (the model's config.json), so that the device planner can
    estimate where a model not yet downloaded would run."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # the output head reuses the token embedding


SHAPE_FIELDS = ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")
# the chips of the Models dialog ("vision" is the entry's own flag)
CAPABILITIES = ("reasoning", "tools", "coding")


@dataclass(frozen=True)
class Sampling:
    """The sampling Mistral recommends for the model (its model card)."""

    temperature: float
    top_p: float | None = None  # None: the card names none (Ministral 3 Reasoning: a temperature only)


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    name: str
    repo_id: str
    license: str
    vision: bool
    description: str
    variants: tuple[CatalogVariant, ...]
    mmproj_file: str | None
    mmproj_size_gb: float | None
    gated: bool = False
    notes: str = ""
    shape: ModelShape | None = None
    capabilities: tuple[str, ...] = ()  # of CAPABILITIES
    sampling: Sampling | None = None  # None: the catalogue pins none (the app's defaults)
    # the system prompt Mistral ships with the model, as message parts: text, and the thought
    # template reasoning models are shown ([THINK]…[/THINK] chunks); () where none is pinned
    system_prompt: tuple[Part, ...] = ()

    @property
    def mmproj_type(self) -> str | None:
        """The projector's tensor type as its file name says ("F16", "BF16", "Q8_0"); None where
        it says none. What its vision tower keeps once loaded depends on it (library/fit.py)."""
        return quant_from_name(self.mmproj_file) if self.mmproj_file else None

    def variant(self, quant: str | None = None) -> CatalogVariant:
        if quant is None:
            return self.variants[0]
        for v in self.variants:
            if v.quant.upper() == quant.upper():
                return v
        raise HubError(
            f"catalogue entry {self.id!r} has no quantization {quant!r} "
            f"(has {', '.join(v.quant for v in self.variants)})", "not_found")


def _catalog_error(where: str, what: str) -> HubError:
    return HubError(f"catalog.json: {where}: {what}", "bad_data")


def _parse_shape(raw: Any, where: str) -> ModelShape | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _catalog_error(where, "expected an object")
    for key in SHAPE_FIELDS:
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise _catalog_error(f"{where}.{key}", "expected a whole number > 0")
    if not isinstance(raw.get("tied"), bool):
        raise _catalog_error(f"{where}.tied", "expected true or false")
    return ModelShape(*(raw[k] for k in SHAPE_FIELDS), raw["tied"])


def _parse_capabilities(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or any(c not in CAPABILITIES for c in raw):
        raise _catalog_error(where, f"expected a list of {', '.join(CAPABILITIES)}")
    return tuple(raw)


def _parse_sampling(raw: Any, where: str) -> Sampling | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _catalog_error(where, "expected an object with temperature (and top_p where the card names one)")
    values = []
    for key, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = raw.get(key)
        if value is None and key == "top_p":
            values.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise _catalog_error(f"{where}.{key}", f"expected a number from {low} to {high}")
        values.append(float(value))
    return Sampling(*values)


def _parse_system_prompt(raw: Any, where: str) -> tuple[Part, ...]:
    """[{"text": ...} | {"think": ...}, ...] -> text and ThinkPart parts."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise _catalog_error(where, "expected a non-empty list of {\"text\"} / {\"think\"} parts")
    parts: list[Part] = []
    for k, item in enumerate(raw):
        if not (isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), str)
                and next(iter(item)) in ("text", "think")):
            raise _catalog_error(f"{where}[{k}]", "expected {\"text\": ...} or {\"think\": ...}")
        parts.append(item["text"] if "text" in item else ThinkPart(item["think"]))
    return tuple(parts)


def parse_catalog(data: Any) -> list[CatalogEntry]:
    """Validate catalogue JSON (a dict with `models`) into entries; errors name the field."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise _catalog_error("top level", "expected an object with a 'models' list")
    entries = []
    for i, m in enumerate(data["models"]):
        where = f"models[{i}]"
        if not isinstance(m, dict):
            raise _catalog_error(where, "expected an object")
        for key in ("id", "name", "repo_id", "license", "variants"):
            if key not in m:
                raise _catalog_error(where, f"missing field {key!r}")
        if not isinstance(m["variants"], list) or not m["variants"]:
            raise _catalog_error(f"{where}.variants", "expected a non-empty list")
        variants = []
        for j, v in enumerate(m["variants"]):
            if not isinstance(v, dict) or "quant" not in v:
                raise _catalog_error(f"{where}.variants[{j}]", "expected an object with 'quant'")
            variants.append(CatalogVariant(str(v["quant"]), v.get("file"), v.get("size_gb"),
                                           v.get("memory_gb")))
        mmproj = m.get("mmproj") or {}
        entries.append(CatalogEntry(
            id=str(m["id"]), name=str(m["name"]), repo_id=str(m["repo_id"]),
            license=str(m["license"]), vision=bool(m.get("vision", False)),
            description=str(m.get("description", "")), variants=tuple(variants),
            mmproj_file=mmproj.get("file"), mmproj_size_gb=mmproj.get("size_gb"),
            gated=bool(m.get("gated", False)), notes=str(m.get("notes", "")),
            shape=_parse_shape(m.get("shape"), f"{where}.shape"),
            capabilities=_parse_capabilities(m.get("capabilities"), f"{where}.capabilities"),
            sampling=_parse_sampling(m.get("sampling"), f"{where}.sampling"),
            system_prompt=_parse_system_prompt(m.get("system_prompt"), f"{where}.system_prompt"),
        ))
    return entries


def load_catalog() -> list[CatalogEntry]:
    """The recommended models shipped in `tramontane.resources/catalog.json`."""
    text = resources.files("tramontane.resources").joinpath("catalog.json").read_text("utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _catalog_error(f"line {exc.lineno}", exc.msg) from exc
    return parse_catalog(data)


@dataclass
class ResolvedChoice:
    """A catalogue entry turned into concrete hub files (after listing the repo)."""

    entry: CatalogEntry
    model: HubFile
    mmproj: HubFile | None
    warnings: list[str] = field(default_factory=list)


def resolve_catalog_entry(hub: Hub, entry: CatalogEntry, quant: str | None = None
                          ) -> ResolvedChoice:
    """List the entry's repo and find the variant's model file and its projector."""
    variant = entry.variant(quant)
    files = hub.gguf_files(entry.repo_id)
    by_path = {f.path: f for f in files}
    warnings = []
    if variant.file:
        model = by_path.get(variant.file)
        if model is None:
            raise HubError(f"{entry.repo_id}: catalogue file {variant.file!r} is not in the "
                           "repository any more (404).", "not_found")
    else:
        matches = [c.model for c in pair_projectors(files)
                   if (c.model.quant or "").upper() == variant.quant.upper()
                   and not SHARD_RE.search(c.model.name)]
        if not matches:
            raise HubError(f"{entry.repo_id}: no single-file {variant.quant} GGUF in the "
                           "repository.", "not_found")
        model = matches[0]
    mmproj = None
    if entry.mmproj_file:
        mmproj = by_path.get(entry.mmproj_file)
        if mmproj is None:
            warnings.append(f"projector {entry.mmproj_file!r} not in the repository; "
                            "picked another")
    if mmproj is None and entry.vision:
        mmproj = next((c.mmproj for c in pair_projectors(files) if c.model == model), None)
    return ResolvedChoice(entry, model, mmproj, warnings)
