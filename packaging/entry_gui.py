"""Frozen entry point of the `tramontane` executable (the GUI).

`--self-test` and `--version` are answered here, before Qt starts, so the packaging smoke test
does not depend on how app/main.py dispatches them; everything else goes to
`tramontane.app.main:main`, the same function pip's `tramontane` script calls.
"""
import multiprocessing
import sys


def _main() -> int:
    args = sys.argv[1:]
    if "--self-test" in args:
        from tramontane.app.selftest import main as self_test

        return self_test([a for a in args if a != "--self-test"])
    if args == ["--version"]:
        from tramontane import __version__

        print(f"Tramontane {__version__}")
        return 0
    from tramontane.app.main import main

    return main()


if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen app must not re-run itself in a child process
    sys.exit(_main())
