"""The icon set: every SVG in resources/icons renders, in the colour asked, sharp at 2x."""
from __future__ import annotations

from importlib.resources import files

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSize  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402

from tramontane.app.widgets.icons import icon  # noqa: E402

ICONS = files("tramontane.resources") / "icons"
NAMES = sorted(p.name[:-4] for p in ICONS.iterdir() if p.name.endswith(".svg"))


def test_the_set_is_there_with_its_licence():
    assert {"copy", "check", "edit", "regenerate", "branch", "send", "stop", "attach", "pin",
            "new-chat", "previous", "next", "close"} <= set(NAMES)
    assert "licence" in (ICONS / "LICENSE.md").read_text().lower()


@pytest.mark.parametrize("name", NAMES)
def test_each_icon_renders_in_colour_at_1x_and_2x(qtbot, name):
    for ratio in (1.0, 2.0):
        image = icon(name, "#ff0000").pixmap(QSize(20, 20), ratio).toImage()
        assert image.width() == int(20 * ratio)  # drawn for the screen's pixels, not scaled up
        colours = {image.pixelColor(x, y).name() for x in range(image.width()) for y in range(image.height())
                   if image.pixelColor(x, y).alpha() > 200}
        assert colours and all(QColor(c).red() > 200 and QColor(c).blue() < 60 for c in colours), name
