"""Light packaging checks (the real bundle build is scripts/package_smoke.sh, ~15 min):
the spec evaluates to the expected bundle layout, the version has one source, the desktop entry
is valid, install.sh installs and uninstalls, the frozen entry scripts dispatch."""
import configparser
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import tramontane
from tramontane.engine.cli import selftest

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "tramontane.spec"
DESKTOP = PACKAGING / "linux" / "tramontane.desktop"
INSTALL = PACKAGING / "linux" / "install.sh"
FIXTURE_MODEL = ROOT / "tests" / "fixtures" / selftest.MODEL_NAME


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- version ---------------------------------------------------------------------------------
def test_version_comes_from_pyproject_only():
    version = pyproject()["project"]["version"]
    assert tramontane.__version__ == version
    # No packaging file repeats it: the scripts read it from the installed package.
    repeated = re.compile(rf"(?<![\w.-]){re.escape(version)}(?![\w.-])")
    for path in PACKAGING.rglob("*"):
        if path.is_file() and path.suffix not in (".png", ".ico", ".icns"):
            text = path.read_text(errors="replace")
            if path.suffix == ".desktop":  # its Version= is the desktop-entry spec's version
                text = re.sub(r"(?m)^Version=.*$", "", text)
            assert not repeated.search(text), path


def test_entry_points_match_the_spec_executables():
    project = pyproject()["project"]
    assert project["gui-scripts"]["tramontane"] == "tramontane.app.main:main"
    assert project["scripts"]["tramontane-cli"] == "tramontane.engine.cli.main:main"
    gui = (PACKAGING / "entry_gui.py").read_text()
    cli = (PACKAGING / "entry_cli.py").read_text()
    assert "from tramontane.app.main import main" in gui
    assert "from tramontane.engine.cli.main import main" in cli


# -- the spec, evaluated with recording stand-ins for PyInstaller's classes --------------------
class Recorder:
    made: list = []

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        Recorder.made.append(self)


class FakeAnalysis(Recorder):
    def __init__(self, scripts, **kwargs):
        super().__init__(scripts, **kwargs)
        self.scripts = [("pyi_rth_x", "/rthook.py", "PYSOURCE"),
                        ("entry_gui", scripts[0], "PYSOURCE")]
        self.pure, self.binaries, self.datas = [], [], kwargs["datas"]


def evaluate_spec(tmp_path, monkeypatch, **env) -> dict:
    """Run the spec as PyInstaller would, with recording classes (no build, no PyInstaller
    needed: its `copy_metadata` is stubbed too)."""
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.copy_metadata = lambda dist: [(f"/site/{dist}.dist-info", f"{dist}.dist-info")]
    for name in ("PyInstaller", "PyInstaller.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    Recorder.made = []
    namespace = {
        "SPECPATH": str(PACKAGING), "workpath": str(tmp_path / "work"), "__file__": str(SPEC),
        "Analysis": FakeAnalysis, "PYZ": Recorder, "EXE": Recorder, "COLLECT": Recorder,
        "BUNDLE": Recorder, "__name__": "__main__",
    }
    exec(compile(SPEC.read_text(), str(SPEC), "exec"), namespace)
    return namespace


def test_spec_builds_two_executables_sharing_one_folder(tmp_path, monkeypatch):
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0")
    analysis = ns["a"]
    kw = analysis.kwargs
    assert kw["module_collection_mode"] == {"tramontane.kernels": "pyz+py"}
    exes = [r for r in Recorder.made if r.kwargs.get("name") in ("tramontane", "tramontane-cli")
            and "console" in r.kwargs]
    assert {e.kwargs["name"]: e.kwargs["console"] for e in exes} == {
        "tramontane": False, "tramontane-cli": True}
    cli = next(e for e in exes if e.kwargs["name"] == "tramontane-cli")
    scripts = cli.args[1]
    assert scripts[-1][0] == "entry_cli" and Path(scripts[-1][1]) == PACKAGING / "entry_cli.py"
    assert all(name != "entry_gui" for name, _, _ in scripts)
    coll = ns["coll"]
    assert coll.args[0] is ns["gui_exe"] and coll.args[1] is ns["cli_exe"]
    assert coll.kwargs["name"] == "tramontane"

    # Sources are staged as installed: every module of every package, kernels included.
    stage = Path(kw["pathex"][0])
    for package, folder in pyproject()["tool"]["setuptools"]["package-dir"].items():
        for src in (ROOT / folder).rglob("*.py"):
            rel = src.relative_to(ROOT / folder)
            staged = stage.joinpath(*package.split("."), rel)
            assert staged.read_bytes() == src.read_bytes(), staged
            parts = [package, *rel.with_suffix("").parts]
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            assert module in kw["hiddenimports"], module

    datas = {(Path(src).name, dest) for src, dest in kw["datas"]}
    for name in (selftest.MODEL_NAME, selftest.MMPROJ_NAME):
        assert (name, "tramontane/resources/selftest") in datas
    assert ("icon.svg", "tramontane/resources") in datas
    assert ("catalog.json", "tramontane/resources") in datas
    version = pyproject()["project"]["version"]
    dist_info = [src for src, dest in kw["datas"] if dest == f"tramontane-{version}.dist-info"]
    assert dist_info, "no package metadata: __version__ would be unknown in the bundle"
    import importlib.metadata

    meta = importlib.metadata.PathDistribution(Path(dist_info[0]))
    assert meta.metadata["Name"] == "tramontane" and meta.version == version

    for unused in ("transformers", "mistral_common", "pytest", "PySide6.QtWebEngineCore",
                   "PySide6.QtQml", "PySide6.Qt3DCore", "triton"):
        assert unused in kw["excludes"]
    for used in ("PySide6.QtCore", "PySide6.QtGui", "PySide6.QtWidgets", "PySide6.QtSvg", "torch"):
        assert used not in kw["excludes"]


def test_spec_bundles_compiled_extension_modules(tmp_path, monkeypatch):
    """Compiled code in our packages reaches the bundle wherever pip put it: an extension module
    built in place (editable install) or into site-packages (`pip install .`) becomes a hidden
    import staged beside the sources; a shared library it loads becomes a binary."""
    import importlib.machinery
    import json

    site = tmp_path / "site-packages" / "tramontane" / "kernels"
    (site / "sub").mkdir(parents=True)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so
    (site / f"_fake_native{suffix}").write_bytes(b"\x7fELF not really")
    (site / "sub" / f"_deep{suffix}").write_bytes(b"\x7fELF")
    (site / "libfake_helper.so.1").write_bytes(b"\x7fELF")
    (site / "qmatmul.py").write_text("# an installed copy: the stage keeps this checkout's\n")
    real_run = subprocess.run

    def run(args, *a, **kw):
        """The spec asks a clean child of the build interpreter where tramontane is installed:
        here, as if `pip install .` had put tramontane.kernels into site-packages."""
        if args[:2] == [sys.executable, "-I"]:
            where = {name: [] for name in args[4:]}
            where["tramontane.kernels"] = [str(site)]
            return subprocess.CompletedProcess(args, 0, json.dumps(where), "")
        return real_run(args, *a, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0")
    kw = ns["a"].kwargs
    stage = Path(kw["pathex"][0])
    assert "tramontane.kernels._fake_native" in kw["hiddenimports"]
    assert "tramontane.kernels.sub._deep" in kw["hiddenimports"]
    assert (stage / "tramontane" / "kernels" / f"_fake_native{suffix}").is_file()
    assert (stage / "tramontane" / "kernels" / "qmatmul.py").read_bytes() == \
        (ROOT / "kernels" / "qmatmul.py").read_bytes()
    binaries = {(Path(src).name, dest) for src, dest in kw["binaries"]}
    assert ("libfake_helper.so.1", "tramontane/kernels") in binaries
    assert not any(name.startswith("_fake_native") for name, _ in binaries)


def test_spec_bundles_the_built_native_kernels(tmp_path, monkeypatch):
    """The real extension (kernels/cpu/, built by pip install): in the bundle when it is built."""
    import importlib.util

    if importlib.util.find_spec("tramontane.kernels._cpu") is None:
        pytest.skip("tramontane.kernels._cpu is not built here")
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="0")
    assert "tramontane.kernels._cpu" in ns["a"].kwargs["hiddenimports"]


def test_spec_keeps_triton_when_asked(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    ns = evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_BUNDLE_TRITON="1", TRAMONTANE_TRITON_AOT_BUILD="0")
    assert "triton" not in ns["a"].kwargs["excludes"]


def test_spec_refuses_a_missing_self_test_model(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        evaluate_spec(tmp_path, monkeypatch, TRAMONTANE_SELFTEST_DIR=str(tmp_path))


def test_icons_exist_for_every_platform():
    from PIL import Image

    png = Image.open(PACKAGING / "icons" / "tramontane.png")
    assert png.size == (256, 256) and png.mode == "RGBA"
    ico = Image.open(PACKAGING / "icons" / "tramontane.ico")
    assert (256, 256) in ico.info["sizes"] and (16, 16) in ico.info["sizes"]
    assert Image.open(PACKAGING / "icons" / "tramontane.icns").format == "ICNS"


# -- desktop entry -----------------------------------------------------------------------------
def read_desktop(path: Path) -> dict:
    parser = configparser.RawConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text(encoding="utf-8"))
    assert parser.sections() == ["Desktop Entry"], path
    return dict(parser["Desktop Entry"])


def test_desktop_entry_is_valid():
    entry = read_desktop(DESKTOP)
    for key in ("Type", "Name", "Exec", "Icon", "Categories"):
        assert entry.get(key), key
    assert entry["Type"] == "Application"
    assert entry["Terminal"] == "false"
    assert entry["Categories"].endswith(";") and entry["Keywords"].endswith(";")
    assert entry["Exec"].split()[0] == "tramontane"
    if shutil.which("desktop-file-validate"):
        res = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
        assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


# -- install.sh on a fake bundle ---------------------------------------------------------------
def fake_archive(tmp_path: Path) -> Path:
    """The unpacked archive layout build_linux.sh makes, with shell scripts as executables."""
    top = tmp_path / "tramontane-x-linux"
    app = top / "tramontane"
    (app / "_internal").mkdir(parents=True)
    for exe in ("tramontane", "tramontane-cli"):
        path = app / exe
        path.write_text(f"#!/bin/sh\necho {exe} \"$@\"\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    for src in (INSTALL, DESKTOP, PACKAGING / "icons" / "tramontane.png"):
        shutil.copy(src, top / src.name)
    shutil.copy(ROOT / "resources" / "icon.svg", top / "tramontane.svg")
    return top


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell installer")
def test_install_sh_installs_and_uninstalls(tmp_path):
    top = fake_archive(tmp_path)
    home = tmp_path / "home with space"
    home.mkdir()
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    res = subprocess.run(["sh", str(top / "install.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    prefix = home / ".local" / "opt" / "tramontane"
    link = home / ".local" / "bin" / "tramontane"
    assert link.is_symlink() and link.resolve() == (prefix / "tramontane").resolve()
    out = subprocess.run([str(home / ".local" / "bin" / "tramontane-cli"), "info"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "tramontane-cli info"
    assert (home / ".local/share/icons/hicolor/256x256/apps/tramontane.png").is_file()
    assert (home / ".local/share/icons/hicolor/scalable/apps/tramontane.svg").is_file()
    installed = home / ".local/share/applications/tramontane.desktop"
    entry = read_desktop(installed)
    assert entry["Exec"] == f'"{prefix}/tramontane"'
    assert entry["TryExec"] == f"{prefix}/tramontane"
    assert entry["Icon"] == "tramontane"
    if shutil.which("desktop-file-validate"):  # a quoted path with a space is still valid
        res = subprocess.run(["desktop-file-validate", str(installed)], capture_output=True, text=True)
        assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr

    # Reinstalling replaces the app (no stale files), an unrelated link survives uninstall.
    (prefix / "stale.txt").write_text("old")
    assert subprocess.run(["sh", str(top / "install.sh")], env=env, capture_output=True).returncode == 0
    assert not (prefix / "stale.txt").exists()
    res = subprocess.run(["sh", str(top / "install.sh"), "--uninstall"], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert not prefix.exists() and not link.is_symlink()
    assert not (home / ".local/share/applications/tramontane.desktop").exists()

    other = home / ".local" / "bin" / "tramontane"
    other.symlink_to("/bin/true")
    subprocess.run(["sh", str(top / "install.sh"), "--uninstall"], env=env, check=True,
                   capture_output=True)
    assert other.is_symlink()


def test_install_sh_refuses_an_incomplete_archive(tmp_path):
    top = fake_archive(tmp_path)
    (top / "tramontane" / "tramontane").unlink()
    res = subprocess.run(["sh", str(top / "install.sh")], capture_output=True, text=True,
                         env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    assert res.returncode == 1
    assert f"{top}/tramontane/tramontane is missing" in res.stderr
    assert not (tmp_path / ".local" / "opt").exists()


@pytest.mark.parametrize("script", ["packaging/build_linux.sh", "scripts/package_smoke.sh",
                                    "packaging/macos/build_macos.sh", "packaging/linux/install.sh"])
def test_shell_scripts_parse(script):
    shell = "sh" if script.endswith("install.sh") else "bash"
    res = subprocess.run([shell, "-n", str(ROOT / script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_windows_installer_script_references_existing_files():
    iss = (PACKAGING / "windows" / "tramontane.iss").read_text()
    assert "#ifndef AppVersion" in iss and "AppVersion={#AppVersion}" in iss  # passed by /D
    for needed in ("{app}\\tramontane.exe", "recursesubdirs", "..\\icons\\tramontane.ico",
                   "PrivilegesRequired=lowest"):
        assert needed in iss, needed
    assert (PACKAGING / "windows" / "build_windows.ps1").is_file()


# -- frozen entry scripts, run unfrozen --------------------------------------------------------
def run_entry(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, str(PACKAGING / script), *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_gui_entry_answers_version():
    res = run_entry("entry_gui.py", "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"Tramontane {pyproject()['project']['version']}"


def test_gui_entry_started_as_tramontane_cli_is_the_cli(tmp_path):
    """The Linux bundle's tramontane-cli is a symlink to tramontane: argv[0] decides."""
    link = tmp_path / "tramontane-cli"
    link.symlink_to(PACKAGING / "entry_gui.py")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    res = subprocess.run([sys.executable, str(link), "info", "--json", str(FIXTURE_MODEL)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert '"architecture": "mistral3"' in res.stdout
    bad = subprocess.run([sys.executable, str(link), "self-test", "--model", str(tmp_path / "x.gguf")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[-1] == f"FAILED: model: {tmp_path / 'x.gguf'}: no such file"


def test_cli_entry_runs_the_cli_and_its_self_test_fails_cleanly(tmp_path):
    res = run_entry("entry_cli.py", "info", str(FIXTURE_MODEL))
    assert res.returncode == 0, res.stderr
    assert "mistral3" in res.stdout
    bad = run_entry("entry_cli.py", "self-test", "--model", str(tmp_path / "gone.gguf"))
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[-1] == f"FAILED: model: {tmp_path / 'gone.gguf'}: no such file"


# -- the real build (opt-in) -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRAMONTANE_PACKAGE_SMOKE") != "1",
                    reason="builds the bundle from a clean clone (~5-20 min, ~4 GB): "
                           "TRAMONTANE_PACKAGE_SMOKE=1 to run, or scripts/package_smoke.sh")
def test_package_smoke():
    res = subprocess.run(["bash", str(ROOT / "scripts" / "package_smoke.sh")], capture_output=True,
                         text=True, timeout=3600)
    assert res.returncode == 0 and res.stdout.rstrip().endswith("SMOKE OK"), (
        res.stdout[-4000:] + res.stderr[-4000:])


def test_every_source_package_is_installed():
    """A folder with an __init__.py that pyproject does not list would be missing from the wheel
    and the bundle (the editable install would still find it)."""
    tool = pyproject()["tool"]["setuptools"]
    listed = set(tool["packages"])
    for package, folder in tool["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            assert ".".join([package, *rel.parts]) in listed, init


def test_building_the_package_prints_no_setuptools_warning(tmp_path):
    """Issue 34 item 9: every install printed ~90 lines of setuptools warnings (data folders that
    were not packages). build_py is the step that warned; it copies sources only (no C build), so
    it runs here in seconds. Only setuptools' own 'byte-compiling is disabled' line may remain."""
    res = subprocess.run([sys.executable, "-W", "always", "setup.py", "build_py", "--build-lib", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    said = [line for line in (res.stdout + res.stderr).splitlines()
            if ("warn" in line.lower() or "!!" in line) and "byte-compiling is disabled" not in line]
    assert not said, "\n".join(said[:40])
    assert (tmp_path / "tramontane" / "resources" / "catalog.json").is_file()


def test_an_editable_install_prints_no_setuptools_warning(tmp_path):
    """The README's install is `pip install -e .`: pip shows the backend's warnings, and the
    editable finder warned "be careful with folders ... with the same name as your package" on
    every install (the folder is tramontane/, the package itself; setup.py says so). The build
    runs as pip runs it, the C extensions left out (they are built by the install itself): pip's
    hook runner is a script of pip's, so the checkout is not first on sys.path (-P), where its
    kernels/ would stand for the kernels distribution whose egg_info writer setuptools loads."""
    code = ("from setuptools.command.build_ext import build_ext\n"
            "build_ext.run = lambda self: None\n"
            "from setuptools import build_meta\n"
            f"print(build_meta.build_editable({str(tmp_path)!r}))\n")
    res = subprocess.run([sys.executable, "-P", "-W", "always", "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    said = [line for line in (res.stdout + res.stderr).splitlines()
            if "warn" in line.lower() or "careful" in line.lower() or "!!" in line]
    assert not said, "\n".join(said[:40])
    assert res.stdout.strip().splitlines()[-1].endswith(".whl")
