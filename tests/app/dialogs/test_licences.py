"""Licences: the project's LICENSE, the third-party notices generated at package time from the
shipped distributions' own metadata (pip-licenses), and Help → About → Licences showing them."""
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialogButtonBox, QPlainTextEdit

from tramontane.app import licences
from tramontane.app.dialogs import help as help_dialogs
from tramontane.app.dialogs.help import show_about

ROOT = Path(__file__).resolve().parents[3]


def _names(dists) -> set[str]:
    return {licences._canonical(d.metadata["Name"]) for d in dists}


def test_shipped_distributions_are_the_runtime_closure_without_test_extras():
    names = _names(licences.shipped_distributions())
    # direct requirements, and what they pull in (shiboken6 by PySide6, yarl by aiohttp)
    assert {"tramontane", "pyside6-essentials", "shiboken6", "torch", "numpy", "aiohttp", "yarl"} <= names
    # test extras are not shipped (installed here, but only through the [test] extra)
    assert not {"pytest", "transformers", "mistral-common", "openai"} & names


def test_notices_file_has_every_shipped_distribution_and_qt_gets_the_lgpl_text(tmp_path):
    pytest.importorskip("piplicenses")
    # the same metadata this process reads (`python -m pytest` has the checkout on sys.path, where
    # an editable install's fresh .egg-info sits beside the installed .dist-info)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())}
    run = subprocess.run([sys.executable, str(ROOT / "packaging" / "third_party_notices.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    text = (tmp_path / licences.NOTICES_NAME).read_text("utf-8")
    assert (tmp_path / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    sections = set(re.findall(r"^={78}\n(\S+) \S+\nLicence: ", text, flags=re.M))
    shipped = {d.metadata["Name"] for d in licences.shipped_distributions()} - {"tramontane"}
    assert sections == shipped
    qt = text.split("=\nPySide6_Essentials ", 1)[1].split("\n" + "=" * 78 + "\n", 2)[1]
    assert "GNU LESSER GENERAL PUBLIC LICENSE" in qt and "GNU GENERAL PUBLIC LICENSE" in qt
    torch_part = text.split("=\ntorch ", 1)[1]
    assert "From PyTorch" in torch_part and "--- third_party/" in torch_part  # its licenses/ folder too


def test_a_distribution_without_any_licence_text_stops_the_package_build(tmp_path, monkeypatch):
    pytest.importorskip("piplicenses")
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import third_party_notices as tpn
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    dist = next(d for d in licences.shipped_distributions() if d.metadata["Name"] == "idna")
    monkeypatch.setattr(tpn, "pip_licenses", lambda names: {"idna": {"LicenseText": "UNKNOWN", "NoticeText": "UNKNOWN"}})
    monkeypatch.setattr(tpn, "extra_licence_files", lambda dist, already: [])
    monkeypatch.setattr(tpn, "licence_of", lambda dist: "Some-Custom-1.0", raising=False)
    monkeypatch.setattr(licences, "licence_of", lambda dist: "Some-Custom-1.0")
    _text, missing = tpn.notices([dist])
    assert missing == [f"idna {dist.version} (Some-Custom-1.0)"]


def test_help_about_opens_the_licences(qtbot, tmp_path, monkeypatch):
    read_on = []

    def notices_text():  # the real reading, and the thread it runs on
        read_on.append(threading.current_thread())
        return licences.notices_text()

    monkeypatch.setattr(help_dialogs, "notices_text", notices_text)
    dialog = show_about(None, data_dir=str(tmp_path), models_dir="", model="", projector="")
    qtbot.addWidget(dialog)
    button = next(b for b in dialog.findChild(QDialogButtonBox).buttons() if b.text().startswith("Licences"))
    button.click()
    view = dialog.licences_dialog.findChild(QPlainTextEdit)
    qtbot.waitUntil(lambda: "torch" in view.toPlainText(), timeout=30000)
    assert read_on and threading.main_thread() not in read_on  # the metadata is read off the UI thread
    text = view.toPlainText()
    assert "Apache License 2.0" in text and "PySide6_Essentials" in text and "LGPL-3.0" in text and "torch" in text

    # in a frozen bundle it shows the generated file instead
    bundled = tmp_path / "bundle" / licences.BUNDLE_LICENCES_DIR
    bundled.mkdir(parents=True)
    (bundled / licences.NOTICES_NAME).write_text("notices generated at package time\n")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    assert licences.notices_text() == "notices generated at package time\n"
