"""`tramontane-cli info | tokenize`: what a GGUF file holds, and how its tokenizer splits text."""
from __future__ import annotations

import json

from ..gguf import open_gguf


def add_parsers(sub) -> None:
    p = sub.add_parser("info", help="describe a GGUF file (architecture, sizes, quant types, tokenizer)")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=info_main)

    p = sub.add_parser("tokenize", help="token ids of TEXT (without BOS)")
    p.add_argument("--model", required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("text")
    p.set_defaults(func=lambda a: tokenize_main(a.model, a.text, a.json))


def info_main(args) -> int:
    from ..library.projector import find_projector
    from ..mistral3.config import describe

    with open_gguf(args.model) as gf:
        info = describe(gf)
    if info.get("architecture") != "clip":
        mmproj = find_projector(args.model)
        info["projector_found"] = str(mmproj) if mmproj else None
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key.ljust(width)}  {value}")
    return 0 if info.get("kind") != "unsupported" else 1


def tokenize_main(model_path: str, text: str, as_json: bool = False) -> int:
    """Print the ids of `text` (space-separated, or a JSON list). GGUFError / EngineError
    (file unreadable, no usable tokenizer) propagate for the CLI to report in one line."""
    from ..mistral3.tokenizer import Tokenizer

    with open_gguf(model_path) as gf:
        tok = Tokenizer.from_gguf(gf)
    ids = tok.encode(text)
    print(json.dumps(ids) if as_json else " ".join(map(str, ids)))
    return 0
