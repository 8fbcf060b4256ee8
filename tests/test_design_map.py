"""docs/DESIGN.md's map matches the tree: every module of app/, engine/ and kernels/ is named in
its folder's section, and every file a section names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "kernels", "app")


def sections() -> dict[str, str]:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    out = {}
    for folder in FOLDERS:
        start = text.index(f"### `{folder}/`")
        end = text.index("\n### ", start + 1)
        out[folder] = text[start:end]
    return out


def test_every_module_is_on_the_map():
    missing = []
    for folder, section in sections().items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "__init__.py" and path.name not in section:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"modules missing from DESIGN.md's map: {missing}"


def test_every_file_on_the_map_exists():
    stale = []
    for folder, section in sections().items():
        names = {p.name for p in (ROOT / folder).rglob("*") if p.is_file()}
        for token in re.findall(r"(?<![\w.])([\w/]*\w\.(?:py|c|h|inc))(?![\w])", section):
            if "/" in token:  # a path: from the repository or from this folder
                found = (ROOT / token).is_file() or (ROOT / folder / token).is_file()
            else:
                found = token in names
            if not found:
                stale.append(f"{folder}: {token}")
    assert not stale, f"DESIGN.md's map names files that are not there: {sorted(set(stale))}"
