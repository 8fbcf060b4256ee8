"""A whole multimodal prompt, end to end: our ids equal mistral-common's, our logits equal HF's
Mistral3ForConditionalGeneration fed mistral-common's own pixels, and greedy tokens agree."""
import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("mistral_common", reason="mistral-common is the reference (test extra)")
transformers = pytest.importorskip("transformers", reason="HF transformers is the reference (test extra)")

from mistral_common.protocol.instruct.chunk import ImageChunk, TextChunk  # noqa: E402
from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

from tramontane.engine.api import ChatMessage, ImagePart, SamplingParams  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402

from support import FIXTURES
CASES = {
    "silu": ("mistral3_tiny", "mistral3_tiny-f32.gguf", "mmproj-mistral3_tiny-f32.gguf"),
    "gelu": ("mistral3_tiny_gelu", "mistral3_tiny_gelu-f32.gguf", "mmproj-mistral3_tiny_gelu-f32.gguf"),
}


def photo(w, h, seed, mode="RGB", fmt="PNG") -> ImagePart:
    """A smooth random picture (noise would make every resampler look alike)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 8, 2), max(w // 8, 2), 4), dtype=np.uint8)
    img = Image.fromarray(small, "RGBA").resize((w, h), Image.BILINEAR)
    if mode == "RGBA":
        alpha = np.linspace(0, 255, w, dtype=np.uint8)[None, :].repeat(h, 0)
        img.putalpha(Image.fromarray(alpha))
    else:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return ImagePart(buf.getvalue(), f"photo{seed}.{fmt.lower()}")


def reference_request(messages: list[ChatMessage]):
    out = []
    for m in messages:
        chunks = [TextChunk(text=p) if isinstance(p, str) else ImageChunk(image=Image.open(io.BytesIO(p.data)))
                  for p in m.parts]
        content = m.parts[0] if len(m.parts) == 1 and isinstance(m.parts[0], str) else chunks
        out.append({"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}[m.role](content=content))
    return ChatCompletionRequest(messages=out)


_ENGINES: dict = {}


def setup(case):
    if case not in _ENGINES:
        hf_dir, text, proj = CASES[case]
        engine = LocalEngine(os.path.join(FIXTURES, text), os.path.join(FIXTURES, proj), device="cpu",
                             context_length=512)
        hf = transformers.Mistral3ForConditionalGeneration.from_pretrained(
            os.path.join(FIXTURES, hf_dir), dtype=torch.float32).eval()
        ref = MistralTokenizer.from_file(os.path.join(FIXTURES, "tekken_tiny.json"))
        _ENGINES[case] = (engine, hf, ref)
    return _ENGINES[case]


def hf_logits(hf, ids: list[int], images: list[np.ndarray]) -> torch.Tensor:
    """HF fed mistral-common's pixels (padded batch + image_sizes, as HF's processor does)."""
    kwargs = {}
    if images:
        hmax = max(im.shape[1] for im in images)
        wmax = max(im.shape[2] for im in images)
        batch = torch.zeros(len(images), 3, hmax, wmax)
        for i, im in enumerate(images):
            batch[i, :, : im.shape[1], : im.shape[2]] = torch.from_numpy(np.asarray(im, dtype=np.float32))
        kwargs = dict(pixel_values=batch, image_sizes=torch.tensor([list(im.shape[1:]) for im in images]))
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), **kwargs).logits[0]


CONVERSATIONS = {
    "one image": lambda: [ChatMessage("user", [photo(64, 48, 1), "What is in this picture?"])],
    "two images, system prompt": lambda: [
        ChatMessage.text("system", "You describe pictures."),
        ChatMessage("user", ["Compare", photo(90, 40, 2), "with", photo(30, 100, 3, "L")]),
    ],
    "larger than image_size, with transparency": lambda: [
        ChatMessage("user", [photo(300, 170, 4, "RGBA"), "Describe it."])],
    "images across turns": lambda: [
        ChatMessage("user", [photo(50, 50, 5), "First?"]),
        ChatMessage.text("assistant", "A square."),
        ChatMessage("user", ["And this one?", photo(120, 60, 6, fmt="JPEG")]),
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_prompt_ids_and_logits_match_mistral_common_and_hf(case, name):
    engine, hf, ref = setup(case)
    messages = CONVERSATIONS[name]()
    expected = ref.encode_chat_completion(reference_request(messages))
    prompt = engine.encode(messages)
    assert prompt.ids == expected.tokens
    assert len(prompt.image_spans) == len(expected.images)

    ours = engine.model.forward(engine.prompt_rows(prompt), 0, None, all_logits=True)
    theirs = hf_logits(hf, expected.tokens, expected.images)
    # Every position, image rows included; f32 file vs HF f32 on the same weights.
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["two images, system prompt", "larger than image_size, with transparency"])
def test_greedy_tokens_match_hf_generate(name):
    engine, hf, ref = setup("silu")
    messages = CONVERSATIONS[name]()
    expected = ref.encode_chat_completion(reference_request(messages))
    result = engine.chat(messages, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                         session_key=f"greedy-{name}")
    ids = list(expected.tokens)
    for _ in range(12):
        ids.append(int(hf_logits(hf, ids, expected.images)[-1].argmax()))
    assert result.token_ids == ids[len(expected.tokens):]
