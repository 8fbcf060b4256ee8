"""The model's own system prompt composed with the chat's (issue 36, item 3; app/model_prompt.py):
which catalogue entry a file is, the composed system message, and, through a real ChatSession and
engine worker on the tiny model made to think (filed as Magistral Small 1.2), the prompt ids the
engine read: the model's prompt (its [THINK] template) and the chat's, or the chat's alone."""
from __future__ import annotations


import pytest

from tramontane.app.model_prompt import (OWN_PROMPT_ONLY_KEY, catalog_entry_for, compose_system_prompt,
                                         model_system_prompt)
from tramontane.engine.api import ChatMessage, ThinkPart
from tramontane.engine.library.catalog import load_catalog

MAGISTRAL = "magistral-small-1.2-24b"


def entry(entry_id: str):
    return next(e for e in load_catalog() if e.id == entry_id)


@pytest.mark.parametrize("path, expected", [
    # a download: the repository's own folder
    ("/m/unsloth__Magistral-Small-2509-GGUF/anything.gguf", MAGISTRAL),
    # a variant's pinned file, anywhere
    ("/d/mistralai_Mistral-Small-3.1-24B-Instruct-2503-Q8_0.gguf", "mistral-small-3.1-24b-instruct"),
    # the publisher's file names begin with the repository's model name
    ("/d/Ministral-3-8B-Reasoning-2512-Q4_K_M.gguf", "ministral-3-8b-reasoning"),
    ("/d/Ministral-3-8B-Instruct-2512-Q4_K_M.gguf", "ministral-3-8b-instruct"),
    ("/d/Magistral-Small-2509-Q8_0.gguf", MAGISTRAL),
    ("/d/Magistral-Small-25090-Q8_0.gguf", None),  # a longer name is another model
    # Mistral's Devstral 1.1 repository ends "_gguf": its unpinned Q8_0 file is still the model's
    ("/d/Devstral-Small-2507-Q8_0.gguf", "devstral-small-2507-24b"),
    ("/d/mistral3_tiny-f32.gguf", None),
])
def test_a_file_is_matched_to_its_catalogue_entry(path, expected):
    found = catalog_entry_for(path)
    assert (found.id if found else None) == expected


def test_the_reasoning_entries_ship_a_think_template():
    parts = entry(MAGISTRAL).system_prompt
    assert any(isinstance(p, ThinkPart) for p in parts) and isinstance(parts[-1], str)


@pytest.mark.parametrize("entry_id", [MAGISTRAL, "ministral-3-8b-reasoning"])
def test_the_chats_prompt_goes_first_and_the_models_is_appended_after_it(entry_id):
    """Ministral 3 Reasoning's card: "Use our provided system prompt, and append it to your custom
    system prompt" (Magistral's names no order: the same rule)."""
    model = entry(entry_id).system_prompt
    user = [ChatMessage.text("user", "Hi")]
    chat = [ChatMessage.text("system", "Answer in French."), *user]
    composed = compose_system_prompt(chat, model, can_think=True)
    assert composed[0].role == "system" and composed[0].parts == ["Answer in French.", *model]
    assert isinstance(composed[0].parts[-2], ThinkPart)  # the [THINK] template stays last, before the turns
    assert composed[1:] == user
    assert compose_system_prompt(user, model, can_think=True)[0].parts == list(model)  # no prompt of its own
    assert compose_system_prompt(chat, model, can_think=True, own_only=True) == chat
    assert compose_system_prompt(chat, (), can_think=True) == chat  # a model that ships none
    # a format without [THINK] chunks keeps the template's words, not its thought
    flat = compose_system_prompt(chat, model, can_think=False)[0].parts
    assert flat == ["Answer in French."] + [p for p in model if isinstance(p, str)]


def test_a_server_has_no_model_prompt_of_ours():
    from tramontane.engine.remote.client import RemoteEngine

    path = "/m/unsloth__Magistral-Small-2509-GGUF/x.gguf"
    assert RemoteEngine("http://127.0.0.1:9", "magistral").model_path is None
    assert model_system_prompt(None) == () and model_system_prompt("") == ()
    assert model_system_prompt(path) == entry(MAGISTRAL).system_prompt


# --------------------------------------------------------------------------- through the worker

@pytest.fixture
def magistral_engine(tmp_path):
    """The tiny model made to think, as a downloaded Magistral file (the repository's folder)."""
    from tramontane.engine.runtime.local import LocalEngine

    from support.served import MODEL
    from support.thinking import as_magistral_download, thinking_tokenizer

    path = as_magistral_download(MODEL, tmp_path)
    engine = LocalEngine(path, None, device="cpu", context_length=2048)
    engine.tokenizer = thinking_tokenizer(MODEL)
    yield engine
    engine.close()


def test_the_prompt_the_engine_reads_holds_both_system_prompts(qtbot, worker, magistral_engine, tmp_path):
    from tramontane.app.chat_session import ChatSession
    from tramontane.app.config import AppSettings
    from tramontane.app.store import Store

    engine = magistral_engine
    with qtbot.waitSignal(worker.loaded, timeout=30000) as loaded:
        worker.use_engine(engine)
    with Store(tmp_path / "data") as store:
        settings = AppSettings(store)
        settings.default_system_prompt = "Answer in French."
        session = ChatSession(store, settings, worker)
        session.engine_info = loaded.args[0]
        session.param_overrides = {"max_tokens": 2, "temperature": 0.0}

        def reply(text: str) -> list[int]:
            with qtbot.waitSignal(worker.finished, timeout=60000) as done:
                assert session.send(text, []) == ""
            return done.args[1].prompt_token_ids

        ids = reply("Hi")
        chat_id = session.current_chat_id
        model = entry(MAGISTRAL).system_prompt
        expected = engine.encode([ChatMessage("system", ["Answer in French.", *model]),
                                  ChatMessage.text("user", "Hi")]).ids
        assert ids == expected
        think, end_think = engine.tokenizer.think_ids
        assert think in ids and end_think in ids  # Magistral's reasoning instructions survived
        french = engine.tokenizer.encode("Answer in French")  # its "." joins the "\n\n" after it
        at = next(i for i in range(len(ids)) if ids[i:i + len(french)] == french)
        assert at < ids.index(think)  # the chat's prompt first, the model's [THINK] template after it
        # what the store keeps is the chat's own prompt: the model's is added for each reply
        assert store.get_chat_info(chat_id).system_prompt == "Answer in French."

        session.set_own_prompt_only(chat_id, True)
        assert store.get_chat_info(chat_id).settings[OWN_PROMPT_ONLY_KEY] is True
        ids = reply("Again")
        history = store.engine_messages(chat_id)[:-1]  # without the reply being written now
        assert history[0].parts == ["Answer in French."]
        assert ids == engine.encode(history).ids
        assert think not in ids[:ids.index(engine.tokenizer.token_id("[/SYSTEM_PROMPT]"))]
