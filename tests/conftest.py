import gc
import os
import sys
import traceback
from pathlib import Path

# The checkout's folders are installed as tramontane.app, .engine, .kernels; the checkout itself on
# sys.path (`python -m pytest` puts the working directory there) would shadow real distributions
# of the same names: transformers >= 5.25 imports the `kernels` distribution as it loads, and got
# this repository's kernels/ folder instead.
_CHECKOUT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _CHECKOUT]

import torch  # noqa: E402

# The Triton interpreter is read when kernels are decorated, so it must be set before any
# kernels module is imported. With a GPU the real compiler runs instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# Tests run the kernels without a LocalEngine: torch's threads as the engine sets them beside the
# native pool (runtime/threads.py), so timings and the ops' thread counts are the engine's.
from tramontane.engine.runtime.threads import settle_torch_threads  # noqa: E402

settle_torch_threads()

from support import FIXTURES  # noqa: E402,F401  (kept importable from conftest)


import pytest  # noqa: E402


# -- CPython 3.11's ast.parse is not reentrant (gh-106905) -----------------------------------------
# A traceback printed while ast.parse builds its tree (asyncio logging a never-retrieved exception
# when the collector frees its future, an "Exception ignored in __del__") computes its caret
# anchors with a nested ast.parse, and the outer one fails with "SystemError: AST constructor
# recursion depth mismatch". Triton's interpreter parses every kernel's source, so a test far from
# the guilty object failed (CI, 3.11.7). While a parse runs, tracebacks go without carets.
if sys.version_info[:2] == (3, 11) and hasattr(traceback, "_extract_caret_anchors_from_line_segment"):
    import ast  # noqa: E402

    _parses_running = [0]
    _ast_parse = ast.parse
    _caret_anchors = traceback._extract_caret_anchors_from_line_segment

    def _counted_parse(*args, **kwargs):
        _parses_running[0] += 1
        try:
            return _ast_parse(*args, **kwargs)
        finally:
            _parses_running[0] -= 1

    def _anchors_unless_parsing(segment):
        return None if _parses_running[0] else _caret_anchors(segment)

    ast.parse = _counted_parse
    traceback._extract_caret_anchors_from_line_segment = _anchors_unless_parsing


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_variants: run once per native CPU kernel variant this CPU can force "
        "(avx512vnni, avx2, generic, neon...), so a variant-specific failure shows on any machine")


def pytest_generate_tests(metafunc):
    """Tests marked cpu_variants take a `cpu_variant` parameter: every variant cpu_native.variants()
    lists here (one run, "default", where the native module is not built)."""
    if metafunc.definition.get_closest_marker("cpu_variants") is None:
        return
    from tramontane.kernels import cpu_native

    if "cpu_variant" not in metafunc.fixturenames:
        metafunc.fixturenames.append("cpu_variant")
    metafunc.parametrize("cpu_variant", cpu_native.variants() or ["default"], indirect=True)


@pytest.fixture
def cpu_variant(request):
    """The forced variant for this test (the one in use before is restored after)."""
    from tramontane.kernels import cpu_native

    name = request.param
    if name == "default":
        yield name
        return
    before = cpu_native.variant()
    cpu_native.use_variant(name)
    try:
        yield name
    finally:
        cpu_native.use_variant(before)


@pytest.fixture
def float32_cpu_path():
    """For tests that compare against float references at float32 tolerances: the CPU runs the
    float32 torch path. The native kernels (int8 activations, llama.cpp's method) are tested
    against gguf.quants + float64 in tests/kernels/test_cpu_native.py and end to end in
    tests/engine/mistral3/test_text_cpu_native.py."""
    from support.cpu_kernels import cpu_exact

    with cpu_exact():
        yield


# -- Qt objects die on the GUI thread -------------------------------------------------------------
# A test's windows, dialogs, timers and workers often end up in reference cycles: a failed test's
# traceback (kept as sys.last_traceback) holds its frame, `worker.watch = Loaded(worker)` points
# back, a lambda connected to a child widget's signal holds its dialog. Python's cyclic collector
# frees such garbage whenever some thread happens to allocate: often the engine worker's QThread or
# a server thread of a later test. A QObject destroyed off the GUI thread corrupts Qt (a QTimer
# stopped from another thread stays registered; a widget's destructor races the event loop), and
# the suite dies later with a segmentation fault inside pytest-qt's processEvents, with no frame
# of the guilty test on the stack. So while a test that uses Qt runs, the collector runs only when
# asked; after it, what the test closed is deleted and what it dropped is collected here, on the
# GUI thread; a top-level widget it left alive is an error of that test.
QT_FIXTURES = {"qtbot", "qapp"}
_qt_test_ended = [False]  # the test that just ran used Qt: collect its garbage here
_gc_was_enabled = [True]
_last_traceback_cleared = [None]


def _qt_app():
    if "PySide6.QtWidgets" not in sys.modules:
        return None
    from PySide6.QtWidgets import QApplication

    return QApplication.instance()


def _top_level_widgets(app) -> dict:
    import shiboken6

    return {shiboken6.getCppPointer(w)[0]: w for w in app.topLevelWidgets() if w.parentWidget() is None}


def _delete_deferred() -> None:
    """What deleteLater() asked for, now: outside an event loop (pytest-qt only calls
    processEvents) closed windows would otherwise live on through every later test."""
    from PySide6.QtCore import QCoreApplication, QEvent

    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture(autouse=True)
def no_window_outlives_its_test(request):
    """Fails the test that leaves a top-level widget alive (after pytest-qt closed those given to
    qtbot.addWidget and their deleteLater ran); the leftovers are deleted here, on the GUI thread."""
    uses_qt = bool(QT_FIXTURES & set(request.fixturenames))
    app = _qt_app()
    before = set(_top_level_widgets(app)) if app is not None else set()
    if uses_qt:
        # No automatic collection on the test's worker or server threads; gc.collect() still works.
        _gc_was_enabled[0] = gc.isenabled()
        gc.disable()
        _qt_test_ended[0] = True
    yield
    app = _qt_app()
    if app is None or not uses_qt:
        return
    import shiboken6

    _delete_deferred()
    left = {k: w for k, w in _top_level_widgets(app).items() if k not in before}
    if not left:
        return
    names = sorted(f"{type(w).__name__}({w.windowTitle()!r})" for w in left.values())
    for w in left.values():
        w.close()
        shiboken6.delete(w)
    pytest.fail(f"the test left top-level widgets alive: {', '.join(names)} (give each to "
                "qtbot.addWidget, or close and delete it)", pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    """After a Qt test's fixtures are gone: its garbage is freed now, on the GUI thread."""
    if not _qt_test_ended[0]:
        return
    _qt_test_ended[0] = False
    tb = getattr(sys, "last_traceback", None)
    if tb is not None and tb is not _last_traceback_cleared[0]:
        traceback.clear_frames(tb)  # a failed test's frame holds its windows, timers and workers
        _last_traceback_cleared[0] = tb
    if _qt_app() is not None:
        _delete_deferred()
    gc.collect()
    if _gc_was_enabled[0]:
        gc.enable()
