"""OpenAI's `file` content parts on /v1/chat/completions (issue 37): the official `openai` client
sends an fpdf2 PDF as a data URL and gets the reply the same engine gives in-process to the
conversation documents_prompt makes (the window's rule), token for token; a file that cannot
be read, a file outside a user message, bad base64: a 400 with the one sentence."""
from __future__ import annotations

import base64

import pytest

openai = pytest.importorskip("openai", reason="the official client is the reference (test extra)")
fpdf = pytest.importorskip("fpdf")

from tramontane.engine.api import ChatMessage, DocumentPart, SamplingParams  # noqa: E402
from tramontane.engine.documents.prompt import engine_documents_prompt  # noqa: E402
from tramontane.engine.runtime.local import LocalEngine  # noqa: E402
from tramontane.engine.server.executor import ThreadExecutor  # noqa: E402
from tramontane.engine.server.http import OpenAIServer  # noqa: E402

from support import FIXTURES  # noqa: E402

MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
NAME = "mistral3_tiny-f32"


def pdf_bytes(*pages: str) -> bytes:
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    return bytes(pdf.output())


def file_part(data: bytes, name: str | None, mime: str = "application/pdf") -> dict:
    file = {"file_data": f"data:{mime};base64,{base64.b64encode(data).decode()}"}
    if name is not None:
        file["filename"] = name
    return {"type": "file", "file": file}


@pytest.fixture(scope="module")
def engine():
    e = LocalEngine(MODEL, None, device="cpu")
    yield e
    e.close()


@pytest.fixture(scope="module")
def served(engine):
    executor = ThreadExecutor(engine)
    server = OpenAIServer(executor, port=0).start()
    yield server
    server.stop()
    executor.shutdown()


@pytest.fixture(scope="module")
def reference():
    e = LocalEngine(MODEL, None, device="cpu")
    yield e
    e.close()


def client(url: str) -> "openai.OpenAI":
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def test_a_pdf_file_part_is_read_and_placed_as_the_window_places_it(served, reference):
    data = pdf_bytes("The spare key is under the third flowerpot.", "Page two: the gate code is 4471.")
    reply = client(served.url).chat.completions.create(
        model=NAME, max_tokens=6, temperature=0,
        messages=[{"role": "user", "content": [file_part(data, "house.pdf"), {"type": "text", "text": "Where is the key?"}]}])
    asked = [ChatMessage("user", [DocumentPart(data, "house.pdf"), "Where is the key?"])]
    prompt = engine_documents_prompt(reference, asked, 6)
    assert prompt.mode_of(asked[0].parts[0].sha256) == "whole"
    assert "the gate code is 4471" in prompt.messages[0].parts[0] and "--- page 2 ---" in prompt.messages[0].parts[0]
    want = reference.chat(prompt.messages, SamplingParams(max_tokens=6, temperature=0), session_key="documents")
    assert reply.choices[0].message.content == want.text
    assert reply.usage.prompt_tokens == len(want.prompt_token_ids) == reference.count_tokens(prompt.messages)
    # a name without a suffix gets the data URL's type; the text is then the same
    again = client(served.url).chat.completions.create(
        model=NAME, max_tokens=6, temperature=0,
        messages=[{"role": "user", "content": [file_part(data, "house"), {"type": "text", "text": "Where is the key?"}]}])
    assert again.choices[0].message.content == want.text


def test_a_text_file_streams_like_any_reply(served, reference):
    data = b"# Minutes\n\nThe committee meets on Thursdays.\n"
    stream = client(served.url).chat.completions.create(
        model=NAME, max_tokens=5, temperature=0, stream=True,
        messages=[{"role": "user", "content": [{"type": "text", "text": "When?"}, file_part(data, "minutes.md", "text/markdown")]}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    asked = [ChatMessage("user", ["When?", DocumentPart(data, "minutes.md")])]
    prompt = engine_documents_prompt(reference, asked, 5)
    assert prompt.messages[0].parts == ['<document name="minutes.md">\n# Minutes\n\nThe committee meets on Thursdays.\n</document>', "When?"]
    assert text == reference.chat(prompt.messages, SamplingParams(max_tokens=5, temperature=0)).text


@pytest.mark.parametrize("part, where, sentence", [
    (file_part(b"\x89PNG\r\n\x1a\n" + bytes(64), "notes.txt", "text/plain"), "messages",
     "notes.txt: the file is a PNG image"),
    (file_part(b"%PDF-1.7\nnot really a pdf", "broken.pdf"), "messages", "broken.pdf:"),
    ({"type": "file", "file": {"file_data": "data:application/pdf;base64,@@@", "filename": "x.pdf"}},
     "messages[0].content[0].file", 'x.pdf: "file_data" is not valid base64'),
    ({"type": "file", "file": {"file_id": "file-abc"}}, "messages[0].content[0].file", "file_id"),
])
def test_a_bad_file_is_a_400_with_one_sentence(served, part, where, sentence):
    with pytest.raises(openai.BadRequestError) as caught:
        client(served.url).chat.completions.create(
            model=NAME, max_tokens=4, messages=[{"role": "user", "content": [part, {"type": "text", "text": "Read it"}]}])
    error = caught.value.body
    assert caught.value.status_code == 400 and error["code"] == "invalid_file" and error["param"] == where
    assert error["message"].startswith(f"{where}: ") and sentence in error["message"]
    assert error["message"].count("\n") == 0 and "Traceback" not in error["message"]


def test_a_file_outside_a_user_message_is_refused(served):
    with pytest.raises(openai.BadRequestError, match="files can only be sent in user messages"):
        client(served.url).chat.completions.create(
            model=NAME, max_tokens=4, messages=[
                {"role": "system", "content": [file_part(b"hello", "a.txt", "text/plain")]},
                {"role": "user", "content": "Hi"}])
