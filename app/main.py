"""`tramontane`: the desktop app's entry point.

    tramontane [--data-dir DIR] [--version] [--self-test]

Options that must work without a display (`--version`, `--self-test`) are handled before
Qt is imported; `COMMANDS` is the hook where packaging adds more (each is a function taking
the parsed args and returning an exit code).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

from .. import __version__
from ..env import read_env, variable
from ..engine.private_files import restrict_umask

APP_NAME = "Tramontane"
HEAVY_MODULES = ("torch", "numpy", "tramontane.engine.runtime.local", "aiohttp")
_IMPORTED_AT = time.perf_counter()


def process_age_s() -> float:
    """Seconds since this process started (Linux: from /proc, so the interpreter's own start
    and every import count; elsewhere: since this module was imported)."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter() - _IMPORTED_AT


def startup_report() -> str:
    heavy = [m for m in HEAVY_MODULES if m in sys.modules]
    return (f"startup: window shown {process_age_s():.2f} s after the process started; "
            f"imported by then: {', '.join(heavy) or 'none of ' + ', '.join(HEAVY_MODULES)}")


def _print_version(_args) -> int:
    print(f"{APP_NAME} {__version__}")
    return 0


def _self_test(args) -> int:
    """`--self-test`: app/selftest.py checks the engine, the GPU and Qt on a tiny model."""
    from . import selftest

    return int(selftest.run(args))


# flag attribute -> handler, checked in this order before any window is made.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "version": _print_version,
    "self_test": _self_test,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tramontane", description="Offline multimodal chat "
                                     "for Mistral 3 models")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--self-test", action="store_true",
                        help="check the installation (engine, GPU, Qt) and exit")
    parser.add_argument("--data-dir", help="where chats and settings live "
                        "(default: $TRAMONTANE_DATA_DIR or the per-user data folder)")
    parser.add_argument("--no-autoload", action="store_true",
                        help="do not load the last used model at start")
    # Qt's own options (-platform, -style...) pass through to QApplication.
    return parser.parse_known_args(argv)[0]


def run_app(args: argparse.Namespace, argv: list[str]) -> int:
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication, QMessageBox

    from .store import Store, StoreError
    from .widgets.theme import apply_color_scheme, follow_system_scheme
    from .window import MainWindow

    app = QApplication.instance() or QApplication(argv)
    from .single_instance import ask_running_instance
    from .store import default_data_dir

    if ask_running_instance(args.data_dir or default_data_dir()):
        return 0  # the running app shows its window instead
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    app.setDesktopFileName("tramontane")
    app.setStyle("Fusion")  # the same look everywhere, and palettes that follow light/dark
    icon = _icon_path()
    if icon:
        app.setWindowIcon(QIcon(icon))
    apply_color_scheme(app)
    follow_system_scheme(app)
    try:
        store = Store(args.data_dir)
    except StoreError as exc:
        QMessageBox.critical(None, APP_NAME, str(exc))
        return 1
    from .gui_gc import GuiThreadCollector

    collector = GuiThreadCollector(app)  # Qt objects die on the GUI thread, never on a worker's
    try:
        window = MainWindow(store, autoload=not args.no_autoload)
        # TRAMONTANE_STARTUP_PROBE=1: print how long after the process started the window was on
        # screen, and which heavy modules were imported by then; "exit" also quits there (tests).
        probe = read_env().startup_probe
        if probe:
            def report() -> None:  # the first turn of the event loop after show: drawn
                print(startup_report(), file=sys.stderr, flush=True)
                if probe == "exit":
                    window.close()

            window.firstShown.connect(report)
        window.show()
        return app.exec()
    finally:
        collector.stop()
        store.close()


def _icon_path() -> str:
    try:
        from importlib.resources import files

        path = files("tramontane.resources") / "icon.svg"
        return str(path) if path.is_file() else ""
    except Exception:  # noqa: BLE001
        return ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else [sys.argv[0] if sys.argv else "tramontane", *argv])
    args = parse_args(argv[1:])
    for flag, handler in COMMANDS.items():
        if getattr(args, flag, False):
            return handler(args)
    if args.data_dir:
        os.environ.setdefault(variable("data_dir"), args.data_dir)  # what the store and the lock read
    restrict_umask()  # whatever the window writes (chats, photos, exports, downloads) is private
    return run_app(args, argv)


if __name__ == "__main__":
    sys.exit(main())
