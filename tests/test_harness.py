"""The suite's own guards (tests/conftest.py) against failures that would land on an innocent test."""
import ast
import gc
import sys
import traceback

import pytest


def _fails_with_carets(mapping):
    return mapping["a"] + mapping["b"]  # a KeyError whose traceback line has caret anchors


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="gh-106905 is CPython 3.11's")
def test_a_traceback_formatted_by_the_collector_during_a_parse_does_not_break_the_parse():
    """CI's 3.11.7 failed a Triton test with "AST constructor recursion depth mismatch": the
    collector freed a future with an unretrieved exception in the middle of the interpreter's
    ast.parse of a kernel, and asyncio's log of it parsed its caret anchors with a nested
    ast.parse. Here a collector callback formats such a traceback during a parse large enough to
    trigger many collections; without conftest's guard this raises SystemError on 3.11.7."""
    formatted = []

    def on_collect(phase, info):
        if phase != "start":
            return
        try:
            _fails_with_carets({})
        except KeyError as e:
            formatted.append("".join(traceback.format_exception(e)))

    source = "\n".join(f"def f{i}(a, b):\n    return (a + b) * [a, b][0] if a else g(a)(b)[c].d"
                       for i in range(3000))
    threshold = gc.get_threshold()
    gc.set_threshold(50)
    gc.callbacks.append(on_collect)
    try:
        tree = ast.parse(source)
    finally:
        gc.callbacks.remove(on_collect)
        gc.set_threshold(*threshold)
    assert len(tree.body) == 3000
    assert formatted, "no collection ran during the parse: the test did not exercise the case"
    assert "KeyError: 'a'" in formatted[0]
    # outside a parse, tracebacks keep their carets
    try:
        _fails_with_carets({})
    except KeyError as e:
        assert "^^^" in "".join(traceback.format_exception(e))
