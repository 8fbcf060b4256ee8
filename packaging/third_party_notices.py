"""Writes THIRD_PARTY_NOTICES.txt for the installers, from the shipped distributions' own metadata.

    python packaging/third_party_notices.py OUT_DIR

Run with the Python the bundle is built from (the app installed, and pip-licenses). The list of
distributions is `tramontane.app.licences.shipped_distributions()` (the app's runtime
requirements, closed over); pip-licenses reads each one's licence, URL, licence and notice
files; every other file a distribution lists under its `licenses/` folder (PEP 639: torch ships
its third-party licences there) is appended. One that ships no licence file but states its
licence in its modules' header (nvidia-ml-py) gets that header. A distribution that declares a licence but ships
no text (Qt's PySide6 and shiboken6 wheels: LGPL-3.0; tokenizers: Apache-2.0) gets the standard
text (packaging/licenses/, or the project's own LICENSE for Apache-2.0). Also copies the project's LICENSE next to it. Exits 1, naming the
distribution, when one has neither a text nor a standard text to stand in.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# declared licence (a substring of it) -> the standard texts that stand in when a wheel ships none
STANDARD_TEXTS = {
    "LGPL-3.0": [HERE / "licenses" / "LGPL-3.0.txt", HERE / "licenses" / "GPL-3.0.txt"],  # an addendum to GPL-3.0
    "Apache": [HERE.parent / "LICENSE"],  # the Apache License 2.0, as the project's own
}
RULE = "=" * 78


def pip_licenses(names: list[str]) -> dict[str, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "piplicenses", "--format=json", "--with-license-file", "--with-notice-file",
         "--no-license-path", "--with-urls", "--packages", *names],
        check=True, capture_output=True, text=True).stdout
    return {entry["Name"].lower().replace("_", "-"): entry for entry in json.loads(out)}


def extra_licence_files(dist, already: str) -> list[tuple[str, str]]:
    """Files under the distribution's licenses/ folder whose text is not already included."""
    found = []
    for f in dist.files or ():
        parts = Path(str(f)).parts
        if len(parts) > 2 and parts[0].endswith(".dist-info") and parts[1] == "licenses":
            path = Path(f.locate())
            text = path.read_text("utf-8", errors="replace") if path.is_file() else ""
            if text.strip() and text.strip() not in already:
                found.append(("/".join(parts[2:]), text))
    return found


def source_header(dist) -> str:
    """The licence a distribution without licence files states at the top of its own modules
    (nvidia-ml-py: pynvml.py's BSD header): each distinct leading comment block of its top-level
    .py files that names a copyright and grants permission."""
    found: dict[str, str] = {}
    for f in sorted(dist.files or (), key=str):
        parts = Path(str(f)).parts
        path = Path(f.locate())
        if len(parts) != 1 or not parts[0].endswith(".py") or not path.is_file():
            continue
        lines = []
        for line in path.read_text("utf-8", errors="replace").splitlines():
            if not line.startswith("#"):
                break
            lines.append(line.strip("#").strip())
        text = "\n".join(lines).strip()
        if "Copyright" in text and re.search(r"Redistribution|Permission is hereby granted", text):
            found.setdefault(text, parts[0])
    return "\n\n".join(f"--- {name} (its header) ---\n{text}" for text, name in found.items())


def notices(dists) -> tuple[str, list[str]]:
    from tramontane.app.licences import licence_of

    names = [d.metadata["Name"] for d in dists]
    info = pip_licenses(names)
    chunks, missing = [], []
    header = ["Tramontane ships with the following software. Each section names a distribution, its",
              "version, its declared licence and home page, then the licence and notice texts it carries.", ""]
    for dist in dists:
        name = dist.metadata["Name"]
        entry = info.get(name.lower().replace("_", "-"), {})
        licence = licence_of(dist)
        texts = [entry.get(k, "UNKNOWN") for k in ("LicenseText", "NoticeText")]
        body = "\n\n".join(t for t in texts if t and t != "UNKNOWN")
        extra = extra_licence_files(dist, body)
        body += "".join(f"\n\n--- {path} ---\n{text}" for path, text in extra)
        if not body.strip():
            body = source_header(dist)
        if not body.strip():
            standard = next((files for spdx, files in STANDARD_TEXTS.items() if spdx in licence), None)
            if standard is None:
                missing.append(f"{name} {dist.version} ({licence})")
                continue
            body = "\n\n".join(f.read_text("utf-8") for f in standard)
        chunks.append(f"{RULE}\n{name} {dist.version}\nLicence: {licence}\nHome: {entry.get('URL', '')}\n"
                      f"{RULE}\n\n{body.strip()}\n")
    return "\n".join(header) + "\n\n".join(chunks), missing


def main(argv: list[str]) -> int:
    from tramontane.app.licences import NOTICES_NAME, shipped_distributions

    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    dists = [d for d in shipped_distributions() if d.metadata["Name"].lower() != "tramontane"]
    text, missing = notices(dists)
    if missing:
        print("third_party_notices: no licence text for " + ", ".join(missing), file=sys.stderr)
        return 1
    (out / NOTICES_NAME).write_text(text, "utf-8")
    shutil.copyfile(HERE.parent / "LICENSE", out / "LICENSE")
    print(f"third_party_notices: {len(dists)} distributions, {len(text) // 1024} KiB -> {out / NOTICES_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
