"""Local GGUF files: scan, header facts (checked against gguf-py's reader), projector
pairing, import in place / by copy, delete."""
import shutil
from collections import Counter

import pytest
from support.fakehub import make_gguf_bytes

from tramontane.engine.library.models_folder import (LocalModelError, default_models_dir,
                                            delete_model, import_model,
                                            read_header, scan_models)

from support import FIXTURES


def reference_quant(path):
    """Independent reference: gguf-py's reader, most common type among 2-D tensors."""
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    types = Counter(t.tensor_type.name for t in r.tensors if len(t.shape) == 2)
    arch = r.get_field("general.architecture").contents()
    return arch, types.most_common(1)[0][0], dict(types)


@pytest.fixture
def models(tmp_path):
    d = tmp_path / "models"
    repo = d / "org__Tiny-GGUF"
    repo.mkdir(parents=True)
    make_gguf_bytes(repo / "tiny-Q8_0.gguf", quant="Q8_0")
    make_gguf_bytes(repo / "tiny-Q4_0.gguf", quant="Q4_0", seed=1)
    make_gguf_bytes(repo / "mmproj-F16.gguf", quant="F16", mmproj=True)
    (repo / "tiny-Q2_K.gguf.part").write_bytes(b"GGUF" + b"\0" * 100)  # unfinished download
    (repo / "tiny-Q2_K.gguf.part.json").write_text("{}")
    return d


def test_scan_reads_header_facts(models):
    found = {m.path.name: m for m in scan_models(models)}
    assert set(found) == {"tiny-Q8_0.gguf", "tiny-Q4_0.gguf", "mmproj-F16.gguf"}
    for m in found.values():
        arch, quant, types = reference_quant(m.path)
        assert (m.architecture, m.quant, m.header.quant_types) == (arch, quant, types)
        assert m.size == m.path.stat().st_size and m.error is None
        assert m.folder == models / "org__Tiny-GGUF"
    assert found["tiny-Q8_0.gguf"].quant == "Q8_0" and found["tiny-Q4_0.gguf"].quant == "Q4_0"
    proj = found["mmproj-F16.gguf"]
    assert proj.is_projector and proj.mmproj is None and proj.quant == "F16"
    # Header-only fakes: no Pixtral projector whose width could match, so never paired
    # (tests/engine/library/test_projector.py pairs real files, generic names included).
    assert found["tiny-Q8_0.gguf"].mmproj is None


@pytest.mark.skipif(not (FIXTURES / "mistral3_tiny-q8_0.gguf").exists(),
                    reason="llama.cpp-converted fixtures not present")
def test_scan_real_llama_cpp_files(tmp_path):
    for name in ("mistral3_tiny-q8_0.gguf", "mistral3_tiny-f16.gguf",
                 "mmproj-mistral3_tiny-f16.gguf", "mmproj-mistral3_tiny-f32.gguf"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    found = {m.path.name: m for m in scan_models(tmp_path)}
    for m in found.values():
        arch, quant, _ = reference_quant(m.path)
        assert (m.architecture, m.quant) == (arch, quant)
    assert found["mistral3_tiny-q8_0.gguf"].quant == "Q8_0"
    assert found["mmproj-mistral3_tiny-f16.gguf"].is_projector
    assert not found["mistral3_tiny-q8_0.gguf"].is_projector
    # the library's rule (engine/library/projector.py): same width, its own name, f16 first
    assert found["mistral3_tiny-q8_0.gguf"].mmproj.name == "mmproj-mistral3_tiny-f16.gguf"


def test_broken_file_is_listed_with_the_reason(models):
    bad = models / "broken.gguf"
    bad.write_bytes(b"NOTGGUF" + b"\0" * 64)
    found = {m.path.name: m for m in scan_models(models)}
    assert found["broken.gguf"].header is None
    assert str(bad.resolve()) in found["broken.gguf"].error or "broken.gguf" in found["broken.gguf"].error
    with pytest.raises(LocalModelError, match="broken.gguf"):
        read_header(bad)


def test_import_in_place_then_forget(models, tmp_path):
    outside = tmp_path / "elsewhere" / "my-Q8_0.gguf"
    outside.parent.mkdir()
    make_gguf_bytes(outside, quant="Q8_0", seed=3)
    m = import_model(outside, models)
    assert m.imported_in_place and m.path == outside.resolve() and m.quant == "Q8_0"
    assert outside.resolve() in {x.path for x in scan_models(models)}
    import_model(outside, models)  # twice: still one entry
    assert [x.path for x in scan_models(models)].count(outside.resolve()) == 1
    msg = delete_model(outside, models)
    assert "left where it is" in msg and outside.exists()
    assert outside.resolve() not in {x.path for x in scan_models(models)}


def test_import_by_copy_then_delete(models, tmp_path):
    src = tmp_path / "copy-me-Q4_0.gguf"
    make_gguf_bytes(src, quant="Q4_0", seed=4)
    m = import_model(src, models, copy=True)
    assert not m.imported_in_place and m.path.parent == models / "imported"
    assert m.path.read_bytes() == src.read_bytes()
    with pytest.raises(LocalModelError, match="already in the models folder"):
        import_model(src, models, copy=True)
    assert "deleted" in delete_model(m.path, models)
    assert not m.path.exists() and src.exists()
    assert not (models / "imported").exists()  # empty folder removed


def test_import_refuses_junk_and_delete_refuses_outside(models, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"hello")
    with pytest.raises(LocalModelError, match="junk.gguf"):
        import_model(junk, models)
    with pytest.raises(LocalModelError, match="no such file"):
        import_model(tmp_path / "missing.gguf", models)
    with pytest.raises(LocalModelError, match="not a .gguf"):
        (tmp_path / "x.bin").write_bytes(b"x")
        import_model(tmp_path / "x.bin", models)
    with pytest.raises(LocalModelError, match="refusing to delete"):
        delete_model(junk, models)
    assert junk.exists()


def test_delete_removes_leftover_parts(models):
    target = models / "org__Tiny-GGUF" / "tiny-Q4_0.gguf"
    (target.parent / "tiny-Q4_0.gguf.part").write_bytes(b"x")
    delete_model(target, models)
    assert not target.exists() and not (target.parent / "tiny-Q4_0.gguf.part").exists()
    assert (target.parent / "tiny-Q8_0.gguf").exists()


def test_default_models_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAMONTANE_MODELS_DIR", str(tmp_path / "here"))
    assert default_models_dir() == tmp_path / "here"
    monkeypatch.delenv("TRAMONTANE_MODELS_DIR")
    d = default_models_dir()
    assert d.name == "models" and "Tramontane" in str(d)
