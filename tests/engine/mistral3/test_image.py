"""engine/mistral3/image.py against mistral-common's ImageEncoder (the official Pixtral preprocessing).

Pixel tolerance: 1/255 in [0, 1] units, i.e. 1 grey level, compared in *normalised* units as
(1/255)/min(std) ≈ 0.0146. Measured over CASES: 1.6e-4 normalised (cv2 with Intel IPP, the pip
wheel's default) and 1.4e-6 with IPP switched off (our resampler is cv2's generic INTER_CUBIC path).
"""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from tramontane.engine.api import EngineError
from tramontane.engine.mistral3.image import (
    MAX_IMAGE_PIXELS,
    decode_image,
    image_grid,
    image_size_of,
    preprocess,
    resize_cubic,
)

cv2 = pytest.importorskip("cv2")
mc_image = pytest.importorskip("mistral_common.tokens.tokenizers.image")
from mistral_common.protocol.instruct.chunk import ImageChunk  # noqa: E402

MEAN = mc_image.DATASET_MEAN
STD = mc_image.DATASET_STD
PIXEL_TOL = (1 / 255) / min(STD)  # one grey level, in normalised units

REAL = dict(image_size=1540, patch_size=14, merge=2)  # Mistral-Small-3.1's projector
TINY = dict(image_size=112, patch_size=14, merge=2)  # the tiny fixtures' projector
ODD = dict(image_size=224, patch_size=16, merge=1)  # other settings, to stay general


def reference(img: Image.Image, image_size: int, patch_size: int, merge: int):
    """mistral-common's encoder: (pixels (3, H, W), rows, cols)."""
    encoder = mc_image.ImageEncoder(
        mc_image.ImageConfig(image_patch_size=patch_size, max_image_size=image_size, spatial_merge_size=merge),
        mc_image.SpecialImageIDs(img=10, img_break=12, img_end=13),
    )
    out = encoder(ImageChunk(image=img))
    rows = out.tokens.count(12) + 1
    cols = out.tokens.index(12) if 12 in out.tokens else len(out.tokens) - 1
    assert len(out.tokens) == rows * (cols + 1)
    return out.image, rows, cols


def encode(img: Image.Image, fmt: str, **save_args) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **save_args)
    return buf.getvalue()


def noise(w: int, h: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 7 * w + 13 * h)
    # Smooth ramps plus noise: exercises both interpolation and the 4-tap edges.
    yy, xx = np.mgrid[0:h, 0:w]
    base = (xx * 255 // max(w - 1, 1) + yy * 97 // max(h - 1, 1))[..., None]
    arr = base + rng.integers(-60, 60, (h, w, channels))
    return np.clip(arr, 0, 255).astype(np.uint8)


def rgba_image(w, h):
    arr = noise(w, h, 4, seed=1)
    arr[: h // 2, :, 3] = 0  # fully transparent top half
    arr[h // 2 :, : w // 2, 3] = 128  # half transparent quarter
    return Image.fromarray(arr, "RGBA")


def palette_with_transparency(w, h):
    img = Image.fromarray(noise(w, h, seed=2)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return encode(img, "PNG", transparency=3)


def sixteen_bit(w, h):
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))


def cmyk_jpeg(w, h):
    return encode(Image.fromarray(noise(w, h, 4, seed=4), "CMYK"), "JPEG", quality=95)


def animated(fmt, w, h):
    frames = [Image.fromarray(noise(w, h, seed=s)) for s in (5, 6, 7)]
    if fmt == "GIF":
        frames = [f.convert("P", palette=Image.Palette.ADAPTIVE) for f in frames]
        return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50, lossless=True)


# (id, file bytes, settings) — 24 cases over sizes, aspect ratios, modes and formats.
CASES = [
    ("rgb-640x480-png", lambda: encode(Image.fromarray(noise(640, 480)), "PNG"), REAL),
    ("rgb-640x480-jpeg", lambda: encode(Image.fromarray(noise(640, 480)), "JPEG", quality=90), REAL),
    ("rgb-1x1", lambda: encode(Image.fromarray(noise(1, 1)), "PNG"), REAL),
    ("rgb-1x5000", lambda: encode(Image.fromarray(noise(1, 5000)), "PNG"), REAL),
    ("rgb-5000x1", lambda: encode(Image.fromarray(noise(5000, 1)), "PNG"), REAL),
    ("rgb-2100x1000-over-max", lambda: encode(Image.fromarray(noise(2100, 1000)), "PNG"), REAL),
    ("rgb-1541x3-ratio-rounding", lambda: encode(Image.fromarray(noise(1541, 3)), "PNG"), REAL),
    ("rgb-28x28-exact", lambda: encode(Image.fromarray(noise(28, 28)), "PNG"), REAL),
    ("rgb-29x57", lambda: encode(Image.fromarray(noise(29, 57)), "PNG"), REAL),
    ("rgba-300x200", lambda: encode(rgba_image(300, 200), "PNG"), REAL),
    ("la-123x77", lambda: encode(Image.fromarray(noise(123, 77, 2, seed=8), "LA"), "PNG"), REAL),
    ("p-transparency-200x150", lambda: palette_with_transparency(200, 150), REAL),
    ("p-gif-160x90", lambda: encode(Image.fromarray(noise(160, 90)).convert("P"), "GIF"), REAL),
    ("l-333x111", lambda: encode(Image.fromarray(noise(333, 111, 1)[..., 0], "L"), "PNG"), REAL),
    ("bilevel-64x48", lambda: encode(Image.fromarray(noise(64, 48, 1)[..., 0] > 128), "PNG"), REAL),
    ("cmyk-jpeg-180x120", lambda: cmyk_jpeg(180, 120), REAL),
    ("animated-gif-first-frame", lambda: animated("GIF", 96, 64), REAL),
    ("animated-webp-first-frame", lambda: animated("WEBP", 96, 64), REAL),
    ("tiny-640x480", lambda: encode(Image.fromarray(noise(640, 480)), "PNG"), TINY),
    ("tiny-50x300", lambda: encode(Image.fromarray(noise(50, 300)), "PNG"), TINY),
    ("tiny-rgba-113x112", lambda: encode(rgba_image(113, 112), "PNG"), TINY),
    ("tiny-3x1000", lambda: encode(Image.fromarray(noise(3, 1000)), "PNG"), TINY),
    ("odd-patch16-merge1-500x260", lambda: encode(Image.fromarray(noise(500, 260)), "PNG"), ODD),
    ("odd-l-17x300", lambda: encode(Image.fromarray(noise(17, 300, 1)[..., 0], "L"), "PNG"), ODD),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_mistral_common(case):
    _, make, settings = case
    data = make()
    pixels, rows, cols = preprocess(data, mean=MEAN, std=STD, **settings, source="case.png")
    ref, ref_rows, ref_cols = reference(Image.open(io.BytesIO(data)), **settings)
    assert (rows, cols) == (ref_rows, ref_cols)
    assert image_grid(Image.open(io.BytesIO(data)).size, **settings) == (rows, cols)
    assert image_size_of(data) == Image.open(io.BytesIO(data)).size
    assert pixels.dtype == torch.float32 and tuple(pixels.shape) == ref.shape
    tile = settings["patch_size"] * settings["merge"]
    assert pixels.shape[1:] == (rows * tile, cols * tile)
    diff = (pixels.numpy() - ref).__abs__().max()
    assert diff <= PIXEL_TOL, diff


def test_640x480_is_18_rows_23_cols():
    assert image_grid((640, 480), 1540, 14, 2) == (18, 23)
    pixels, rows, cols = preprocess(encode(Image.new("RGB", (640, 480), "red"), "PNG"), mean=MEAN, std=STD, **REAL)
    assert (rows, cols) == (18, 23) and pixels.shape == (3, 504, 644)


@pytest.mark.parametrize("size", [(1, 1), (1, 5000), (5000, 1), (1540, 1540), (1541, 1540), (3079, 10),
                                  (4000, 3000), (12345, 7), (100, 100), (1000, 1541)])
def test_grid_rule_matches_mistral_common(size):
    encoder = mc_image.ImageEncoder(mc_image.ImageConfig(14, 1540, 2), mc_image.SpecialImageIDs(10, 12, 13))
    # _image_to_num_tokens only reads .size; no need to allocate the pixels.
    fake = type("Sized", (), {"size": size})()
    cols, rows = encoder._image_to_num_tokens(fake)
    assert image_grid(size, 1540, 14, 2) == (rows, cols)


@pytest.mark.parametrize("shape", [(480, 640, 504, 644), (3000, 400, 1176, 168), (7, 5, 28, 28)])
def test_resampler_is_cv2_generic_inter_cubic(shape):
    """With IPP off, cv2 runs its generic INTER_CUBIC: we must match it to float32 rounding."""
    sh, sw, dh, dw = shape
    src = np.random.default_rng(9).integers(0, 256, (sh, sw, 3), dtype=np.uint8)
    was = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    try:
        ref = cv2.resize(src.astype(np.float32), (dw, dh), interpolation=cv2.INTER_CUBIC)
    finally:
        cv2.ipp.setUseIPP(was)
    out = resize_cubic(torch.from_numpy(src), dw, dh).numpy()
    assert np.abs(out - ref).max() <= 2e-4  # [0, 255] units


def test_overshoot_is_kept_like_cv2():
    """cv2 on float input does not clip: a sharp edge overshoots below 0 and above 255."""
    src = np.zeros((8, 8, 3), dtype=np.uint8)
    src[:, 4:] = 255
    out = resize_cubic(torch.from_numpy(src), 20, 20)
    ref = cv2.resize(src.astype(np.float32), (20, 20), interpolation=cv2.INTER_CUBIC)
    assert out.min() < -1 and out.max() > 256
    assert np.abs(out.numpy() - ref).max() <= 0.1


def test_exif_orientation_is_applied():
    """mistral-common ignores EXIF orientation; we apply it (a phone photo must be upright)."""
    img = Image.fromarray(noise(300, 100))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    data = encode(img, "JPEG", quality=95, exif=exif.tobytes())
    pixels, rows, cols = preprocess(data, mean=MEAN, std=STD, **REAL)
    assert image_size_of(data) == (100, 300)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert upright.size == (100, 300)
    ref, ref_rows, ref_cols = reference(upright, **REAL)
    assert (rows, cols) == (ref_rows, ref_cols) == (11, 4)
    assert np.abs(pixels.numpy() - ref).max() <= PIXEL_TOL


def test_sixteen_bit_grey_is_scaled_not_clipped():
    """Pillow's convert clips 16-bit grey at 255 (mistral-common then sees white); we scale to
    8 bits. Grid equals mistral-common's; pixels equal mistral-common's on the 8-bit image."""
    img = sixteen_bit(90, 70)
    data = encode(img, "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    pixels, rows, cols = preprocess(data, mean=MEAN, std=STD, **REAL)
    _, ref_rows, ref_cols = reference(Image.open(io.BytesIO(data)), **REAL)
    assert (rows, cols) == (ref_rows, ref_cols)
    eight = np.rint(np.asarray(img).astype(np.float64) / 257).astype(np.uint8)
    ref, _, _ = reference(Image.fromarray(eight, "L"), **REAL)
    assert np.abs(pixels.numpy() - ref).max() <= PIXEL_TOL
    assert pixels.std() > 0.5  # not a white sheet


def test_transparent_pixels_become_white():
    img = Image.new("RGBA", (28, 28), (0, 0, 0, 0))
    pixels, _, _ = preprocess(encode(img, "PNG"), mean=MEAN, std=STD, **REAL)
    white = (1.0 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert torch.allclose(pixels, white[:, None, None].expand_as(pixels), atol=1e-6)


# --- hostile files -------------------------------------------------------------------------


def png_header_only(w: int, h: int) -> bytes:
    """A PNG that claims w x h but carries a few bytes of image data (a bomb's header)."""
    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "empty"),
        (b"hello, this is text and not a picture at all", "not an image"),
        (b"%PDF-1.4\n" + b"0" * 200, "not an image"),
        (png_header_only(50_000, 50_000), "limit"),
        (png_header_only(10_000, 9_000), "limit"),
    ],
    ids=["empty", "text", "pdf", "bomb-50k", "bomb-90M"],
)
def test_hostile_bytes_are_refused_clearly(data, words):
    with pytest.raises(EngineError) as err:
        preprocess(data, mean=MEAN, std=STD, **REAL, source="holiday.png")
    assert "holiday.png" in str(err.value) and words in str(err.value)
    with pytest.raises(EngineError, match="holiday.png"):
        image_size_of(data, source="holiday.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file_is_refused(fmt):
    data = encode(Image.fromarray(noise(200, 200)), fmt)
    with pytest.raises(EngineError, match="cat.img.*(truncated|corrupt|cannot)"):
        decode_image(data[: len(data) // 2], source="cat.img")


def test_limit_is_below_pillows_hard_limit():
    assert MAX_IMAGE_PIXELS <= Image.MAX_IMAGE_PIXELS * 2


# --- the native resampler (kernels/image/resample.c) against the torch path -----------------

@pytest.mark.parametrize("shape", [(480, 640, 504, 644, 3), (2000, 3000, 1036, 1540, 3), (3000, 400, 1176, 168, 3),
                                   (1, 1, 28, 28, 3), (7, 5, 28, 28, 3), (5, 9, 30, 14, 1), (33, 17, 56, 84, 4),
                                   (100, 100, 28, 28, 2), (1, 5000, 28, 1540, 3), (504, 644, 504, 644, 3),
                                   (28, 28, 28, 28, 1), (480, 644, 504, 644, 3), (504, 640, 504, 644, 3)])
@pytest.mark.parametrize("normalised", [False, True], ids=["raw", "normalised"])
def test_native_resampler_equals_torch_path_bit_for_bit(shape, normalised):
    from tramontane.engine.mistral3 import image as image_module

    if image_module._resample is None:
        pytest.skip("the native resampler is not built")
    sh, sw, dh, dw, ch = shape
    src = np.random.default_rng(sh + 31 * sw + ch).integers(0, 256, (sh, sw, ch), dtype=np.uint8)
    mean, std = ((MEAN * 2)[:ch], (STD * 2)[:ch]) if normalised else (None, None)
    args = (lambda r, c: src[np.ix_(r, c)], sw, sh, dw, dh, mean, std)
    native = image_module._resize(*args, native=True)
    general = image_module._resize(*args, native=False)
    assert native.shape == general.shape == (ch, dh, dw)
    assert torch.equal(native, general)


def test_native_resampler_refuses_a_tap_outside_the_source():
    from tramontane.engine.mistral3 import image as image_module

    if image_module._resample is None:
        pytest.skip("the native resampler is not built")
    src = np.zeros((4, 4, 3), dtype=np.uint8)
    idx = np.array([[0, 1, 2, 4]] * 2, dtype=np.int32)  # 4 is one past the last column
    w = np.full((2, 4), 0.25, dtype=np.float32)
    out = torch.empty(3, 2, 2)
    with pytest.raises(ValueError, match="outside the source"):
        image_module._resample.cubic(src.ctypes.data, 4, 4, 3, idx.ctypes.data, w.ctypes.data, 2,
                                     np.zeros((2, 4), np.int32).ctypes.data, w.ctypes.data, 2, out.data_ptr(), 0, 0)


def test_native_taps_equal_numpy_taps_bit_for_bit():
    """Indices, weights (as bits) and the every-position-read flag, over shrinking, growing and
    same sizes, small and large."""
    from tramontane.engine.mistral3 import image as image_module

    if image_module._resample is None:
        pytest.skip("the native resampler is not built")
    rng = np.random.default_rng(5)
    pairs = [(s, d) for s in range(1, 60) for d in range(1, 60)]
    pairs += [(int(s), int(d)) for s, d in rng.integers(1, 20000, (400, 2))] + [(6000, 1540), (1541, 1540), (89_000, 28)]
    for src_len, dst_len in pairs:
        idx, weights = image_module._cubic_taps(src_len, dst_len)
        n_idx, n_weights, every = image_module._native_taps(src_len, dst_len)
        assert np.array_equal(idx, n_idx), (src_len, dst_len)
        assert np.array_equal(weights.view(np.int32), n_weights.view(np.int32)), (src_len, dst_len)
        assert every == (len(np.unique(idx)) == src_len), (src_len, dst_len)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("rgb-640x480-jpeg", "rgb-28x28-exact", "rgba-300x200",
                                                               "rgb-2100x1000-over-max", "l-333x111")],
                         ids=lambda c: c[0])
def test_torch_path_without_the_native_module_matches_it(monkeypatch, case):
    """An install without a C compiler: preprocess on the torch path gives the native path's
    pixels exactly (and so mistral-common's)."""
    from tramontane.engine.mistral3 import image as image_module

    _, make, settings = case
    data = make()
    native, rows, cols = preprocess(data, mean=MEAN, std=STD, **settings)
    monkeypatch.setattr(image_module, "_resample", None)
    general, g_rows, g_cols = preprocess(data, mean=MEAN, std=STD, **settings)
    assert (rows, cols) == (g_rows, g_cols)
    assert torch.equal(native, general)
    ref, _, _ = reference(Image.open(io.BytesIO(data)), **settings)
    assert np.abs(general.numpy() - ref).max() <= PIXEL_TOL
