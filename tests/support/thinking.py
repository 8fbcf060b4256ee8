"""The tiny model made to think: its vocabulary with slots 34/35 named [THINK]/[/THINK] (32/33
[ARGS]/[CALL_ID]) and a v13 template marker, as Magistral's and Ministral 3 Reasoning's files
have them; with `script_logits` a test makes it write a thought, then an answer."""
from __future__ import annotations

from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import Tokenizer


def thinking_tokenizer(model_path) -> Tokenizer:
    with open_gguf(model_path) as gf:
        kv = dict(gf.kv)
    tokens = list(kv["tokenizer.ggml.tokens"])
    tokens[32], tokens[33], tokens[34], tokens[35] = "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"
    kv["tokenizer.ggml.tokens"] = tokens
    kv["tokenizer.chat_template"] = "[ARGS] [THINK]"
    tok = Tokenizer.from_kv(kv, "tiny-thinking.gguf")
    assert tok.can_think
    return tok
