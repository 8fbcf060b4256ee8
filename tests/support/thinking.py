"""The tiny model made to think: its vocabulary with slots 34/35 named [THINK]/[/THINK] (32/33
[ARGS]/[CALL_ID]) and a v13 template marker, as Magistral's and Ministral 3 Reasoning's files
have them; with `script_logits` a test makes it write a thought, then an answer."""
from __future__ import annotations

import os
from pathlib import Path

from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import Tokenizer


# the tiny vocabulary's <SPECIAL_n> slots given the names later tokenizer versions use there
THINKING_SLOTS = {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}


def thinking_tokenizer(model_path) -> Tokenizer:
    with open_gguf(model_path) as gf:
        kv = dict(gf.kv)
    tokens = list(kv["tokenizer.ggml.tokens"])
    for slot, name in THINKING_SLOTS.items():
        tokens[slot] = name
    kv["tokenizer.ggml.tokens"] = tokens
    kv["tokenizer.chat_template"] = "[ARGS] [THINK]"
    tok = Tokenizer.from_kv(kv, "tiny-thinking.gguf")
    assert tok.can_think
    return tok


def as_magistral_download(model_path, tmp_path) -> Path:
    """`model_path` linked as a downloaded Magistral Small 1.2 file (its repository's folder under
    tmp_path/models): the catalogue takes it for that entry (its system prompt, its sampling)."""
    folder = Path(tmp_path) / "models" / "unsloth__Magistral-Small-2509-GGUF"
    folder.mkdir(parents=True)
    path = folder / "Magistral-Small-2509-Q4_K_M.gguf"
    os.symlink(model_path, path)
    return path
