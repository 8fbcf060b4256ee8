"""The shipped catalogue: every Ministral 3 size the README names, with sizes and shapes the
planner can use, and clear errors for a bad `shape`."""
from __future__ import annotations

import pytest

from tramontane.engine.library.catalog import ModelShape, load_catalog, parse_catalog
from tramontane.engine.library.hub import HubError


def test_the_catalogue_has_ministral_3_3b_8b_14b_with_sizes_and_shapes():
    by_id = {e.id: e for e in load_catalog()}
    # file sizes in bytes as published (see the report: two independent listings agree)
    expected = {"ministral-3-3b-instruct": (2_147_023_008, 26, 3072, True),
                "ministral-3-8b-instruct": (5_198_911_904, 34, 4096, False),
                "ministral-3-14b-instruct": (8_239_593_024, 40, 5120, False)}
    for entry_id, (size, layers, hidden, tied) in expected.items():
        e = by_id[entry_id]
        size_tag = entry_id.split("-")[2].upper()
        assert e.repo_id == f"mistralai/Ministral-3-{size_tag}-Instruct-2512-GGUF"
        (v,) = e.variants
        assert v.file == f"Ministral-3-{size_tag}-Instruct-2512-Q4_K_M.gguf"
        assert v.size_gb == round(size / 1e9, 3)
        assert e.vision and e.mmproj_file == f"Ministral-3-{size_tag}-Instruct-2512-BF16-mmproj.gguf"
        assert e.mmproj_size_gb is None  # not confirmed: shown once the repository is listed
        assert (e.shape.layers, e.shape.hidden, e.shape.tied) == (layers, hidden, tied)
    for e in by_id.values():  # every entry can be planned before it is downloaded
        assert isinstance(e.shape, ModelShape) and e.variants[0].size_gb


def _entry(shape):
    return {"models": [{"id": "x", "name": "x", "repo_id": "a/b", "license": "MIT",
                        "variants": [{"quant": "Q4_K_M"}], "shape": shape}]}


def test_a_bad_shape_names_the_field():
    good = {"layers": 2, "hidden": 8, "ffn": 16, "heads": 2, "kv_heads": 1, "head_dim": 4,
            "vocab": 32, "tied": True}
    assert parse_catalog(_entry(good))[0].shape == ModelShape(2, 8, 16, 2, 1, 4, 32, True)
    assert parse_catalog(_entry(None))[0].shape is None
    with pytest.raises(HubError, match=r"models\[0\]\.shape\.ffn: expected a whole number"):
        parse_catalog(_entry({**good, "ffn": "16"}))
    with pytest.raises(HubError, match=r"models\[0\]\.shape\.layers"):
        parse_catalog(_entry({**good, "layers": 0}))
    with pytest.raises(HubError, match=r"models\[0\]\.shape\.tied: expected true or false"):
        parse_catalog(_entry({**good, "tied": 1}))
    with pytest.raises(HubError, match=r"models\[0\]\.shape: expected an object"):
        parse_catalog(_entry([1, 2]))
