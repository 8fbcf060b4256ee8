"""Help → Keyboard shortcuts (read from the window's own actions) and About."""
from __future__ import annotations

from html import escape

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from ... import __version__
from ..jobs import Jobs
from ..licences import notices_text

LICENCE = "Apache-2.0"
# Keys that belong to a widget rather than a menu entry.
WIDGET_KEYS = [
    ("Enter", "Send the message"),
    ("Shift+Enter", "A new line in the message"),
    ("Del", "Delete the chat (in the chat list)"),
    ("Ctrl+Enter", "Save an edited message and resend it"),
    ("Tab", "Move to the next control; a message's actions show when it has the focus"),
]


def shortcut_rows(actions: list[QAction]) -> list[tuple[str, str]]:
    """(keys, what they do) for every action that has a shortcut, in menu order."""
    rows = []
    for action in actions:
        keys = action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        if keys:
            rows.append((keys, action.text().replace("&", "").rstrip("…")))
    return rows + WIDGET_KEYS


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><td style='padding-right:18px'><b>{escape(k)}</b></td><td>{escape(v)}</td></tr>"
                    for k, v in rows)
    return f"<table cellspacing='4'>{cells}</table>"


def show_shortcuts(parent: QWidget, actions: list[QAction]) -> QDialog:
    return _show(parent, "Keyboard shortcuts", _table(shortcut_rows(actions)))


def about_text(*, data_dir: str, models_dir: str, model: str, projector: str) -> str:
    rows = [("Version", __version__), ("Data folder", data_dir), ("Models folder", models_dir),
            ("Loaded model", model or "none"), ("Projector", projector or "none"),
            ("Licence", LICENCE)]
    return ("<h3>Tramontane</h3><p>Offline chat with Mistral 3 models, text and images, on this "
            "computer.</p>" + _table(rows))


def show_about(parent: QWidget, **paths: str) -> QDialog:
    dialog = _show(parent, "About Tramontane", about_text(**paths))
    box = dialog.findChild(QDialogButtonBox)
    licences = box.addButton("Licences…", QDialogButtonBox.ButtonRole.ActionRole)
    licences.setToolTip("The licence of Tramontane and of the software it ships with (Qt, PyTorch, …)")
    licences.clicked.connect(lambda: setattr(dialog, "licences_dialog", show_licences(dialog)))
    return dialog


def show_licences(parent: QWidget) -> QDialog:
    """The third-party notices (the installer's file, or the installed distributions' list), read
    on a job: installed from source, that walks every distribution's metadata on disk."""
    dialog = QDialog(parent)
    dialog.setWindowTitle("Licences")
    view = QPlainTextEdit("Reading the licences…")
    view.setReadOnly(True)
    view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
    view.setAccessibleName("Licences")
    box = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    box.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.addWidget(view)
    layout.addWidget(box)
    dialog.resize(760, 560)
    dialog.jobs = Jobs(dialog)  # closing the dialog drops a reading still under way
    dialog.jobs.run(notices_text, view.setPlainText,
                    lambda error: view.setPlainText(f"The licences could not be read: {error}"))
    dialog.open()
    return dialog


def _show(parent: QWidget, title: str, html: str) -> QDialog:
    """A window-modal dialog with `html` and a Close button."""
    dialog = QDialog(parent)
    dialog.setWindowTitle(title)
    text = QLabel(html)
    text.setWordWrap(True)
    text.setAccessibleName(title)
    box = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    box.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.addWidget(text)
    layout.addWidget(box)
    dialog.open()
    return dialog
