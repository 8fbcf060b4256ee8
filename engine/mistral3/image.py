"""Image preprocessing for the Pixtral encoder, exactly as mistral-common does it.

mistral-common (`ImageEncoder` + `transform_image`) is the reference, not HF's
`PixtralImageProcessor` (which antialiases when shrinking). The steps:

1. decode with Pillow, first frame only, EXIF orientation applied (mistral-common does NOT
   apply EXIF orientation; we do, so a phone photo is seen upright);
2. any mode other than RGB → RGBA → pasted over white → RGB (mistral-common's
   `_convert_to_rgb`); 16-bit grey is scaled to 8 bits first (Pillow alone would clip it
   to 255, i.e. white — mistral-common's behaviour, which we do not copy);
3. grid: if the longest side exceeds `image_size`, divide both sides by
   `max(w, h) / image_size` and round (Python `round`, at least 1); then
   `cols = (w - 1) // P + 1`, `rows = (h - 1) // P + 1` with `P = patch_size * merge`;
4. resize the *original* RGB image (as float32 in [0, 255]) to `(cols * P, rows * P)` with
   OpenCV's `INTER_CUBIC` (Keys a = -0.75, half-pixel centres, replicated border, no
   antialiasing, no clipping), implemented here so cv2 is not a runtime dependency;
5. divide by 255, subtract mean, divide by std (float32, like mistral-common's `normalize`).

Steps 4 and 5 run in one native pass (kernels/image/resample.c) when it is built, else as
torch ops; both compute every value with the same float32 operations in the same order, so
they agree bit for bit (tests/engine/mistral3/test_image.py checks it).
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps

from ..api import EngineError

try:  # the native resampler (built by pip install from kernels/image/resample.c); else torch
    from ...kernels import _resample
except ImportError:
    _resample = None

# Refuse anything above Pillow's own default bomb limit (~89.5 Mpx, e.g. 9459 x 9459) before
# its pixels are decoded; the check reads only the header.
MAX_IMAGE_PIXELS = 89_478_485

ORIENTATION_TAG = 0x0112  # EXIF Orientation
CUBIC_A = -0.75  # OpenCV's INTER_CUBIC kernel parameter (PIL/torch use -0.5 / -0.75 variously)
_CHUNK_VALUES = 1 << 16  # values per step of each resize pass: temporaries stay in the L2 cache
_TILE_PIXELS = 1 << 22  # pixels per read from the decoded image


def image_grid(size_wh: tuple[int, int], image_size: int, patch_size: int, merge: int,
               source: str = "image") -> tuple[int, int]:
    """(rows, cols) of merged image tokens for an image of `size_wh` = (width, height).

    Every aspect ratio with both sides ≥ 1 makes a valid grid (at least 1 × 1): a side that
    scaling would round to 0 is kept at 1 pixel, as mistral-common does; so only an empty
    side is refused."""
    w, h = size_wh
    if w < 1 or h < 1:
        raise EngineError(f"{source}: image size {w}x{h} cannot make a token grid (a side is empty)")
    ratio = max(w / image_size, h / image_size)
    if ratio > 1:
        # Python's round (half to even) on purpose: it is what mistral-common uses.
        w = max(round(w / ratio), 1)
        h = max(round(h / ratio), 1)
    tile = patch_size * merge
    return (h - 1) // tile + 1, (w - 1) // tile + 1


def image_token_count(size_wh: tuple[int, int], image_size: int, patch_size: int, merge: int) -> int:
    """The prompt tokens an image of `size_wh` takes: its grid's `cols` [IMG] and one
    [IMG_BREAK] (the last [IMG_END]) per row, as chat_format.image_tokens writes them. Cheap
    (no pixels): the window shows it on each attached image."""
    rows, cols = image_grid(size_wh, image_size, patch_size, merge)
    return rows * (cols + 1)


def decode_image(data: bytes, source: str = "image") -> Image.Image:
    """Decode file bytes to an upright RGB Pillow image (first frame), or raise EngineError."""
    if not data:
        raise EngineError(f"{source}: empty file, not an image")
    try:
        with warnings.catch_warnings():
            # We apply our own pixel limit below; silence Pillow's 1x-2x bomb warning.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise EngineError(f"{source}: image too large to decode safely ({exc})") from exc
    except Image.UnidentifiedImageError as exc:
        raise EngineError(f"{source}: not an image, or a format Pillow cannot read") from exc
    except Exception as exc:  # Pillow raises many types on hostile headers
        raise EngineError(f"{source}: cannot read image: {exc}") from exc

    w, h = img.size
    if w < 1 or h < 1:
        raise EngineError(f"{source}: image has an empty size {w}x{h}")
    if w * h > MAX_IMAGE_PIXELS:
        raise EngineError(
            f"{source}: image is {w}x{h} = {w * h:,} pixels, above the {MAX_IMAGE_PIXELS:,}-pixel "
            "limit (possible decompression bomb); shrink it first"
        )
    try:
        img.seek(0)  # animated GIF/WebP/APNG: the first frame, like mistral-common
        img.load()  # decode now so a truncated file fails here, not later
    except Exception as exc:
        raise EngineError(f"{source}: cannot decode image (truncated or corrupt file?): {exc}") from exc
    try:
        # exif_transpose copies an upright image; only a turned or mirrored one needs it
        if img.getexif().get(ORIENTATION_TAG, 1) in (2, 3, 4, 5, 6, 7, 8):
            img = ImageOps.exif_transpose(img)
    except Exception:
        pass  # unreadable EXIF: keep the pixels as stored rather than refuse the picture
    try:
        return to_rgb(img)
    except Exception as exc:
        raise EngineError(f"{source}: cannot convert a {img.mode} image to RGB: {exc}") from exc


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB as mistral-common's `_convert_to_rgb`: anything else → RGBA, pasted over white.

    A mode with no alpha at all converts straight to RGB: pasting a fully opaque RGBA over
    white copies its colour channels exactly, so the result is the same image, without the
    two extra full-size RGBA copies (tests/engine/mistral3/test_image_hostile.py checks it)."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I;16") or img.mode == "I":
        img = _sixteen_bit_to_l(img)
    if _is_opaque(img):
        return img.convert("RGB")
    if img.mode != "RGBA":
        img = img.convert("RGBA")
    white = Image.new("RGBA", img.size, "WHITE")
    white.paste(img, (0, 0), img)
    return white.convert("RGB")


OPAQUE_MODES = ("1", "L", "CMYK", "YCbCr")  # modes that cannot carry transparency


def _is_opaque(img: Image.Image) -> bool:
    if "transparency" in img.info:
        return False
    if img.mode == "P":
        return img.palette is not None and img.palette.mode == "RGB"
    return img.mode in OPAQUE_MODES


def _sixteen_bit_to_l(img: Image.Image) -> Image.Image:
    """16-bit (or 32-bit int) grey → 8-bit L, rounding v·255/65535. Pillow's convert would
    clip at 255 (a white sheet)."""
    values = np.asarray(img)
    if img.mode == "I" and 0 <= values.min(initial=0) and values.max(initial=0) <= 255:
        return Image.fromarray(values.astype(np.uint8), "L")  # 8-bit data stored in an I image
    wide = np.clip(values, 0, 65535).astype(np.uint32)
    return Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), "L")


def _cubic_taps(src_len: int, dst_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices (dst_len, 4) and weights (dst_len, 4) of OpenCV's INTER_CUBIC on one axis.

    Mirrors cv2's resize: scale = 1 / (dst/src), fx = (dx + 0.5) * scale - 0.5 rounded to
    float32, taps at floor(fx) - 1 .. floor(fx) + 2 clamped to the edge (replicate border),
    weights from Keys' kernel with a = -0.75 in float32, the last one 1 - sum(others).
    """
    scale = 1.0 / (dst_len / src_len)
    fx = ((np.arange(dst_len, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    sx = np.floor(fx)
    x = (fx - sx).astype(np.float32)
    a = np.float32(CUBIC_A)
    one = np.float32(1.0)
    c0 = ((a * (x + one) - 5 * a) * (x + one) + 8 * a) * (x + one) - 4 * a
    c1 = ((a + 2) * x - (a + 3)) * x * x + one
    c2 = ((a + 2) * (one - x) - (a + 3)) * (one - x) * (one - x) + one
    c3 = one - c0 - c1 - c2
    weights = np.stack([c0, c1, c2, c3], axis=1).astype(np.float32)
    idx = sx.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    return np.clip(idx, 0, src_len - 1), weights


def resize_cubic(rgb, width: int, height: int) -> torch.Tensor:
    """cv2.resize(rgb_float32, (width, height), interpolation=cv2.INTER_CUBIC) for (H, W, C).

    Horizontal pass then vertical pass (cv2's order), float32, no clipping (like cv2 on float
    input). Takes uint8 (numpy or torch) so the big source image stays small in memory.
    """
    src = rgb.numpy() if isinstance(rgb, torch.Tensor) else np.asarray(rgb)
    chw = _resize(lambda rows, cols: src[np.ix_(rows, cols)], src.shape[1], src.shape[0], width, height)
    return chw.permute(1, 2, 0).contiguous()


def _resize(pick, src_w: int, src_h: int, width: int, height: int, mean=None, std=None,
            native: bool = True) -> torch.Tensor:
    """The resampler, reading the source only through `pick(rows, cols)` → uint8 (R, C, ch);
    returns float32 (ch, height, width), the encoder's layout, normalised as
    ((v / 255) - mean) / std when `mean` and `std` are given.

    Memory is bounded by the output, not the input: the taps read at most 4 source rows per
    output row and 4 source columns per output column, so only those pixels are picked (the
    others would be read by no tap: the result is bit-for-bit the same). The picked block is
    ≤ min(src_h, 4·height) × min(src_w, 4·width). The native resampler (`native`, when built)
    then needs only 4 horizontal rows more; the torch path's horizontal result is
    ≤ min(src_h, 4·height) × width, in chunks of _CHUNK_VALUES values. Both compute each output
    value the same way, bit for bit: (((0 + t0) + t1) + t2) + t3 with t_k = pixel · weight in
    float32, cv2's sum.
    """
    if native and _resample is not None:
        # The same size too: its taps weigh (0, 1, 0, 0), so each value is its pixel, exactly.
        x_idx, x_w, x_all = _native_taps(src_w, width)
        y_idx, y_w, y_all = _native_taps(src_h, height)
        used_rows = np.arange(src_h) if y_all else np.unique(y_idx)
        used_cols = np.arange(src_w) if x_all else np.unique(x_idx)
        picked = np.ascontiguousarray(pick(used_rows, used_cols))  # uint8 (R, C, ch)
        if not x_all:  # taps as indices into the picked block (taps only move forward)
            x_idx = np.searchsorted(used_cols, x_idx).astype(np.int32)
        if not y_all:
            y_idx = np.searchsorted(used_rows, y_idx).astype(np.int32)
        return _resize_native(picked, x_idx, x_w, y_idx, y_w, width, height, mean, std)
    x_idx, x_w = _cubic_taps(src_w, width)
    y_idx, y_w = _cubic_taps(src_h, height)
    used_rows, used_cols = np.unique(y_idx), np.unique(x_idx)
    picked = np.ascontiguousarray(pick(used_rows, used_cols))  # uint8 (R, C, ch)
    if (src_w, src_h) == (width, height):
        out = torch.tensor(picked).permute(2, 0, 1).contiguous().float()
        return out if mean is None else _normalize(out, mean, std)
    x_idx = np.searchsorted(used_cols, x_idx)
    y_idx = np.searchsorted(used_rows, y_idx)
    picked = picked if picked.flags.writeable else picked.copy()  # torch warns on read-only arrays
    out = _resize_torch(torch.from_numpy(picked), x_idx, x_w, y_idx, y_w, width, height)
    return out if mean is None else _normalize(out, mean, std)


def _normalize(pixels: torch.Tensor, mean, std) -> torch.Tensor:
    """In place; the same float32 order of operations as mistral-common's normalize()."""
    pixels /= 255.0
    pixels -= torch.tensor(mean, dtype=torch.float32)[:, None, None]
    pixels /= torch.tensor(std, dtype=torch.float32)[:, None, None]
    return pixels


def _native_taps(src_len: int, dst_len: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """_cubic_taps by the native module, bit for bit (int32 indices), and whether every source
    position is read (then no pixel is skipped, and the indices need no remapping)."""
    idx = np.empty((dst_len, 4), dtype=np.int32)
    weights = np.empty((dst_len, 4), dtype=np.float32)
    return idx, weights, _resample.taps(src_len, dst_len, idx.ctypes.data, weights.ctypes.data)


def _resize_native(picked: np.ndarray, x_idx, x_w, y_idx, y_w, width: int, height: int, mean, std) -> torch.Tensor:
    n_rows, n_cols, channels = picked.shape
    x_idx, y_idx = np.ascontiguousarray(x_idx, np.int32), np.ascontiguousarray(y_idx, np.int32)  # (n, 4)
    x_w, y_w = np.ascontiguousarray(x_w, np.float32), np.ascontiguousarray(y_w, np.float32)
    out = torch.empty(channels, height, width)
    if mean is not None:
        mean, std = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
        if mean.shape != (channels,) or std.shape != (channels,):
            raise ValueError(f"mean/std need {channels} values, got {mean.shape} and {std.shape}")
    _resample.cubic(picked.ctypes.data, n_rows, n_cols, channels, x_idx.ctypes.data, x_w.ctypes.data, width,
                    y_idx.ctypes.data, y_w.ctypes.data, height, out.data_ptr(),
                    0 if mean is None else mean.ctypes.data, 0 if std is None else std.ctypes.data)
    return out


def _resize_torch(src: torch.Tensor, x_idx, x_w, y_idx, y_w, width: int, height: int) -> torch.Tensor:
    """The two passes by whole-row torch ops: the horizontal pass runs on the transposed
    source, so that both passes gather whole rows (a memory copy) instead of single values."""
    x_idx = torch.from_numpy(x_idx.T.copy())  # (4, width)
    y_idx = torch.from_numpy(y_idx.T.copy())  # (4, height)
    x_w, y_w = torch.from_numpy(x_w.T.copy()), torch.from_numpy(y_w.T.copy())
    columns = src.permute(2, 1, 0).contiguous()  # (ch, C, R): the source's columns as rows
    channels, n_rows = columns.shape[0], columns.shape[2]
    across = torch.zeros(channels, width, n_rows)  # the horizontal pass, transposed
    step = max(1, _CHUNK_VALUES // (channels * n_rows))
    for c0 in range(0, width, step):  # across[:, dx] += columns[:, idx[k, dx]] * w[k, dx]
        acc = across[:, c0:c0 + step]
        for k in range(4):
            acc += columns.index_select(1, x_idx[k, c0:c0 + step]).float().mul_(x_w[k, c0:c0 + step, None])
    rows = across.transpose(1, 2).contiguous()  # (ch, R, width)
    del across
    out = torch.zeros(channels, height, width)
    step = max(1, _CHUNK_VALUES // (channels * width))
    for r0 in range(0, height, step):  # out[:, dy] += rows[:, idx[k, dy]] * w[k, dy]
        acc = out[:, r0:r0 + step]
        for k in range(4):
            acc += rows.index_select(1, y_idx[k, r0:r0 + step]).mul_(y_w[k, r0:r0 + step, None])
    return out


def _pick_pixels(img: Image.Image, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """An RGB image's pixels at rows × cols (sorted) as uint8 (len(rows), len(cols), 3), read in
    tiles of at most _TILE_PIXELS: no full-size copy, and no single Pillow call on a line too
    long for it (`tobytes` refuses a row of ~89 Mpx)."""
    w, h = img.size
    if len(rows) == h and len(cols) == w and w * h <= 4 * _TILE_PIXELS:
        # every pixel is read (a shrink by at most 4): one copy, read-only, instead of three
        return np.asarray(img)
    out = np.empty((len(rows), len(cols), 3), dtype=np.uint8)
    band, span = max(1, _TILE_PIXELS // w), min(w, _TILE_PIXELS)
    for y0 in range(0, h, band):
        r_lo, r_hi = np.searchsorted(rows, [y0, y0 + band])
        if r_lo == r_hi:
            continue
        ys = rows[r_lo:r_hi]
        for x0 in range(0, w, span):
            c_lo, c_hi = np.searchsorted(cols, [x0, x0 + span])
            if c_lo == c_hi:
                continue
            xs = cols[c_lo:c_hi]
            tile = np.asarray(img.crop((int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1)))
            if tile.shape[:2] == (len(ys), len(xs)):  # every row and column of the tile is used
                out[r_lo:r_hi, c_lo:c_hi] = tile
            else:
                out[r_lo:r_hi, c_lo:c_hi] = tile[np.ix_(ys - ys[0], xs - xs[0])]
    return out


def pixels_from_image(
    img: Image.Image, *, image_size: int, patch_size: int, merge: int, mean, std
) -> tuple[torch.Tensor, int, int]:
    """RGB Pillow image → (normalised float32 (3, H, W), rows, cols)."""
    rows, cols = image_grid(img.size, image_size, patch_size, merge)
    tile = patch_size * merge
    resized = _resize(lambda r, c: _pick_pixels(img, r, c), img.width, img.height, cols * tile, rows * tile,
                      mean, std)
    return resized, rows, cols


def preprocess(
    data: bytes, *, image_size: int, patch_size: int, merge: int, mean, std, source: str = "image"
) -> tuple[torch.Tensor, int, int]:
    """Image file bytes → (pixels float32 (3, rows*P, cols*P), rows, cols), P = patch*merge."""
    img = decode_image(data, source)
    return pixels_from_image(img, image_size=image_size, patch_size=patch_size, merge=merge, mean=mean, std=std)


def image_size_of(data: bytes, source: str = "image") -> tuple[int, int]:
    """(width, height) as the encoder will see it (EXIF orientation applied), from the header
    only: cheap enough for prompt building. A file that fails later to decode still fails in
    `preprocess` with the same kind of error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            orientation = img.getexif().get(ORIENTATION_TAG, 1)
    except Exception:
        return decode_image(data, source).size  # raises the right EngineError
    if w * h > MAX_IMAGE_PIXELS or w < 1 or h < 1:
        return decode_image(data, source).size  # raises
    # Orientations 5-8 include a 90-degree turn, which swaps the sides.
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)
