"""Send, stop, regenerate, edit and resend: the composer's and the conversation's requests for a
reply, handed to `ChatSession`, and the reply's progress shown as it streams.

`window` is the main window: its widgets and its other parts (not imported here, so the
arrows point from the window to its parts only).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QApplication


class ReplyCommands(QObject):
    """The window's side of a reply: what the composer shows before, during and after it."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.session = window.session
        self.wait_note = ""  # the composer's "another chat is writing" line, while true
        window.worker.documentsPlaced.connect(self.on_documents_placed)
        self.session.thoughtStreamed.connect(self.on_thought)

    def send(self, text: str, images: list) -> bool:
        """Start the reply to a new user message. False (and a message) when it cannot be
        sent now; the text and images then stay in the composer."""
        w = self.window
        binding = w.binding.chat_binding()
        if (self.session.current_chat_id is None and w.tools_switch.new_chat_tools
                and w.tools_button.isEnabled()):
            binding["settings"] = {"tools": True}
        why_not = self.session.send(text, images, binding)
        if why_not:
            w.composer.show_message(why_not)
            self.wait_note = why_not if self.session.pending is not None else ""
            return False
        w.composer.accepted()
        self.session.save_draft(self.session.current_chat_id, "")  # sent: no draft left
        return True

    def stop(self) -> None:
        """Stop the reply being written in the chat on screen; the engine returns at the next
        token. A reply in another chat is stopped there."""
        if self.session.writing_here():
            self.session.stop()
        self.focus_composer()

    def regenerate(self, message_id: int | None = None) -> None:
        """Drop the reply `message_id` (default: the last one) and everything after, and
        write it again."""
        self.session.regenerate(message_id)

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a user message's text, drop everything after it, and reply again."""
        self.session.edit_and_resend(message_id, text)

    def focus_composer(self) -> None:
        """Keyboard focus to the message box when a reply starts or stops. The clicked button
        (Send, Regenerate, Save & resend, Stop) is about to be disabled or removed, and Qt would
        hand the focus to the first widget, the chat search, where the next message would go."""
        focus = QApplication.focusWidget()
        if focus is None or focus.window() is self.window:
            self.window.composer.edit.setFocus()

    @Slot(bool)
    def on_busy_changed(self, busy: bool) -> None:
        w = self.window
        if busy:
            self.focus_composer()
            w.conversation.update_busy()
        else:
            w.view.flush()
            if self.wait_note and w.composer.message.text() == self.wait_note:
                w.composer.show_message("")  # "another chat is writing": no longer true
            self.wait_note = ""

    @Slot(str)
    def on_streamed(self, text: str) -> None:
        self.window.view.stream_text(text)
        pending = self.session.pending
        if pending is not None and pending.pieces % 4 == 0:  # not every token
            rate = self.session.live_rate()
            if rate:
                self.window.view.set_streaming_note(f"writing… {rate:.1f} tok/s")

    @Slot(str)
    def on_thought(self, text: str) -> None:
        """A reasoning model's thought so far, into its block above the answer."""
        self.window.view.stream_thought(text)

    @Slot(int, object)
    def on_documents_placed(self, _request_id: int, prompt) -> None:
        """Say how the reply read its documents (whole or searched, and the excerpts' pages)."""
        self.window.composer.show_message(documents_words(prompt), error=False)

    @Slot(str, list)
    def on_unsent(self, text: str, images: list) -> None:
        """A message that could not be saved goes back to an empty composer."""
        composer = self.window.composer
        if not composer.edit.toPlainText() and not composer.images and not composer.documents:
            composer.edit.setPlainText(text)
            for part in images:  # images and documents
                composer.add_attachment(part)


def documents_words(prompt) -> str:
    """engine/documents' DocumentPrompt in words: each document's mode, the sources, the notes."""
    modes = [f"{placement.document.name}: {'read whole' if placement.mode == 'whole' else 'searched (too long to read whole)'}"
             for placement in prompt.placements.values()]
    lines = ["; ".join(modes)] if modes else []
    if prompt.sources:
        lines.append("Sources: " + "; ".join(source.label for source in prompt.sources))
    return "\n".join(lines + list(prompt.notes))


__all__ = ["ReplyCommands", "documents_words"]
