"""A tiny reasoning model that writes a fixed chain of tokens: the f32 fixture rewritten so that
its greedy reply to any prompt ending in [/INST] is `[THINK]` + thought + `[/THINK]` + answer,
then EOS, whatever came before the last token. Any engine that runs the file (ours, llama.cpp's)
writes the same reply, so what a server makes of it (its thought apart from its answer) can be
compared between servers with no logits scripted into either.

How: every layer's attention output and FFN down projections are zero, so the residual stream
at a position is that position's token embedding and nothing else. The chain's tokens get
embeddings along distinct basis directions, the final norm's weight is one, and the output row
of each token of the chain (EOS last) is a large multiple of its predecessor's direction, every
other output row zero: after token k the successor's logit is OUTPUT_SCALE * sqrt(hidden) (the
RMS norm of a basis vector is sqrt(hidden) along it) and every other logit is 0.

The vocabulary gets Magistral's control tokens at their slots (32/33 [ARGS]/[CALL_ID], 34/35
[THINK]/[/THINK], as in tests/support/thinking.py) and a Mistral reasoning chat template
(`TEMPLATE`: Jinja, [SYSTEM_PROMPT], [TOOL_CALLS]name[ARGS]... and no [CALL_ID]: what
llama.cpp's chat code takes for Ministral 3 / Magistral's format, and v13 for this project)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from support import FIXTURES
from support.gguf_edit import read_tensor_payload, rewrite_gguf
from support.thinking import THINKING_SLOTS

SOURCE = FIXTURES / "mistral3_tiny-f32.gguf"
OUTPUT_SCALE = 10.0  # the successor's logit is this times sqrt(hidden) = 80; every other is 0

# Mistral's v13 shape (Magistral 1.2, Ministral 3 Reasoning): a system prompt, [INST] turns, an
# assistant's thought as [THINK]...[/THINK] before its answer, calls as [TOOL_CALLS]name[ARGS]{...}.
# llama.cpp hands its system and assistant messages' content as a list of blocks (text and
# thinking), so both shapes are read. Nothing follows the last [/INST]: the model opens [THINK].
TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
{%- if message['role'] == 'system' %}[SYSTEM_PROMPT]
{%- if message['content'] is string %}{{ message['content'] }}
{%- else %}{%- for block in message['content'] %}
{%- if block['type'] == 'text' %}{{ block['text'] }}
{%- elif block['type'] == 'thinking' %}[THINK]{{ block['thinking'] }}[/THINK]{%- endif %}
{%- endfor %}{%- endif %}[/SYSTEM_PROMPT]
{%- elif message['role'] == 'user' %}
{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}[INST]{{ message['content'] }}[/INST]
{%- elif message['role'] == 'assistant' %}
{%- if message['content'] is string %}{{ message['content'] }}
{%- elif message['content'] %}{%- for block in message['content'] %}
{%- if block['type'] == 'text' %}{{ block['text'] }}
{%- elif block['type'] == 'thinking' %}[THINK]{{ block['thinking'] }}[/THINK]{%- endif %}
{%- endfor %}{%- endif %}
{%- if message['tool_calls'] %}{%- for call in message['tool_calls'] %}[TOOL_CALLS]{{ call['function']['name'] }}[ARGS]{{ call['function']['arguments'] }}{%- endfor %}{%- endif %}
{{- eos_token }}
{%- elif message['role'] == 'tool' %}[TOOL_RESULTS]{{ message['content'] }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}
"""


@dataclass(frozen=True)
class Chain:
    """What the built model writes after `start` (the prompt's last token): `ids` (the think
    tokens included; EOS follows), the thought's and the answer's tokens and texts."""

    path: Path
    start: int
    think: int
    end_think: int
    eos: int
    thought_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    thought: str
    answer: str

    @property
    def ids(self) -> list[int]:
        return [self.think, *self.thought_ids, self.end_think, *self.answer_ids]


# The thought's and the answer's pieces: whole BPE tokens of the fixture's vocabulary (tekken
# byte-level pieces), no whitespace at either end of either text, so no server's trimming of a
# thought or an answer can change them.
THOUGHT_PIECES = ("and", "Ġthe")  # "and the"
ANSWER_PIECES = ("port", "ing")  # "porting"


def _byte_level_text(piece: str) -> str:
    """A byte-level BPE piece's text (Ġ is a space); the pieces used here are ASCII."""
    return piece.replace("Ġ", " ")


def build_chain_model(dst: str | Path, src: str | Path = SOURCE) -> Chain:
    """Write the chain model at `dst` (a copy of the f32 fixture with the edits above)."""
    reader = GGUFReader(src)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tensors = {t.name: np.array(read_tensor_payload(t)[0]) for t in reader.tensors}
    n_layers = int(reader.fields["mistral3.block_count"].contents())
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    del reader

    for slot, name in THINKING_SLOTS.items():
        tokens[slot] = name
    index = {piece: i for i, piece in enumerate(tokens)}
    start, think, end_think = index["[/INST]"], index["[THINK]"], index["[/THINK]"]
    thought_ids = tuple(index[p] for p in THOUGHT_PIECES)
    answer_ids = tuple(index[p] for p in ANSWER_PIECES)
    order = [start, think, *thought_ids, end_think, *answer_ids]  # each one's successor follows it
    successors = order[1:] + [eos]
    if len(set(order + [eos])) != len(order) + 1:
        raise ValueError("the chain's tokens must be distinct")

    embed = tensors["token_embd.weight"].astype(np.float32)  # (vocab, hidden)
    hidden = embed.shape[1]
    if len(order) > hidden:
        raise ValueError(f"a chain of {len(order)} tokens needs more than {hidden} directions")
    output = np.zeros_like(tensors["output.weight"], dtype=np.float32)
    for direction, (token, successor) in enumerate(zip(order, successors)):
        embed[token] = 0.0
        embed[token, direction] = 1.0
        output[successor, direction] = OUTPUT_SCALE
    replace = {"token_embd.weight": embed, "output.weight": output,
               "output_norm.weight": np.ones(hidden, dtype=np.float32)}
    for layer in range(n_layers):
        for name in ("attn_output", "ffn_down"):
            key = f"blk.{layer}.{name}.weight"
            replace[key] = np.zeros_like(tensors[key], dtype=np.float32)

    path = rewrite_gguf(src, dst, replace_tensors=replace, set_kv={
        "tokenizer.ggml.tokens": tokens, "tokenizer.chat_template": TEMPLATE,
        "general.name": "Chain_Tiny"})
    return Chain(Path(path), start, think, end_think, eos, thought_ids, answer_ids,
                 "".join(_byte_level_text(p) for p in THOUGHT_PIECES),
                 "".join(_byte_level_text(p) for p in ANSWER_PIECES))
