"""Which distributions ship with the app, and where their licence texts are found.

One rule for both ends: the installer's THIRD_PARTY_NOTICES.txt is generated at package time
(`packaging/third_party_notices.py`, with pip-licenses) for `shipped_distributions()`, and
Help → About shows that file — or, in an installation from source, the same list read from the
installed distributions' metadata.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

NOTICES_NAME = "THIRD_PARTY_NOTICES.txt"
BUNDLE_LICENCES_DIR = "licenses"  # inside the bundle's _internal/ (sys._MEIPASS)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def shipped_distributions(root: str = "tramontane") -> list[metadata.Distribution]:
    """`root` and every distribution its runtime requirements pull in on this platform (extras
    and requirements whose markers do not apply here are left out), sorted by name."""
    from packaging.requirements import Requirement

    seen: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement not installed here is not shipped either
        seen[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=lambda d: _canonical(d.metadata["Name"]))


def licence_of(dist: metadata.Distribution) -> str:
    """The distribution's declared licence: its SPDX expression, else the classifiers' names."""
    meta = dist.metadata
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return expression
    declared = (meta.get("License") or "").strip()
    if declared and "\n" not in declared and len(declared) < 120:
        return declared
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or () if c.startswith("License ::")]
    return "; ".join(classifiers) or "see its files"


def bundled_notices_path() -> Path | None:
    """THIRD_PARTY_NOTICES.txt inside a frozen bundle; None when running from an installation."""
    base = getattr(sys, "_MEIPASS", None)
    if base is None:
        return None
    path = Path(base) / BUNDLE_LICENCES_DIR / NOTICES_NAME
    return path if path.is_file() else None


def notices_text() -> str:
    """What Help → About → Licences shows: the installer's notices file, else the list of
    installed distributions with their declared licences (their texts are in site-packages)."""
    bundled = bundled_notices_path()
    if bundled is not None:
        return bundled.read_text("utf-8", errors="replace")
    lines = ["Tramontane is licensed under the Apache License 2.0.",
             "It runs with these distributions. Installed from source, their licence texts are in",
             f"each one's .dist-info folder; the installers carry them all in {NOTICES_NAME}.", ""]
    for dist in shipped_distributions():
        lines.append(f"{dist.metadata['Name']} {dist.version}: {licence_of(dist)}")
    return "\n".join(lines) + "\n"
