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
    from tramontane.app.main import main

    return main()


if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen app must not re-run itself in a child process
    sys.exit(_main())
