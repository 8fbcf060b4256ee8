"""The import arrows point one way: app -> engine -> kernels, and inside engine
cli/server/library -> runtime -> mistral3 -> gguf -> api, host (docs/DESIGN.md, "Imports").

Every module's imports are read with `ast` (relative ones and absolute `tramontane.` ones,
inside functions and `if TYPE_CHECKING:` blocks too: a late import is still an arrow). A unit
is a top-level module or sub-package of app/, engine/, kernels/ (`engine.runtime`,
`app.window`, `kernels.linear`). The test fails on an arrow from a lower rank to a higher one,
and on a cycle between units (arrows between units of one rank are allowed only one way).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"app": "tramontane.app", "engine": "tramontane.engine", "kernels": "tramontane.kernels",
           "resources": "tramontane.resources"}

# Higher ranks may import lower ones (and their own rank, one way); never upwards.
LAYER = {"tramontane": 0, "resources": 0, "kernels": 1, "engine": 2, "app": 3}
ENGINE_RANK = {
    "cli": 4, "server": 4, "library": 4,          # front ends and the models folder
    "runtime": 3, "remote": 3, "mcp_tools": 3,    # engines and what they call out to
    "documents": 3,                               # attached documents: text, bounded
    "mistral3": 2,                                # the model: math on a file's tensors
    "gguf": 1,
    "api": 0, "private_files": 0, "host": 0,
}


def modules() -> dict[str, tuple[Path, bool]]:
    """'tramontane.engine.runtime.local' -> (file, is a package's __init__)."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join([package, *parts])] = (path, is_package)
    return found


def imported(name: str, path: Path, is_package: bool) -> list[tuple[str, int]]:
    """(module named by the import, line) for every `tramontane.` import in the file."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names] + [source]
        else:
            continue
        out += [(t, node.lineno) for t in targets if t == "tramontane" or t.startswith("tramontane.")]
    return out


def unit(module: str) -> str:
    """'tramontane.engine.runtime.local' -> 'engine.runtime'; 'tramontane' -> 'tramontane'."""
    parts = module.split(".")[1:]
    return ".".join(parts[:2]) if parts else "tramontane"


def rank(u: str) -> tuple[int, int]:
    top, _, sub = u.partition(".")
    return LAYER[top], ENGINE_RANK[sub] if top == "engine" and sub else 0


def arrows() -> dict[tuple[str, str], list[str]]:
    """(unit, unit it imports) -> 'file:line' of each import making that arrow."""
    mods = modules()
    out: dict[tuple[str, str], list[str]] = {}
    for name, (path, is_package) in mods.items():
        for target, line in imported(name, path, is_package):
            # `from .x import name` names a module only when x.name is one
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            a, b = unit(name), unit(target)
            if a != b:
                where = f"{path.relative_to(ROOT)}:{line}"
                if where not in out.setdefault((a, b), []):
                    out[(a, b)].append(where)
    return out


def cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_relative_absolute_and_late_imports():
    """The walk itself: a relative import, an absolute one and one inside a function all count."""
    edges = arrows()
    assert ("engine.runtime", "engine.mistral3") in edges  # runtime/local.py: from ..mistral3.text
    assert ("engine.gguf", "engine.api") in edges  # gguf.py: from .api import ... (module level)
    assert ("app.worker", "engine.runtime") in edges  # imports inside the worker's methods
    assert unit("tramontane.engine.runtime.local") == "engine.runtime"
    assert cycles({("a", "b"): 1, ("b", "c"): 1, ("c", "a"): 1, ("c", "d"): 1}) == [["a", "b", "c"]]


def test_no_arrow_points_up():
    upward = [f"{a} -> {b}: {', '.join(where)}" for (a, b), where in sorted(arrows().items())
              if rank(a) < rank(b)]
    assert not upward, "imports against the order app -> engine -> kernels, cli/server/library -> " \
                       "runtime -> mistral3 -> gguf -> api:\n" + "\n".join(upward)


def test_no_cycle_between_units():
    edges = arrows()
    found = []
    for component in cycles(edges):
        inner = [f"  {a} -> {b}: {', '.join(edges[(a, b)])}" for a in component for b in component
                 if (a, b) in edges]
        found.append(" <-> ".join(component) + "\n" + "\n".join(inner))
    assert not found, "import cycles between units:\n" + "\n".join(found)
