"""Frozen entry point of the `tramontane` executable (the GUI).

`--self-test` and `--version` are answered here, before Qt starts, so the packaging smoke test
does not depend on how app/main.py dispatches them; everything else goes to
`tramontane.app.main:main`, the same function pip's `tramontane` script calls.

Started as `tramontane-cli` (the Linux bundle's `tramontane-cli` is a symlink to this executable:
one embedded Python archive instead of two, 32 MB less), it is the command line instead.
"""
import multiprocessing
import os
import sys


def _cli(args: list[str]) -> int:
    if args and args[0] in ("self-test", "--self-test"):
        from tramontane.app.selftest import main as self_test

        return self_test(["--no-gui", *args[1:]])
    from tramontane.engine.cli.main import main

    return main(args)


def _probe_startup(launched: float) -> None:
    """TRAMONTANE_LAUNCH_TIME=<launch time, seconds since the epoch>: once the main window is
    visible (shown and exposed, the event loop running) print how long that took after launch,
    then quit. The packaging smoke test measures the start time with it.

    The QApplication made here is the one app/main.py's run_app takes (QApplication.instance())."""
    import time

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    t0 = launched
    app = QApplication.instance() or QApplication(sys.argv)

    def check() -> None:
        shown = [w for w in app.topLevelWidgets()
                 if w.isVisible() and w.windowHandle() is not None and w.windowHandle().isExposed()]
        if not shown:
            QTimer.singleShot(5, check)
            return
        print(f"startup: window visible {time.time() - t0:.2f} s after launch "
              f"({type(shown[0]).__name__}, '{app.platformName()}')", flush=True)
        app.quit()

    QTimer.singleShot(0, check)


def _main() -> int:
    args = sys.argv[1:]
    if os.path.basename(sys.argv[0]).lower().startswith("tramontane-cli"):
        return _cli(args)
    if "--self-test" in args:
        from tramontane.app.selftest import main as self_test

        return self_test([a for a in args if a != "--self-test"])
    if args == ["--version"]:
        from tramontane import __version__

        print(f"Tramontane {__version__}")
        return 0
    from tramontane.env import read_env

    launched = read_env().launch_time
    if launched is not None:
        _probe_startup(launched)
    from tramontane.app.main import main

    return main()


if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen app must not re-run itself in a child process
    sys.exit(_main())
