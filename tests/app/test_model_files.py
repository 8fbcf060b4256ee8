"""app/model_files.py: why a picked file cannot be loaded as a model, in words."""
from support import FIXTURES

from tramontane.app.model_files import why_not_a_model


def test_a_file_named_gguf_that_is_not_one_is_not_told_to_end_in_gguf(tmp_path):
    """Issue 35, item 10: 'notamodel.gguf' was told to choose a file ending in .gguf."""
    fake = tmp_path / "notamodel.gguf"
    fake.write_bytes(b"<html>not found</html>")
    words = why_not_a_model(fake)
    assert "notamodel.gguf" in words and "is not a GGUF file" in words and "ending in .gguf" not in words
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert "ending in .gguf" in why_not_a_model(text)
    assert why_not_a_model(FIXTURES / "mistral3_tiny-f32.gguf") == ""
    assert "vision projector" in why_not_a_model(FIXTURES / "mmproj-mistral3_tiny-f32.gguf")
    assert "Cannot open" in why_not_a_model(tmp_path / "missing.gguf")
