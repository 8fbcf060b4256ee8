"""The app's icons: resources/icons/*.svg, recoloured to the palette and sharp on HiDPI."""
from __future__ import annotations

from functools import lru_cache
from importlib.resources import files

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer

SIZES = (16, 20, 24, 32)  # logical sizes; each is also drawn at 2x for HiDPI screens
DRAWN_IN = "#000000"  # the colour the SVG files are drawn in, replaced at render time


@lru_cache(maxsize=None)
def _svg(name: str) -> bytes:
    return (files("tramontane.resources") / "icons" / f"{name}.svg").read_bytes()


@lru_cache(maxsize=256)
def _icon(name: str, colour: str) -> QIcon:
    renderer = QSvgRenderer(QByteArray(_svg(name).replace(DRAWN_IN.encode(), colour.encode())))
    icon = QIcon()
    for size in SIZES:
        for ratio in (1.0, 2.0):
            pixmap = QPixmap(int(size * ratio), int(size * ratio))
            pixmap.setDevicePixelRatio(ratio)
            pixmap.fill(Qt.GlobalColor.transparent)
            painter = QPainter(pixmap)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            renderer.render(painter, QRectF(0, 0, size, size))
            painter.end()
            icon.addPixmap(pixmap)
    return icon


def icon(name: str, colour: QColor | str | None = None) -> QIcon:
    """The icon `name` (a file in resources/icons) in `colour`, by default the text colour of
    the application palette (so it follows light and dark)."""
    if colour is None:
        colour = QGuiApplication.palette().color(QPalette.ColorRole.WindowText)
    return _icon(name, QColor(colour).name())
