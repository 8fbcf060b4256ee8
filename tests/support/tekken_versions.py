"""The v7 / v11 / v13 tekken tokenizers the chat-format tests compare: ours from the GGUF that
llama.cpp's converter made of mistral-common's real tekken_240911.json, and mistral-common's own
from the same JSON with the version string set.

For v11+ the file's unused control slots 32-35 are named [ARGS], [CALL_ID], [THINK], [/THINK],
where Mistral's later tekken files (Mistral Small 3.2, Magistral, Ministral 3, Devstral) have
them; ours also gets the chat template text llama.cpp's converter writes per version (only its
markers matter)."""
from __future__ import annotations

import io
import json
import os

import numpy as np
from PIL import Image

from tramontane.engine.api import ImagePart
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3.tokenizer import Tokenizer

from support import FIXTURES

TEKKEN_GGUF = os.path.join(FIXTURES, "tekken_240911_tokenizer.gguf")
LATER_CONTROLS = {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}
TEMPLATES = {7: "mistral-v7-tekken",
             11: "{{- '[TOOL_CALLS]' + name + '[CALL_ID]' + id + '[ARGS]' + arguments }}"
                 "{{- '[TOOL_RESULTS]' + id + '[TOOL_CONTENT]' + content + '[/TOOL_RESULTS]' }}",
             13: "{{- '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}"
                 "{{- '[TOOL_RESULTS]' + content + '[/TOOL_RESULTS]' }}"}
# Mistral-Small-3.1's image settings (patch 14, merge 2 -> 28 px per token, longest side 1540)
SMALL31_IMAGE = {"image_patch_size": 14, "max_image_size": 1540, "spatial_merge_size": 2}


def pil_image(image: ImagePart) -> Image.Image:
    """An image part as PIL opens it (what mistral-common's image encoder is given)."""
    return Image.open(io.BytesIO(image.data))


def reference_grid(ref):
    """mistral-common's (rows, cols) of image tokens of an image part, from the reference
    tokenizer `ref`: the image_grid our encode_chat is compared with."""
    encoder = ref.instruct_tokenizer.image_encoder

    def image_grid(image: ImagePart) -> tuple[int, int]:
        cols, rows = encoder._image_to_num_tokens(pil_image(image))
        return rows, cols

    return image_grid


def tekken_tokenizer() -> Tokenizer:
    """Our tokenizer of the tekken_240911 file as it is (its own slots and template)."""
    with open_gguf(TEKKEN_GGUF) as gf:
        return Tokenizer.from_gguf(gf)


def our_tokenizer(version: int, controls: dict[int, str] | None = None,
                  template: str | None = None) -> Tokenizer:
    """Our tokenizer of the version's file: `controls` renames slots (default: the later ones
    for v11+), `template` replaces the version's template text."""
    with open_gguf(TEKKEN_GGUF) as gf:
        kv = dict(gf.kv)
    if controls is None:
        controls = LATER_CONTROLS if version > 7 else {}
    if controls:
        tokens = list(kv["tokenizer.ggml.tokens"])
        for rank, name in controls.items():
            tokens[rank] = name
        kv["tokenizer.ggml.tokens"] = tokens
        kv["tokenizer.ggml.token_type"] = np.asarray(kv["tokenizer.ggml.token_type"])
    kv["tokenizer.chat_template"] = TEMPLATES[version] if template is None else template
    return Tokenizer.from_kv(kv, f"tekken-v{version}.gguf")


def reference_tokenizer(version: int, folder, image: dict | None = None):
    """mistral-common's MistralTokenizer of the version (with an image encoder given `image`)."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    data = json.loads((MistralTokenizer._data_path() / "tekken_240911.json").read_text(encoding="utf-8"))
    data["config"]["version"] = f"v{version}"
    if image is not None:
        data["image"] = image
    if version > 7:
        special = [dict(t, token_str=str(t["token_str"].value)) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
        special += [{"rank": r, "token_str": f"<SPECIAL_{r}>", "is_control": True} for r in range(20, 32)]
        special += [{"rank": r, "token_str": n, "is_control": True} for r, n in LATER_CONTROLS.items()]
        data["special_tokens"] = special
    path = os.path.join(str(folder), f"tekken_v{version}{'_image' if image else ''}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return MistralTokenizer.from_file(path)
