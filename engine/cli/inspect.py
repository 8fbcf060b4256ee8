"""`tramontane-cli tokenize --model FILE [--json] TEXT`: the token ids of TEXT, without BOS."""
from __future__ import annotations

import json

from ..gguf import open_gguf
from ..mistral3.tokenizer import Tokenizer


def tokenize_main(model_path: str, text: str, as_json: bool = False) -> int:
    """Print the ids of `text` (space-separated, or a JSON list). GGUFError / EngineError
    (file unreadable, no usable tokenizer) propagate for the CLI to report in one line."""
    with open_gguf(model_path) as gf:
        tok = Tokenizer.from_gguf(gf)
    ids = tok.encode(text)
    print(json.dumps(ids) if as_json else " ".join(map(str, ids)))
    return 0
