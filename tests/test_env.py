"""The environment variables: docs/DESIGN.md's table, tramontane/env.py's `Env` and the tree
agree. Every `TRAMONTANE_*` name the shipped tree mentions is in the table; the table's
`tramontane/env.py` rows are exactly Env's variables; every other row's reader mentions its
variable; nothing in app/, engine/, kernels/ or packaging/ but tramontane/env.py reads one (no
string constant that is a variable's name there, no getenv of one in the C sources)."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tramontane.env import VARIABLES, read_env, variable

ROOT = Path(__file__).resolve().parents[1]
ENV_MODULE = "tramontane/env.py"
NAME = re.compile(r"TRAMONTANE_[A-Z0-9_]*[A-Z0-9]")
SHIPPED = ("app", "engine", "kernels", "tramontane", "packaging", "scripts", "bench")
PYTHON_READERS = ("app", "engine", "kernels", "packaging")


def table() -> dict[str, list[str]]:
    """variable -> the files of its 'read by' cell."""
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    start = text.index("\n## Environment variables\n")
    section = text[start:text.index("\n## ", start + 1)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and NAME.fullmatch(cells[0].strip("`")):
            rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def shipped_files():
    for folder in SHIPPED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".c", ".h", ".inc", ".sh", ".spec", ".md", "") \
                    and "__pycache__" not in path.parts:
                yield path
    yield ROOT / "setup.py"


def test_the_table_names_every_variable_the_tree_mentions():
    rows = table()
    missing = {}
    for path in shipped_files():
        for name in set(NAME.findall(path.read_text(encoding="utf-8", errors="replace"))):
            if name not in rows:
                missing.setdefault(name, str(path.relative_to(ROOT)))
    assert not missing, f"variables missing from docs/DESIGN.md's table: {missing}"


def test_the_programs_rows_are_envs_fields():
    rows = table()
    in_table = {name for name, readers in rows.items() if ENV_MODULE in readers}
    assert in_table == set(VARIABLES.values())
    assert all(readers == [ENV_MODULE] for name, readers in rows.items() if name in in_table)


def test_every_other_reader_mentions_its_variable():
    stale = [f"{name}: {reader}" for name, readers in table().items() for reader in readers
             if reader != ENV_MODULE and name not in (ROOT / reader).read_text(encoding="utf-8")]
    assert not stale, f"the table names readers that do not read the variable: {stale}"


def test_no_reader_outside_the_env_module():
    """A string constant that is a variable's whole name is a key someone looks up (or a second
    copy of the name): outside tramontane/env.py they ask `read_env()` / `variable()`."""
    found = []
    for folder in PYTHON_READERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    for path in sorted((ROOT / "kernels").rglob("*.[ch]")):
        if re.search(r'getenv\(\s*"TRAMONTANE_', path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(ROOT)}: getenv")
    assert not found, f"TRAMONTANE_* read outside {ENV_MODULE}: {found}"


def test_unset_means_the_defaults():
    env = read_env({})
    assert (env.cpu_exact, env.cpu_variant, env.cuda_graphs, env.triton_aot, env.triton_aot_dir) == \
        (False, None, True, None, None)
    assert (env.threads, env.torch_threads, env.data_dir, env.models_dir, env.model_places) == \
        (None, None, None, None, None)
    assert (env.selftest_model, env.selftest_mmproj, env.selftest_traceback, env.startup_probe,
            env.launch_time) == (None, None, False, "", None)


def test_values_are_parsed_as_the_readers_did(tmp_path):
    def one(name, value):
        return read_env({variable(name): value})

    assert one("cpu_exact", "1").cpu_exact and not one("cpu_exact", " 0 ").cpu_exact
    assert not one("cpu_exact", " ").cpu_exact
    assert not one("cuda_graphs", "0").cuda_graphs and one("cuda_graphs", "").cuda_graphs
    assert [one("triton_aot", v).triton_aot for v in ("1", "yes", "0", "no", "false", " ")] == \
        [True, True, False, False, False, None]
    assert one("cpu_variant", " avx2 ").cpu_variant == "avx2"
    assert one("torch_threads", "4").torch_threads == 4
    assert [one("torch_threads", v).torch_threads for v in ("0", "-2", "two")] == [None, None, None]
    assert one("threads_text", " 3 ").threads == 3
    for bad in ("zero", "0", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"TRAMONTANE_THREADS must be a positive integer, got '{bad}'"):
            one("threads_text", bad).threads
    assert one("data_dir", "~/chats").data_dir == Path("~/chats").expanduser()
    places = os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])
    assert one("model_places", places).model_places == (tmp_path / "a", tmp_path / "b")
    assert one("model_places", "").model_places == ()  # set but empty: no places at all
    assert one("selftest_traceback", "0").selftest_traceback  # any value, as before
    assert one("startup_probe", "exit").startup_probe == "exit"
    # the frozen app's launch time is a variable of its own: the probe's words are no time
    assert one("launch_time_text", " 1722000000.25 ").launch_time == 1722000000.25
    assert one("startup_probe", "1722000000.25").launch_time is None
    with pytest.raises(ValueError, match="TRAMONTANE_LAUNCH_TIME must be the launch time .* got 'exit'"):
        one("launch_time_text", "exit").launch_time


def test_read_on_every_call(monkeypatch):
    monkeypatch.setenv("TRAMONTANE_CUDA_GRAPHS", "0")
    assert not read_env().cuda_graphs
    monkeypatch.delenv("TRAMONTANE_CUDA_GRAPHS")
    assert read_env().cuda_graphs


def test_the_import_time_settings_reach_their_readers():
    """CPU_VARIANT and CPU_EXACT are read when the kernels are imported: in a fresh process."""
    import subprocess
    import sys

    from tramontane.kernels import cpu_native

    if not cpu_native.AVAILABLE:
        pytest.skip("the native CPU kernels are not built here")
    code = ("from tramontane.kernels import cpu_native, linear; "
            "print(cpu_native.variant(), linear.is_cpu_exact())")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRAMONTANE_")}

    def run(**settings) -> list[str]:
        return subprocess.run([sys.executable, "-c", code], env={**environ, **settings}, check=True,
                              capture_output=True, text=True, timeout=120).stdout.split()

    best = cpu_native.variants()[0]
    assert run() == [best, "False"]
    assert run(TRAMONTANE_CPU_VARIANT="generic", TRAMONTANE_CPU_EXACT="1") == ["generic", "True"]
    assert run(TRAMONTANE_CPU_VARIANT="no-such-variant") == [best, "False"]  # as before: the best
