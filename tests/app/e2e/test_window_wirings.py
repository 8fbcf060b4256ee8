"""Three wirings of the window, on the real window with the tiny model (issues 36, 37):

* a document chip says its tokens by the loaded model's own tokenizer (Composer.set_token_counter,
  given by Conversation.update_model_state), counted on the job pool, also while a reply is being
  written; no model and a server's chat give no counter (the chip shows its name);
* Chat settings holds the chat's "own system prompt only" (the prompt the engine reads then has
  none of the model's shipped prompt) and, where the chat may call tools, "tools required"; both
  stored per chat, kept over a restart, and chosen for the new chat before it is saved;
* deleting a chat makes the engine forget the prompt its replies were read from, the model's
  shipped system prompt first: no named block of it is left in the engine's pool.

The tiny model is filed as a downloaded Magistral (the repository's folder), so the catalogue
gives it Magistral's system prompt."""
from __future__ import annotations


import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tramontane.app.dialogs.chat_settings import ChatSettingsDialog  # noqa: E402
from tramontane.app.model_prompt import OWN_PROMPT_ONLY_KEY, catalog_entry_for  # noqa: E402
from tramontane.app.tools import TOOLS_REQUIRED_KEY  # noqa: E402
from tramontane.engine.api import DocumentPart  # noqa: E402
from tramontane.engine.documents.block import document_block  # noqa: E402
from tramontane.engine.documents.extract import extract  # noqa: E402
from tramontane.engine.documents.prompt import token_counter  # noqa: E402

from support.app_window import MODEL, close_window, load_and_wait, make_window, send  # noqa: E402
from support.thinking import as_magistral_download  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated")

NOTE = b"The boiler room key hangs behind the blue door.\n" * 3
CHAT_PROMPT = "Answer in French."


@pytest.fixture
def magistral(tmp_path):
    """The tiny model as a downloaded Magistral file; the words its catalogue prompt begins with."""
    path = as_magistral_download(MODEL, tmp_path)
    words = next(p for p in catalog_entry_for(path).system_prompt if isinstance(p, str))
    assert len(words) > 40
    return path, words[:40]


def magistral_window(qtbot, tmp_path, magistral):
    window = make_window(qtbot, tmp_path / "data", load=False)
    load_and_wait(qtbot, window, magistral[0])
    assert window.session.engine_info is not None and window.session.engine_info.model_path == str(magistral[0])
    window.settings.default_system_prompt = CHAT_PROMPT
    return window


def record_prompts(window) -> list[list[int]]:
    """The prompt ids the worker's engine generates from, reply by reply."""
    engine, seen = window.worker.engine, []
    generate_from = engine.generate_from

    def recording(prompt, *args, **kwargs):
        seen.append(list(prompt.ids))
        return generate_from(prompt, *args, **kwargs)

    engine.generate_from = recording
    return seen


def through_menu(window, fill) -> list:
    """Chat ▸ Chat settings…, `fill(dialog)` (what it returns is kept) then OK, as the user does."""
    got = []

    def answer():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, ChatSettingsDialog)
        got.append(fill(dialog))
        dialog.accept()

    QTimer.singleShot(0, answer)
    window.chat_settings_action.trigger()
    assert len(got) == 1
    return got[0]


def tick(box_name: str, on: bool):
    def fill(dialog):
        box = getattr(dialog, box_name)
        assert not box.isHidden()
        box.setChecked(on)
    return fill


def shown(dialog) -> tuple:
    """(own prompt only ticked, tools required ticked or None where hidden)."""
    tools = None if dialog.tools_required.isHidden() else dialog.tools_required.isChecked()
    return dialog.own_prompt_only.isChecked(), tools


# --------------------------------------------------------------------------- document chips

def attach_note(qtbot, window, name: str = "key.md", data: bytes = NOTE):
    composer = window.composer
    assert composer.add_document(DocumentPart(data, name))
    qtbot.waitUntil(lambda: not composer.checking, timeout=30000)
    return composer.document_chips[-1]


def test_a_document_chip_counts_with_the_loaded_model_also_while_it_writes(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    engine = window.worker.engine
    assert window.composer.count_text is not None  # given with the load
    tokens = token_counter(engine.count_tokens)(document_block(extract(NOTE, "key.md")))
    assert tokens > 20
    chip = attach_note(qtbot, window)
    assert chip.tokens == tokens and chip.label.text() == f"key.md · {tokens:,} tokens"
    chip.remove_button.click()

    # while a long reply is written on the worker, counts on the job pool give the same numbers
    window.session.param_overrides = {**window.session.param_overrides, "max_tokens": 400}
    assert window.session.send("write a long story", []) == ""
    qtbot.waitUntil(lambda: window.session.pending is not None and window.session.pending.pieces > 2, timeout=30000)
    copies = [NOTE + b"Copy %d of the note.\n" % i for i in range(4)]
    counted = [attach_note(qtbot, window, f"key{i}.md", data).tokens for i, data in enumerate(copies)]
    assert window.session.pending is not None  # still writing when the counts came back
    count = token_counter(engine.count_tokens)
    assert counted == [count(document_block(extract(data, f"key{i}.md"))) for i, data in enumerate(copies)]
    window.session.stop()
    qtbot.waitUntil(lambda: window.session.pending is None, timeout=30000)
    for chip in list(window.composer.document_chips):
        chip.remove_button.click()

    with qtbot.waitSignal(window.worker.unloaded, timeout=30000):
        window.unload_action.trigger()
    qtbot.waitUntil(lambda: window.session.engine_info is None, timeout=10000)
    assert window.composer.count_text is None
    chip = attach_note(qtbot, window)
    assert chip.tokens is None and chip.label.text() == "key.md"
    close_window(window)


def test_a_server_chat_gives_the_chips_no_counter(qtbot, tmp_path):
    from support.app_window import pick_server
    from support.fakevllm import FakeVLLM

    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    assert window.composer.count_text is not None  # given with the load
    with FakeVLLM(models=["served-model"], reply="Hi.") as fake:
        pick_server(qtbot, window, fake)
        assert window.session.engine_info.remote
        assert window.composer.count_text is None
        chip = attach_note(qtbot, window)
        assert chip.tokens is None and chip.label.text() == "key.md"
    close_window(window)


# --------------------------------------------------------------------------- Chat settings

def test_own_system_prompt_only_is_sent_stored_and_kept(qtbot, tmp_path, magistral):
    window = magistral_window(qtbot, tmp_path, magistral)
    prompts = record_prompts(window)
    decode = window.worker.engine.tokenizer.decode
    send(qtbot, window, "hello")
    chat_id = window.session.current_chat_id
    assert magistral[1] in decode(prompts[-1]) and CHAT_PROMPT in decode(prompts[-1])
    assert through_menu(window, shown) == (False, None)  # tools are off: no tools box

    through_menu(window, tick("own_prompt_only", True))
    assert window.store.get_chat_info(chat_id).settings[OWN_PROMPT_ONLY_KEY] is True
    send(qtbot, window, "again")
    assert magistral[1] not in decode(prompts[-1]) and CHAT_PROMPT in decode(prompts[-1])

    window.navigation.new_chat()  # chosen for the new chat before its first message
    assert through_menu(window, shown) == (False, None)
    through_menu(window, tick("own_prompt_only", True))
    send(qtbot, window, "new one")
    new_chat = window.session.current_chat_id
    assert new_chat != chat_id and magistral[1] not in decode(prompts[-1])
    assert window.store.get_chat_info(new_chat).settings[OWN_PROMPT_ONLY_KEY] is True
    window.navigation.new_chat()  # the next new chat is back to the model's prompt first
    assert through_menu(window, shown) == (False, None)
    close_window(window)

    window = make_window(qtbot, tmp_path / "data", load=False)  # a restart
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    assert through_menu(window, shown) == (True, None)
    through_menu(window, tick("own_prompt_only", False))
    assert OWN_PROMPT_ONLY_KEY not in window.store.get_chat_info(chat_id).settings
    close_window(window)


def test_tools_required_is_offered_where_tools_are_on_and_kept(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", load=False)
    chat_id = window.store.create_chat("tools")
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    assert through_menu(window, shown) == (False, None)
    window.tools_switch.toggle(True)
    assert through_menu(window, shown) == (False, False)
    through_menu(window, tick("tools_required", True))
    assert window.store.get_chat_info(chat_id).settings[TOOLS_REQUIRED_KEY] is True
    window.tools_switch.toggle(False)  # hidden: the stored choice is left as it was
    assert through_menu(window, shown) == (False, None)
    assert window.store.get_chat_info(chat_id).settings[TOOLS_REQUIRED_KEY] is True
    window.tools_switch.toggle(True)
    close_window(window)

    window = make_window(qtbot, tmp_path / "data", load=False)  # a restart
    window.navigation.refresh_chat_list()
    window.navigation.open_chat(chat_id)
    assert through_menu(window, shown) == (False, True)
    through_menu(window, tick("tools_required", False))
    assert TOOLS_REQUIRED_KEY not in window.store.get_chat_info(chat_id).settings
    close_window(window)


def test_tools_required_chosen_for_the_new_chat_is_saved_with_it(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", mmproj=False)
    window.navigation.new_chat()
    window.tools_switch.toggle(True)
    through_menu(window, tick("tools_required", True))
    send(qtbot, window, "hello")
    chat_id = window.session.current_chat_id
    assert window.store.get_chat_info(chat_id).settings[TOOLS_REQUIRED_KEY] is True
    window.navigation.new_chat()
    assert not window.session.tools_required(None)  # the next new chat starts without
    close_window(window)


# --------------------------------------------------------------------------- delete

def test_a_deleted_chat_leaves_no_named_block_of_its_composed_prompt(qtbot, tmp_path, magistral):
    window = magistral_window(qtbot, tmp_path, magistral)
    engine = window.worker.engine
    prompts = record_prompts(window)
    send(qtbot, window, "hello")
    send(qtbot, window, "and again")
    chat_id = window.session.current_chat_id
    assert magistral[1] in engine.tokenizer.decode(prompts[-1])  # the model's prompt was read
    qtbot.waitUntil(lambda: window.session.pending is None, timeout=10000)
    assert engine.pool.named() > 0
    window.chats.delete_chat(chat_id)
    window.chats.commit_deletes()
    qtbot.waitUntil(lambda: engine.pool.named() == 0, timeout=10000)
    assert window.store.list_chats() == []
    close_window(window)
