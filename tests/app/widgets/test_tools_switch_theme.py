"""Issue 35, item 4: the Tools switch's on state was nearly invisible in the dark theme (the
style's checked shade on a dark button). On, it is now the accent colour, light and dark."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtGui import QColor  # noqa: E402

from tramontane.app.widgets.theme import ACCENT  # noqa: E402


def middle_colour(button) -> QColor:
    image = button.grab().toImage()
    return image.pixelColor(image.width() // 2, 2)  # above the text, inside the border


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_the_tools_switch_on_is_the_accent_colour(qtbot, idle_window, theme):
    window = idle_window
    window.appearance.set_theme(theme)
    button = window.tools_button
    button.setChecked(False)
    off = middle_colour(button)
    button.setChecked(True)
    on = middle_colour(button)
    assert on.name() == QColor(ACCENT).name(), (theme, on.name())
    assert abs(on.lightness() - off.lightness()) > 40 or abs(on.hue() - off.hue()) > 60, (off.name(), on.name())
