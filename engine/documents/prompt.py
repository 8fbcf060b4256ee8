"""The one way attached documents go into a prompt, for the window, the CLI and the server:
`documents_prompt` turns every `DocumentPart` of a conversation into text (and page images)
before the chat format encodes it.

Whole: the document's block (`block.document_block`) and the images of its scanned pages go
into the user message that attached it, before that message's own text. The block's bytes
depend on the document alone and that message keeps its place in the conversation, so every
later turn's prompt starts with the same tokens up to and past the document, and the KV prefix
cache (its disk tier too) gives them back instead of reading the document again. In the system
prompt it would move whenever another document is attached; in the newest message it would be
read again on every turn.

Retrieved: a document too long for the room the conversation and the reply leave is indexed
(`retrieval.DocumentIndex`, the chat's own, or one for this call) and the newest user message
gets, before its text, the excerpts its question finds (`block.excerpts_block`), with their
`sources` for the reply. The message that attached it carries a one-line note naming it (the
same bytes every turn). Excerpts follow each question, so they sit in the newest message only:
an earlier question's excerpts are not repeated, and the prompt from that message on is read
again (the excerpts and the question, short by design).

The excerpts are cut to the room the context leaves (`fitting_excerpts`): a context smaller
than retrieval's RETRIEVAL_TOKENS gets the best excerpts that fit, the last of them shortened,
by the engine's own rule for a prompt that fits (runtime/prompts.check_fits) on the prompt as
the engine counts it."""
from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..api import ChatMessage, DocumentPart, EngineError
from ..mistral3.config import VisionConfig
from .block import Source, document_block, excerpts_block, retrieved_note, sources
from .document import Document, DocumentError, Limits
from .extract import extract
from .retrieval import TOKEN, Budget, DocumentIndex, Hit, Placement, place_documents
from .scans import render_scans, scan_note

EXCERPTS = 5  # chunks a question brings in (recall@5 is what the retrieval tests hold)
UNKNOWN_CONTEXT = 32768  # an engine that does not say its context (a remote server): assumed
BYTES_PER_TOKEN = 3  # an engine that cannot count: a text's tokens guessed from its UTF-8 bytes
MIN_EXCERPT_WORDS = 12  # an excerpt shortened to fit keeps at least this many words, or goes


@dataclass
class DocumentPrompt:
    """A conversation with its documents in the prompt's form, and what the window tells about them."""

    messages: list[ChatMessage]
    placements: dict[str, Placement] = field(default_factory=dict)  # by sha256, in attachment order
    sources: list[Source] = field(default_factory=list)  # the excerpts' (file, page), for under the reply
    notes: list[str] = field(default_factory=list)  # sentences: pages cut, scans not read

    def mode_of(self, sha256: str) -> str | None:
        placement = self.placements.get(sha256)
        return placement.mode if placement is not None else None


def read_document(part: DocumentPart, limits: Limits = Limits(), cancel=None) -> DocumentPart:
    """The part with its text read (through `extract`), if it had none."""
    if isinstance(part.document, Document):
        return part
    return replace(part, document=extract(part.data, part.name, limits, cancel))


def token_counter(count_messages: Callable[[list[ChatMessage]], int | None]) -> Callable[[str], int]:
    """Tokens of a text as a user message's content, from an engine's `count_tokens`; where
    the engine cannot count, UTF-8 bytes / BYTES_PER_TOKEN."""
    empty = count_messages([ChatMessage.text("user", "")])

    def count(text: str) -> int:
        if empty is not None:
            counted = count_messages([ChatMessage.text("user", text)])
            if counted is not None:
                return counted - empty
        return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)
    return count


def _distinct_documents(messages: Sequence[ChatMessage]) -> list[DocumentPart]:
    seen: dict[str, DocumentPart] = {}
    for message in messages:
        for part in message.documents:
            if message.role != "user":
                raise DocumentError(f"{part.name}: documents can only be attached to user messages, not {message.role} messages.")
            seen.setdefault(part.sha256, part)
    return list(seen.values())


def documents_prompt(messages: Sequence[ChatMessage], count_tokens: Callable[[list[ChatMessage]], int | None],
                     context_tokens: int, reply_tokens: int, vision: VisionConfig | None = None,
                     index: DocumentIndex | None = None, limits: Limits = Limits(), cancel=None) -> DocumentPrompt:
    """`messages` with every DocumentPart turned into prompt text, whole or retrieved (the rule
    of `retrieval.place_documents`, the room counted by `count_tokens`, an engine's). A document
    is placed once, where it was first attached. `index`: the chat's; None: a temporary one for
    this call where some document is retrieved. `vision`: the tower that reads scanned pages."""
    parts = [read_document(p, limits, cancel) for p in _distinct_documents(messages)]
    if not parts:
        return DocumentPrompt(list(messages))
    count_text = token_counter(count_tokens)
    documents = [p.document for p in parts]
    notes_only = _render(messages, {p.sha256: retrieved_note(p.document) for p in parts}, {}, "")
    conversation = count_tokens(notes_only)
    if conversation is None:
        conversation = count_text(_all_text(notes_only))
    budget = Budget(context_tokens or UNKNOWN_CONTEXT, conversation, reply_tokens)
    placements = place_documents(documents, count_text, budget, vision is not None)
    prompt = DocumentPrompt([], {p.sha256: pl for p, pl in zip(parts, placements)})
    blocks, images = {}, {}
    for part, placement in zip(parts, placements):
        prompt.notes += list(part.document.notes)
        if placement.mode == "whole":
            blocks[part.sha256] = document_block(part.document, vision is not None)
            images[part.sha256] = _scan_images(part, vision, limits, cancel, prompt.notes)
        else:
            blocks[part.sha256] = retrieved_note(part.document)
            if part.document.scanned_pages:
                prompt.notes.append(f"{part.name}: its scanned pages are not searched (only text is), as it is too long to include whole.")
    hits = _search([p for p, pl in zip(parts, placements) if pl.mode == "retrieved"], _question(messages), index)

    def render(chosen: list[Hit]) -> list[ChatMessage]:
        return _render(messages, blocks, images, excerpts_block(chosen))

    def count(rendered: list[ChatMessage]) -> int:
        counted = count_tokens(rendered)
        return counted if counted is not None else count_text(_all_text(rendered))

    fitted = fitting_excerpts(hits, lambda chosen: count(render(chosen)), context_tokens or UNKNOWN_CONTEXT,
                              reply_tokens)
    if len(fitted) < len(hits) or fitted and fitted[-1].text != hits[len(fitted) - 1].text:
        prompt.notes.append(f"The context leaves room for {excerpt_words(hits, fitted)}: "
                            "a larger context length would bring in more of the documents.")
    prompt.sources = sources(fitted)
    prompt.messages = render(fitted)
    return prompt


def fitting_excerpts(hits: list[Hit], count_prompt: Callable[[list[Hit]], int], context_tokens: int,
                     reply_tokens: int) -> list[Hit]:
    """The most of `hits` (best first) whose prompt fits the context by the engine's rule
    (check_fits: the prompt and the first reply token): as many whole excerpts as fit, then the
    next one cut to the words that still fit (MIN_EXCERPT_WORDS at least). `count_prompt`: the
    prompt's tokens with the given excerpts in it."""
    from ..runtime.prompts import check_fits

    def fits(chosen: list[Hit]) -> bool:
        try:
            check_fits(count_prompt(chosen), reply_tokens, context_tokens)
        except EngineError:
            return False
        return True

    kept = len(hits)
    while kept > 0 and not fits(hits[:kept]):
        kept -= 1
    if kept == len(hits):
        return list(hits)
    pieces = TOKEN.findall(hits[kept].text.strip())

    def cut(words: int) -> list[Hit]:
        return hits[:kept] + [replace(hits[kept], text="".join(pieces[:words]).rstrip() + " …")]

    lo, hi = MIN_EXCERPT_WORDS, len(pieces) - 1  # the most words that fit lie in [lo, hi], if any
    if hi < lo or not fits(cut(lo)):
        return hits[:kept]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(cut(mid)) else (lo, mid - 1)
    return cut(lo)


def excerpt_words(hits: list[Hit], fitted: list[Hit]) -> str:
    """What of the excerpts found went in: '2 of the 5 excerpts found and part of the next',
    'part of the 1 excerpt found', 'part of the best of the 3 excerpts found'."""
    whole = sum(1 for found, kept in zip(hits, fitted) if found.text == kept.text)
    found = f"{len(hits)} excerpt{'' if len(hits) == 1 else 's'} found"
    part = len(fitted) > whole
    if whole == 0:
        if not part:
            return f"none of the {found}"
        return f"part of the best of the {found}" if len(hits) > 1 else f"part of the {found}"
    return f"{whole} of the {found}" + (" and part of the next" if part else "")


def _scan_images(part: DocumentPart, vision: VisionConfig | None, limits: Limits, cancel, notes: list[str]) -> list:
    note = scan_note(part.document, vision)
    if note:
        notes.append(note)
    if vision is None or not part.document.scanned_pages:
        return []
    return [page.image_part(part.name) for page in render_scans(part.data, part.document, vision, limits, cancel)]


def _question(messages: Sequence[ChatMessage]) -> str:
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    return last_user.text_content if last_user is not None else ""


def _search(parts: list[DocumentPart], question: str, index: DocumentIndex | None) -> list[Hit]:
    """The EXCERPTS chunks of the retrieved documents the question finds (the chat's index, or
    one for this call)."""
    if not parts:
        return []
    with tempfile.TemporaryDirectory(prefix="tramontane-documents-") as scratch:
        own = index is None
        index = DocumentIndex(Path(scratch) / "index.sqlite") if own else index
        try:
            for part in parts:
                index.add(part.document, part.sha256)
            return index.search(question, EXCERPTS, [p.sha256 for p in parts])
        finally:
            if own:
                index.close()


def _render(messages: Sequence[ChatMessage], blocks: dict[str, str], images: dict[str, list],
            excerpts: str) -> list[ChatMessage]:
    """The messages with each document's first attachment replaced by its block (and images),
    later ones of the same file dropped, the excerpts before the newest user message's text
    (text parts: the chat format joins them as mistral-common joins chunks)."""
    placed: set[str] = set()
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    out = []
    for i, message in enumerate(messages):
        if not message.documents and not (excerpts and i == last_user):
            out.append(message)
            continue
        head, rest = [], []
        for part in message.parts:
            if not isinstance(part, DocumentPart):
                rest.append(part)
            elif part.sha256 not in placed:
                placed.add(part.sha256)
                head += [blocks[part.sha256], *images.get(part.sha256, ())]
        if excerpts and i == last_user:
            head.append(excerpts)
        out.append(replace(message, parts=head + rest))
    return out


def _all_text(messages: Sequence[ChatMessage]) -> str:
    return "\n".join(m.text_content for m in messages)


def engine_documents_prompt(engine, messages: Sequence[ChatMessage], reply_tokens: int,
                            index: DocumentIndex | None = None, cancel=None) -> DocumentPrompt:
    """`documents_prompt` with the engine's own counting, context and vision tower (a local
    engine's; a remote one reads no scanned pages here: it gets no page images)."""
    vision = _tower_config(engine) if engine.has_vision else None
    return documents_prompt(messages, engine.count_tokens, int(engine.context_size), reply_tokens,
                            vision, index, cancel=cancel)



def _tower_config(engine) -> VisionConfig | None:
    """The loaded vision tower's config: a LocalEngine's, or the one a BatchedEngine serves
    (`.engine`); None for a remote engine, whose tower this process cannot size pages for."""
    for owner in (engine, getattr(engine, "engine", None)):
        tower = getattr(owner, "vision", None)
        if tower is not None:
            return tower.cfg
    return None
