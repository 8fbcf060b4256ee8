"""app/drops.py: drag and drop events on the window are the composer's, with an overlay over
the conversation pane while something droppable is dragged."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDragLeaveEvent  # noqa: E402
from PySide6.QtWidgets import QApplication, QVBoxLayout, QWidget  # noqa: E402

from support.app_window import drop_files, png_bytes  # noqa: E402
from tramontane.app.drops import DropsToComposer  # noqa: E402
from tramontane.app.widgets.composer import Composer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Function.*QDrag.*Event:DeprecationWarning")


@pytest.fixture
def host(qtbot):
    """A window of a pane and a composer, the drops filter on the window."""
    window = QWidget()
    pane, composer = QWidget(), Composer()
    layout = QVBoxLayout(window)
    layout.addWidget(pane, 1)
    layout.addWidget(composer)
    composer.set_vision(True, "")
    drops = DropsToComposer(window, composer, pane=pane, overlay_parent=window)
    qtbot.addWidget(window)
    window.resize(600, 400)
    window.show()
    qtbot.waitExposed(window)
    return window, pane, composer, drops


def drag_enter(widget, mime: QMimeData) -> QDragEnterEvent:
    event = QDragEnterEvent(QPoint(20, 20), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)
    return event


def test_an_image_dropped_on_the_window_is_attached_and_the_overlay_goes(qtbot, host, tmp_path):
    window, pane, composer, drops = host
    image = tmp_path / "photo.png"
    image.write_bytes(png_bytes(20, 14))
    event = drop_files(window, [image])
    assert event.isAccepted()
    assert [im.data for im in composer.images] == [image.read_bytes()]
    assert not drops.overlay.isVisible()


def test_the_overlay_covers_the_pane_while_files_are_dragged_and_goes_when_they_leave(qtbot, host, tmp_path):
    window, pane, composer, drops = host
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(tmp_path / "a.png"))])
    assert drag_enter(window, mime).isAccepted()
    assert drops.overlay.isVisible()
    assert drops.overlay.geometry() == pane.geometry().adjusted(12, 12, -12, -12)
    QApplication.sendEvent(window, QDragLeaveEvent())
    assert not drops.overlay.isVisible() and composer.images == []


def test_dragged_text_is_refused_and_shows_no_overlay(qtbot, host):
    window, _pane, composer, drops = host
    mime = QMimeData()
    mime.setText("just words")
    assert not drag_enter(window, mime).isAccepted()
    assert not drops.overlay.isVisible() and composer.images == []
