"""Scanned pages rendered for the vision tower: an image-only PDF page (fpdf2 writes it) comes
back as RGB at a size the tower's preprocessing keeps as it is (whole tiles, within
image_size), its dark box where the page has it; without vision, one sentence."""
import numpy as np
import pytest

from tramontane.engine.documents.document import DocumentError
from tramontane.engine.documents.extract import extract
from tramontane.engine.documents.scans import MAX_SCANS, render_scans, scan_note, scan_size
from tramontane.engine.mistral3.config import VisionConfig
from tramontane.engine.mistral3.image import image_grid, preprocess

from support.documents import scanned_pdf

pytest.importorskip("fpdf")
# Mistral Small 3.1's tower: 1540-pixel images, 14-pixel patches merged 2x2.
PIXTRAL = VisionConfig(1540, 14, 2, 1024, 4096, 24, 16, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4, 5120, "mmproj")


def test_a_scanned_page_renders_at_a_size_the_tower_keeps():
    data = scanned_pdf(1, text_page=True)
    doc = extract(data, "letter.pdf")
    assert doc.scanned_pages == [1]
    [scan] = render_scans(data, doc, PIXTRAL)
    tile = 28
    width, height = scan.image.size
    assert scan.number == 1 and scan.image.mode == "RGB"
    assert max(width, height) <= 1540 and width % tile == 0 and height % tile == 0
    assert height > 1400 and abs(width / height - 210 / 297) < 0.02  # the page's shape, near full size
    assert image_grid((width, height), 1540, 14, 2) == (height // tile, width // tile)
    pixels = np.asarray(scan.image)
    box = pixels[int(height * 0.1):int(height * 0.4), int(width * 0.1):int(width * 0.4)]
    assert box.mean() < 30 and pixels[int(height * 0.8):, int(width * 0.6):].mean() > 225
    part = scan.image_part("letter.pdf")
    assert part.name == "letter.pdf, page 1"
    _, rows, cols = preprocess(part.data, image_size=1540, patch_size=14, merge=2, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert (rows, cols) == (height // tile, width // tile)


def test_scan_sizes_follow_the_tower():
    small = VisionConfig(112, 16, 2, 64, 128, 2, 4, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4, 64, "mmproj")
    assert scan_size(595.3, 841.9, small) == (64, 96)
    assert scan_size(841.9, 595.3, PIXTRAL) == (1540, 1064)
    assert scan_size(10, 1000, PIXTRAL) == (28, 1540)


def test_without_vision_the_scans_are_named_in_one_sentence():
    data = scanned_pdf(3, text_page=True)
    doc = extract(data, "scan.pdf")
    note = "scan.pdf: pages 1-3 are scans without a text layer, and this model has no vision tower to read them."
    assert scan_note(doc, None) == note
    with pytest.raises(DocumentError, match="^" + note.replace(".", r"\.") + "$"):
        render_scans(data, doc, None)
    assert scan_note(doc, PIXTRAL) is None
    assert scan_note(extract(scanned_pdf(0, text_page=True), "typed.pdf"), None) is None


def test_at_most_max_scans_pages_are_rendered_and_the_rest_said():
    data = scanned_pdf(MAX_SCANS + 2)
    doc = extract(data, "deck.pdf")
    small = VisionConfig(112, 16, 2, 64, 128, 2, 4, 1e-5, (0.5,) * 3, (0.5,) * 3, "silu", 1e4, 64, "mmproj")
    scans = render_scans(data, doc, small)
    assert [s.number for s in scans] == list(range(1, MAX_SCANS + 1))
    assert scan_note(doc, small) == f"deck.pdf: pages 1-{MAX_SCANS + 2} are scans without a text layer; only the first {MAX_SCANS} are read as images."
