"""Hostile images: strips up to the pixel limit, bombs, truncated and odd formats.

Each case runs in a forked child of one helper process (this file run as a script), which
measures the child's peak RSS above its start (VmHWM after resetting it through
/proc/self/clear_refs). The stated bound, for `preprocess` from file bytes to pixels:

    peak extra memory ≤ 64 bytes × max(input pixels, output pixels) + 96 MiB

(input pixels: what the header claims, 0 when refused before decoding; the 96 MiB covers
library arenas and the first-touch of torch/numpy code). Before the row pre-shrink in
the resampler, a 1×5,000,000 black PNG (19.5 KB) took 3.9 GB; it now takes ~0.14 GB, and an
89-Mpx-wide one-row image (which Pillow's `tobytes` refuses outright) is read in tiles.
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from support.rss import helper_env, peak_since, reset_peak

BYTES_PER_PIXEL = 64
SLACK = 96 << 20
REAL = dict(image_size=1540, patch_size=14, merge=2)  # Mistral-Small-3.1's projector
MEAN = STD = (0.5, 0.5, 0.5)
LIMIT = 89_478_485  # engine/mistral3/image.py MAX_IMAGE_PIXELS (checked below)


# --- case makers: name -> (file bytes, claimed input pixels, expected outcome) -------------

def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_header_only(w: int, h: int, color_type: int = 2) -> bytes:
    """A PNG claiming w × h whose pixel data stops after a few bytes (a bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
            + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b""))


def _black_png(w: int, h: int, mode: str = "L") -> bytes:
    """A real, fully decodable all-black PNG of w × h written row by row with zlib (no
    w × h image in memory while making it)."""
    color_type, channels = {"L": (0, 1), "RGB": (2, 3), "RGBA": (6, 4)}[mode]
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    comp = zlib.compressobj(9)
    row = b"\0" * (1 + w * channels)  # filter byte + pixels
    parts, step = [], max(1, (1 << 20) // len(row))
    for y in range(0, h, step):
        parts.append(comp.compress(row * min(step, h - y)))
    parts.append(comp.flush())
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", b"".join(parts))
            + _png_chunk(b"IEND", b""))


def _noise(w: int, h: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(w * 31 + h)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(arr[..., 0] if channels == 1 else arr, mode)


def _bmp_header(w: int, h: int) -> bytes:
    """A 24-bit BMP header claiming w × h with no pixel data after it."""
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


def _gif_screen(w: int, h: int) -> bytes:
    """A GIF whose logical screen is w × h around a 1 × 1 frame."""
    img = _save(Image.new("P", (1, 1)), "GIF")
    return img[:6] + struct.pack("<HH", w, h) + img[10:]


def _apng_many_frames(n: int) -> bytes:
    frames = [Image.new("RGB", (64, 64), (i % 256, 0, 0)) for i in range(n)]
    return _save(frames[0], "PNG", save_all=True, append_images=frames[1:])


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


# name: (maker, claimed input pixels, "ok" | "refused", slow?)
CASES = {
    "strip-L-1x5M": (lambda: _black_png(1, 5_000_000, "L"), 5_000_000, "ok", False),
    "strip-RGB-1x5M": (lambda: _black_png(1, 5_000_000, "RGB"), 5_000_000, "ok", False),
    "strip-RGBA-1x5M": (lambda: _black_png(1, 5_000_000, "RGBA"), 5_000_000, "ok", False),
    "strip-RGB-5Mx1": (lambda: _black_png(5_000_000, 1, "RGB"), 5_000_000, "ok", False),
    "strip-L-1x20M": (lambda: _black_png(1, 20_000_000, "L"), 20_000_000, "ok", True),
    "strip-L-20Mx1": (lambda: _black_png(20_000_000, 1, "L"), 20_000_000, "ok", True),
    "strip-L-1xLIMIT": (lambda: _black_png(1, LIMIT, "L"), LIMIT, "ok", True),
    "strip-L-LIMITx1": (lambda: _black_png(LIMIT, 1, "L"), LIMIT, "ok", True),
    "strip-L-1xLIMIT+1": (lambda: _black_png(1, LIMIT + 1, "L"), 0, "refused", False),
    "square-RGB-4000x3000": (lambda: _save(_noise(4000, 3000), "PNG", compress_level=1), 12_000_000, "ok", False),
    "square-L-9000x9000": (lambda: _black_png(9000, 9000, "L"), 81_000_000, "ok", True),
    "tiny-1x1-upscaled": (lambda: _save(_noise(1, 1), "PNG"), 1, "ok", False),
    "bomb-header-3000x3000": (lambda: _png_header_only(3000, 3000), 9_000_000, "refused", False),
    "bomb-header-9000x9000": (lambda: _png_header_only(9000, 9000), 81_000_000, "refused", True),
    "bomb-header-50000x50000": (lambda: _png_header_only(50_000, 50_000), 0, "refused", False),
    "bomb-real-10000x9000": (lambda: _black_png(10_000, 9000, "L"), 0, "refused", False),
    "bmp-header-30000x30000": (lambda: _bmp_header(30_000, 30_000), 0, "refused", False),
    "bmp-header-2000x2000": (lambda: _bmp_header(2000, 2000), 4_000_000, "refused", False),
    "gif-screen-65535x65535": (lambda: _gif_screen(65_535, 65_535), 0, "refused", False),
    "apng-300-frames": (lambda: _apng_many_frames(300), 64 * 64, "ok", False),
    "truncated-png": (lambda: _truncated(_save(_noise(600, 400), "PNG")), 240_000, "refused", False),
    "truncated-jpeg": (lambda: _truncated(_save(_noise(600, 400), "JPEG")), 240_000, "refused", False),
    "truncated-gif": (lambda: _truncated(_save(_noise(600, 400).convert("P"), "GIF")), 240_000, "refused", False),
    "truncated-webp": (lambda: _truncated(_save(_noise(600, 400), "WEBP")), 240_000, "refused", False),
    "tiff-rgba": (lambda: _save(_noise(300, 200, "RGBA"), "TIFF"), 60_000, "ok", False),
    "ico": (lambda: _save(_noise(64, 64, "RGBA"), "ICO"), 64 * 64, "ok", False),
    "sixteen-bit-strip-1x2M": (lambda: _save(Image.fromarray(np.full((2_000_000, 1), 40_000, np.uint16)), "PNG"),
                               2_000_000, "ok", False),
    "empty": (lambda: b"", 0, "refused", False),
    "text": (lambda: b"just some text, not an image\n" * 10, 0, "refused", False),
}


# --- the helper process --------------------------------------------------------------------

def _run_case(name: str) -> dict:
    """In a forked child: make the file, reset the peak, preprocess, report."""
    from tramontane.engine.api import EngineError
    from tramontane.engine.mistral3.image import preprocess

    maker, in_px, _expected, _slow = CASES[name]
    data = maker()
    base = reset_peak()
    t0 = time.perf_counter()
    out = {"name": name, "file_bytes": len(data), "in_px": in_px}
    try:
        pixels, rows, cols = preprocess(data, mean=MEAN, std=STD, **REAL, source=f"{name}.img")
        out.update(outcome="ok", shape=list(pixels.shape), grid=[rows, cols],
                   out_px=int(pixels.shape[1] * pixels.shape[2]), finite=bool(np.isfinite(pixels.numpy()).all()))
    except EngineError as exc:
        out.update(outcome="refused", message=str(exc), out_px=0)
    except BaseException as exc:  # reported, and the test fails on it
        out.update(outcome=f"crash {type(exc).__name__}", message=str(exc)[:300], out_px=0)
    out.update(peak=peak_since(base), seconds=round(time.perf_counter() - t0, 2))
    return out


def _main(names: list[str]) -> None:
    import tramontane.engine.mistral3.image  # noqa: F401  (imported once, before forking)
    import torch  # noqa: F401

    for name in names:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                result = _run_case(name)
            except BaseException as exc:  # noqa: BLE001
                result = {"name": name, "outcome": f"helper crash {exc!r}"}
            os.write(w, json.dumps(result).encode())
            os._exit(0)
        os.close(w)
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        line = b"".join(chunks).decode() or json.dumps({"name": name, "outcome": f"died with status {status}"})
        print(line, flush=True)


@pytest.fixture(scope="module")
def measured(request):
    """Every case of this run (slow ones only under `-m slow`), measured in one helper process."""
    slow = "slow" in (request.config.getoption("-m") or "")
    names = [n for n, case in CASES.items() if slow or not case[3]]
    proc = subprocess.run([sys.executable, __file__, *names], capture_output=True, text=True, timeout=900,
                          env=helper_env())
    results = {}
    for line in proc.stdout.splitlines():
        item = json.loads(line)
        results[item["name"]] = item
    assert proc.returncode == 0, proc.stderr[-2000:]
    return results


def _check(measured, name):
    if name not in measured:
        pytest.skip("slow case: run with -m slow")
    result = measured[name]
    _maker, in_px, expected, _slow = CASES[name]
    assert result["outcome"] == expected, result
    if expected == "refused":
        assert result["message"].startswith(f"{name}.img: "), result["message"]
    else:
        assert result["finite"] and result["out_px"] > 0
    bound = BYTES_PER_PIXEL * max(in_px, result["out_px"]) + SLACK
    assert result["peak"] <= bound, f"{name}: peak {result['peak'] / 2**20:.0f} MiB > bound {bound / 2**20:.0f} MiB"
    return result


FAST = [n for n, case in CASES.items() if not case[3]]
SLOW = [n for n, case in CASES.items() if case[3]]


@pytest.mark.parametrize("name", FAST)
def test_hostile_image_is_refused_or_read_within_memory_bound(measured, name):
    _check(measured, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_hostile_image_up_to_pixel_limit(measured, name):
    _check(measured, name)


def test_issue_strip_uses_a_small_fraction_of_its_old_peak(measured):
    """The issue's file: a 1×5,000,000 black RGB PNG took 3.9 GB before; its tokens are one
    column of 55 rows (the long side scaled to 1540, the short one kept at one tile)."""
    result = _check(measured, "strip-RGB-1x5M")
    assert result["grid"] == [55, 1] and result["shape"] == [3, 55 * 28, 28]
    assert result["peak"] < 400 << 20


def test_pixel_limit_is_the_engines():
    from tramontane.engine.mistral3.image import MAX_IMAGE_PIXELS

    assert LIMIT == MAX_IMAGE_PIXELS


# --- the resize pre-shrink changes nothing ---------------------------------------------------

def _resize_all_rows(src: np.ndarray, width: int, height: int) -> np.ndarray:
    """The resampler without the pre-shrink: every source row through the horizontal pass."""
    from tramontane.engine.mistral3.image import _cubic_taps

    x_idx, x_w = _cubic_taps(src.shape[1], width)
    y_idx, y_w = _cubic_taps(src.shape[0], height)
    rows = np.zeros((src.shape[0], width, src.shape[2]), dtype=np.float32)
    for k in range(4):
        rows += src[:, x_idx[:, k], :] * x_w[None, :, k, None]
    out = np.zeros((height, width, src.shape[2]), dtype=np.float32)
    for k in range(4):
        out += rows[y_idx[:, k]] * y_w[:, k, None, None]
    return out


@pytest.mark.parametrize("shape", [(5000, 1, 1540, 28), (1, 5000, 28, 1540), (3000, 400, 1176, 168),
                                   (480, 640, 504, 644), (7, 5, 28, 28), (300, 300, 28, 56), (130, 2, 1540, 28)])
def test_pre_shrink_is_bit_identical(shape):
    from tramontane.engine.mistral3.image import resize_cubic

    sh, sw, dh, dw = shape
    src = np.random.default_rng(sh * 7 + sw).integers(0, 256, (sh, sw, 3), dtype=np.uint8)
    assert np.array_equal(resize_cubic(src, dw, dh).numpy(), _resize_all_rows(src, dw, dh))


@pytest.mark.parametrize("size", [(640, 480), (1, 5000), (5000, 1), (2000, 1700), (29, 57)])
def test_tiled_reads_from_the_image_are_bit_identical(monkeypatch, size):
    """pixels_from_image reads the decoded image in tiles (forced tiny here): same pixels as
    resizing one full-size array."""
    import torch

    from tramontane.engine.mistral3 import image as image_module

    monkeypatch.setattr(image_module, "_TILE_PIXELS", 997)
    img = _noise(*size)
    pixels, rows, cols = image_module.pixels_from_image(img, **REAL, mean=MEAN, std=STD)
    full = image_module.resize_cubic(np.asarray(img), cols * 28, rows * 28)
    full = ((full / 255.0 - torch.tensor(MEAN)) / torch.tensor(STD)).permute(2, 0, 1)
    assert np.array_equal(pixels.numpy(), full.numpy())


@pytest.mark.parametrize("size", [(1, 200_000), (200_000, 1), (3, 40_000)])
def test_strip_matches_mistral_common(size):
    """Long strips against the reference: same grid, pixels within one grey level."""
    mc_image = pytest.importorskip("mistral_common.tokens.tokenizers.image")
    pytest.importorskip("cv2")
    from mistral_common.protocol.instruct.chunk import ImageChunk

    from tramontane.engine.mistral3.image import preprocess

    img = _noise(*size)
    data = _save(img, "PNG")
    encoder = mc_image.ImageEncoder(mc_image.ImageConfig(14, 1540, 2), mc_image.SpecialImageIDs(10, 12, 13))
    ref = encoder(ImageChunk(image=img)).image
    pixels, rows, cols = preprocess(data, mean=mc_image.DATASET_MEAN, std=mc_image.DATASET_STD, **REAL)
    assert tuple(pixels.shape) == ref.shape and pixels.shape[1:] == (rows * 28, cols * 28)
    assert np.abs(pixels.numpy() - ref).max() <= (1 / 255) / min(mc_image.DATASET_STD)


@pytest.mark.parametrize("mode", ["1", "L", "CMYK", "YCbCr", "P"])
def test_opaque_modes_convert_exactly_like_the_white_paste(mode):
    """to_rgb's shortcut for modes without alpha equals mistral-common's RGBA-over-white path."""
    from tramontane.engine.mistral3.image import to_rgb

    img = _noise(97, 61).convert(mode)
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", img.size, "WHITE")
    white.paste(rgba, (0, 0), rgba)
    assert np.array_equal(np.asarray(to_rgb(img)), np.asarray(white.convert("RGB")))


def test_palette_with_transparency_still_goes_through_white():
    from tramontane.engine.mistral3.image import to_rgb

    img = Image.new("P", (4, 4), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    img.info["transparency"] = 0
    assert np.asarray(to_rgb(img))[0, 0].tolist() == [255, 255, 255]


if __name__ == "__main__":
    _main(sys.argv[1:])
