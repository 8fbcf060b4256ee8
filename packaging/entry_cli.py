"""Frozen entry point of `tramontane-cli` (console executable beside the GUI one, Windows/macOS;
on Linux `tramontane-cli` is a symlink to `tramontane`, whose entry_gui.py dispatches the same way).

`tramontane-cli self-test` runs the self-test without the window step: on Windows the GUI
executable has no console, so this is where its output can be read.
"""
import multiprocessing
import sys


def _main() -> int:
    args = sys.argv[1:]
    if args and args[0] in ("self-test", "--self-test"):
        from tramontane.app.selftest import main as self_test

        return self_test(["--no-gui", *args[1:]])
    from tramontane.engine.cli.main import main

    return main(args)


if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(_main())
