"""The store every test of tests/app/store may ask for: a fresh data dir, closed afterwards."""
import pytest

from tramontane.app.store import Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as s:
        yield s
