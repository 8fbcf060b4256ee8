"""Test helpers shared across the tree: fakes (hub, OpenAI-compatible server), GGUF editing,
tiny-model builders, random quantized bytes. `FIXTURES` is the folder of committed fixture files."""
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
