"""Decode an encoded image straight into a resized crop, spending as little as the crop allows.

Why these paths (measured: ``python -m benchmarks.decode_profile``, figures on the docs' Benchmarks page):

- full decode: ``torchvision.io.decode_jpeg`` is a little faster than PIL ``open().convert()``; simplejpeg is no
  faster than ``decode_jpeg``;
- region-of-interest decode (``_jpegroi``, our small libjpeg-turbo extension: ``jpeg_crop_scanline`` +
  ``jpeg_skip_scanlines``, stopping after the crop's last row) of ``RandomResizedCrop`` boxes is faster than a
  full decode, since only the crop's rows and columns are inverse-DCT'd and colour-converted. The entropy
  (Huffman) decoding of every row down to the crop's last is left, and it is most of the time;
- the fast integer IDCT (``JDCT_IFAST``, what FFCV and PIL's ``draft`` use) instead of the exact one: a few
  percent faster, within ~46 dB PSNR of the exact decode; ``exact=True`` keeps the exact one;
- DCT-domain scaling: only 1/2, 1/4 and 1/8 pay. libjpeg-turbo's other scales (5/8, 6/8, 7/8) have no SIMD
  inverse DCT and are *slower* than a full-size decode plus a resize, so a crop under twice the output is decoded
  at full size. A crop at least twice the output is decoded at 1/2, 1/4 or 1/8 *and* cut to its rows and
  columns (its edges rounded to the scaled image's pixels: under half an output pixel), then resized;
- resize: torch's uint8 antialiased bilinear kernel on a channels-last view is faster than PIL's ``resize``
  (twice as fast on the scaled crops, where PIL's sub-pixel box would be the alternative).

Other formats and CMYK/YCCK JPEGs go through PIL's ``convert("RGB")``, as torchvision's ``ImageFolder`` does
(PIL's ``draft`` for the DCT scaling); without the compiled extension, JPEGs go through ``decode_jpeg``.
``exact=True`` (``exact_decode`` on the DataModules) decodes every crop at full size with the exact IDCT: the
same pixels as ``decode_jpeg`` of the whole image, cropped.
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_fastdata._ext import native
from lightning_fastdata.augment.geometry import Box, center_crop_box, resize_crop_into
from lightning_fastdata.errors import CORRUPT_IMAGE_ADVICE, CorruptImageError, DataError, InvalidValueError

__all__ = [
    "check_box",
    "check_size",
    "decode_center_crop",
    "decode_center_crop_bytes",
    "decode_resized_crop",
    "image_data_errors",
    "jpeg_header_box",
    "pillow_simd_installed",
    "roi_decode_available",
]

log = logging.getLogger("lightning_fastdata")

_JPEG_MAGIC = b"\xff\xd8\xff"

# built by setup.py against the system libjpeg-turbo; optional, everything works without it (None)
_jpegroi: Any = native.jpegroi


def _draft_scale(box: Box, out_hw: tuple[int, int]) -> int:
    """Largest DCT reduction (1, 2, 4 or 8) that keeps the crop at least as large as the output."""
    factor = min(box[2] // out_hw[0], box[3] // out_hw[1])
    return next((s for s in (8, 4, 2) if factor >= s), 1)


def _roi_buffer(nbytes: int) -> bytearray:
    """This thread's scratch buffer for ROI decodes, grown as needed.

    One per thread (and so per process): two loaders iterated from two threads of one process never decode
    into the same memory.
    """
    buf: bytearray | None = getattr(_ROI_LOCAL, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _ROI_LOCAL.buf = bytearray(nbytes)
    return buf


_ROI_LOCAL = threading.local()
# libjpeg's jpeg_color_space values that decode to RGB exactly (grayscale, RGB, YCbCr); CMYK/YCCK go via PIL.
_ROI_COLOR_SPACES = (1, 2, 3)
# The end-of-image marker (FF D9) cannot occur inside entropy-coded data (an FF there is followed by 00 or a
# restart marker), so its presence near the end tells a complete file from one cut short. Files with more
# than this many trailing bytes after it (appended metadata) are read through to their end at each decode.
_EOI = b"\xff\xd9"
_EOI_TAIL = 4096


def _pixel_limit() -> int | None:
    """PIL's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS`` x 2, where PIL raises), or ``None`` if off."""
    limit = Image.MAX_IMAGE_PIXELS
    return None if limit is None else 2 * int(limit)


def check_box(box: Box, width: int, height: int) -> None:
    """A crop box outside the image is a bug in the caller, never a corrupt file: ``ValueError``."""
    top, left, h, w = box
    if top < 0 or left < 0 or h <= 0 or w <= 0 or top + h > height or left + w > width:
        raise InvalidValueError(f"crop box outside the image: {box} (top, left, h, w) in a {width} x {height} image")


def check_size(width: int, height: int) -> None:
    """Refuse an image over PIL's decompression-bomb limit: a ``DataError`` (a corrupt image) naming its size."""
    limit = _pixel_limit()
    if limit is not None and width * height > limit:
        raise DataError(
            f"image of {width} x {height} = {width * height} pixels exceeds the decompression-bomb limit of {limit} "
            "pixels (PIL.Image.MAX_IMAGE_PIXELS x 2); if the image is genuine, raise PIL.Image.MAX_IMAGE_PIXELS"
        )


@contextmanager
def image_data_errors() -> Iterator[None]:
    """Turn what PIL raises for bad image data into ``OSError`` (what a corrupt file is, here)."""
    try:
        yield
    except (SyntaxError, EOFError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(str(err) or type(err).__name__) from err


def _decode_roi(data: bytes, box: Box, fast_idct: bool = False, scale_num: int = 8) -> torch.Tensor:
    """Decode only the crop's rows and iMCU-aligned columns; return a ``3 x h x w`` view of the crop.

    At ``scale_num / 8`` of the size, ``box`` is in the scaled image's pixels.

    A file whose end-of-image marker is not near its end (cut short, or with appended data) is also read
    through to its end below the crop, so that truncation is detected whatever the crop: a file is corrupt or
    not, not sometimes.
    """
    top, left, h, w = box
    to_end = data.rfind(_EOI, max(0, len(data) - _EOI_TAIL)) < 0
    # one column of margin per side (see jpegroi.c), and crop_scanline widens by at most one iMCU (<= 32 px) per side
    buf = _roi_buffer(h * (w + 66) * 3)
    shift, decoded_w = _jpegroi.decode_crop(data, top, left, h, w, buf, to_end, scale_num, fast_idct)
    rows = torch.frombuffer(buf, dtype=torch.uint8, count=h * decoded_w * 3).view(h, decoded_w, 3)
    return rows[:, shift : shift + w].permute(2, 0, 1)


def _scaled_box(box: Box, size: tuple[int, int], reduction: int) -> Box:
    """``box`` in the image decoded at ``1 / reduction``, its edges rounded to the nearest scaled pixel.

    Each edge moves by at most ``reduction / 2`` source pixels: under half an output pixel, since a crop is
    DCT-scaled only when it is at least ``reduction`` times the output.
    """
    if reduction == 1:
        return box
    top, left, h, w = box
    sw, sh = -(-size[0] // reduction), -(-size[1] // reduction)
    half = reduction // 2
    t0, l0 = min(sh - 1, (top + half) // reduction), min(sw - 1, (left + half) // reduction)
    b0, r0 = min(sh, (top + h + half) // reduction), min(sw, (left + w + half) // reduction)
    return t0, l0, max(1, b0 - t0), max(1, r0 - l0)


def _decode_draft(img: Image.Image, box: Box, out_hw: tuple[int, int], scale: int) -> torch.Tensor:
    """Decode at 1/scale in the DCT domain and resize the crop with a sub-pixel box; return ``3 x H x W``."""
    top, left, h, w = box
    width, height = img.size
    with image_data_errors():
        img.draft("RGB", (width // scale, height // scale))
        reduced = img.convert("RGB")
    # Reduced pixel i covers full-resolution pixels [i * scale, (i + 1) * scale).
    fbox = (left / scale, top / scale, (left + w) / scale, (top + h) / scale)
    # The reduced image is small, so PIL's resize (which takes a sub-pixel box) costs little here.
    small = reduced.resize((out_hw[1], out_hw[0]), Image.Resampling.BILINEAR, box=fbox)
    return torch.from_numpy(np.array(small)).permute(2, 0, 1)


def _decode_full_jpeg(data: bytes, box: Box) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg

    top, left, h, w = box
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its decoders in favour of torchcodec; still the fastest full decode here.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            decoded = decode_jpeg(raw, mode=ImageReadMode.RGB)
        except RuntimeError as err:  # torchvision reports libjpeg's data errors as RuntimeError
            raise DataError(str(err)) from err
    return decoded[:, top : top + h, left : left + w]


def jpeg_header_box(data: bytes, box_fn: Callable[[int, int], Box]) -> tuple[int, int, int, Box] | None:
    """A JPEG's ``(width, height, libjpeg colour space, crop box)`` from its header alone (the compiled decoder's read).

    The size is checked against PIL's pixel limit and the box (``box_fn(width, height)``) against the image; ``None``
    where the compiled decoder is missing (the caller opens the image with PIL).

    Raises:
        OSError: If the header is unreadable or the image is over the pixel limit.
    """
    if _jpegroi is None:
        return None
    width, height, color_space = _jpegroi.header(data)
    check_size(width, height)
    box = box_fn(width, height)
    check_box(box, width, height)
    return width, height, color_space, box


def _open_image(data: bytes) -> Image.Image:
    with image_data_errors():
        img = Image.open(io.BytesIO(data))
    check_size(*img.size)
    return img


def _mcu_span(start: int, length: int, mcu: int, count: int, slack: int) -> tuple[int, int]:
    """The MCUs ``[first, end)`` that hold pixels ``[start, start + length)``, with a margin where needed.

    One more MCU on a side whose edge is within ``slack`` pixels of the span's edge: the chroma upsampling at the
    crop's edge reads the neighbouring chroma samples, which must be decoded for the same pixels.
    """
    first, end = start // mcu, -(-(start + length) // mcu)
    if start - first * mcu < slack and first > 0:
        first -= 1
    if end * mcu - (start + length) < slack and end < count:
        end += 1
    return first, end


def _decode_indexed(
    data: bytes, index: bytes, box: Box, size: tuple[int, int], scale: int, fast_idct: bool, name: str
) -> torch.Tensor | None:
    """The crop decoded from a small JPEG of its MCUs alone (see :mod:`lightning_fastdata.loading.jpeg.entropy_index`).

    ``None`` where that is not possible (the file's DC table lacks a code, or the crop spans the whole image), or
    where the index does not match the file (built from other bytes, or damaged: warned once per process, naming
    ``name``); the caller then decodes the file as it would without an index: the same pixels.
    """
    geometry = _index_geometry(index)
    if geometry is None:
        _warn_bad_index(name, "its length or geometry is not an index's")
        return None
    per_row, rows, mcu_w, mcu_h, every = geometry
    if (per_row, rows) != (-(-size[0] // mcu_w), -(-size[1] // mcu_h)):
        _warn_bad_index(name, f"it is of a {per_row} x {rows} MCU image, not of this one")
        return None
    top, left, h, w = box
    r0, r1 = _mcu_span(top, h, mcu_h, rows, 2 * scale)
    c0, c1 = _mcu_span(left, w, mcu_w, per_row, 2 * scale)
    # Huffman-decoded MCUs with the index (the crop's, plus those parsed from the entry before each row's first,
    # at ~PARSE_COST each) against without (every row down to the crop's last, whole): the index only where it pays
    with_index = (r1 - r0) * (c1 - c0 + PARSE_COST * (c0 % every)) + INDEX_OVERHEAD_MCUS
    if with_index >= r1 * per_row:
        return None
    try:
        small = _jpegroi.crop_jpeg(data, index, r0, r1, c0, c1)
    except KeyError:
        _warn_bad_index(name, "it was built from other bytes: the file changed since, or the index is damaged")
        return None
    except ValueError as err:  # MCU counts or offsets that are not this image's
        _warn_bad_index(name, str(err))
        return None
    if small is None:
        return None
    sub = (min(c1 * mcu_w, size[0]) - c0 * mcu_w, min(r1 * mcu_h, size[1]) - r0 * mcu_h)
    shifted = (top - r0 * mcu_h, left - c0 * mcu_w, h, w)
    try:
        return _decode_roi(small, _scaled_box(shifted, sub, scale), fast_idct, scale_num=8 // scale)
    except ValueError as err:  # an MCU size that is not this image's: the box falls outside the small JPEG
        _warn_bad_index(name, str(err))
        return None


_INDEX_GEOMETRY = struct.Struct("<2H2BH")
#: An index's header and entry sizes (``_ext/jpegindex.c``: HEADER_BYTES, ENTRY_BYTES).
_INDEX_HEADER, _INDEX_ENTRY = 32, 10
_STALE_WARNED: list[bool] = []


#: What the index path costs beyond the MCUs it decodes, in MCUs (the small JPEG's assembly and second set-up),
#: and what an MCU parsed to reach a row's first costs against one libjpeg decodes (``benchmarks/results``'s
#: ``jpeg-matrix.json`` is the run they were set by: the index must never make a kind of file slower).
INDEX_OVERHEAD_MCUS, PARSE_COST = 24, 1.5


def _index_geometry(index: bytes) -> tuple[int, int, int, int, int] | None:
    """``(MCUs per row, MCU rows, MCU width, MCU height, K)`` of an index whose length agrees with them, else ``None``.

    K is the MCUs of a row per entry (``jpegindex.c``): a row has ``ceil(per_row / K)`` entries.
    """
    if len(index) < _INDEX_HEADER or index[:4] != b"FDX3":
        return None
    per_row, rows, mcu_w, mcu_h, every = _INDEX_GEOMETRY.unpack_from(index, 4)
    if per_row < 1 or rows < 1 or mcu_w not in (8, 16) or mcu_h not in (8, 16) or not 1 <= every <= per_row:
        return None
    if len(index) != _INDEX_HEADER + (rows * -(-per_row // every) + 1) * _INDEX_ENTRY:
        return None
    return per_row, rows, mcu_w, mcu_h, every


def _warn_bad_index(name: str, why: str) -> None:
    if not _STALE_WARNED:
        _STALE_WARNED.append(True)
        log.warning(
            "lightning_fastdata: the entropy index entry of %r does not match the file (%s): it is decoded "
            "without it, the same pixels at the usual speed (warned once per process). prepare_data() rebuilds an "
            "index whose file list changed; to rebuild it now, delete the index's entropy-* folder in index_dir.",
            os.fsdecode(name),
            why,
        )


def _decode_crop(
    data: bytes,
    box_fn: Callable[[int, int], Box],
    out_hw: tuple[int, int],
    exact: bool = False,
    entropy_index: bytes | None = None,
    name: str = "<bytes>",
) -> torch.Tensor:
    """Pick the cheapest decoder for this crop; return the crop as ``3 x h x w`` uint8 (any strides).

    With ``entropy_index`` (this file's, from
    :func:`~lightning_fastdata.loading.jpeg.entropy_index_build.build_entropy_index`) a JPEG crop is entropy-decoded
    alone rather than with every row above it (the same pixels).

    A crop at least twice the output comes back DCT-scaled (smaller, same content), unless ``exact``. Raises
    ``OSError`` for bad image data (corrupt, truncated, too large); anything else is a bug and propagates.
    """
    is_jpeg = data.startswith(_JPEG_MAGIC)
    read = jpeg_header_box(data, box_fn) if is_jpeg else None
    if read is not None:
        width, height, color_space, box = read
        scale = 1 if exact else _draft_scale(box, out_hw)
        if color_space in _ROI_COLOR_SPACES:  # the crop's rows and columns, at 1 / scale in the DCT domain
            if entropy_index is not None:
                crop = _decode_indexed(data, entropy_index, box, (width, height), scale, not exact, name)
                if crop is not None:
                    return crop
            return _decode_roi(data, _scaled_box(box, (width, height), scale), not exact, scale_num=8 // scale)
        img = _open_image(data)
    else:
        img = _open_image(data)
        box = box_fn(*img.size)
        check_box(box, *img.size)
        scale = 1 if exact else _draft_scale(box, out_hw)
    top, left, h, w = box
    if is_jpeg and img.format == "JPEG" and img.mode in ("RGB", "L"):
        if scale > 1:
            return _decode_draft(img, box, out_hw, scale)
        return _decode_full_jpeg(data, box)
    with image_data_errors():
        rgb = np.array(img.convert("RGB"))
    return torch.from_numpy(rgb).permute(2, 0, 1)[:, top : top + h, left : left + w]


def decode_resized_crop(
    data: bytes,
    out: torch.Tensor,
    box_fn: Callable[[int, int], Box],
    flip: bool = False,
    name: str = "<bytes>",
    exact: bool = False,
    entropy_index: bytes | None = None,
) -> None:
    """Decode ``data`` and write the resized crop ``box_fn(width, height)`` into ``out`` as RGB.

    Thread-safe: each thread decodes into its own scratch memory.

    Args:
        data: The encoded image file's bytes.
        out: A uint8 ``3 x H x W`` tensor (any strides) that receives the result.
        box_fn: Given the full image's width and height, returns the crop box ``(top, left, h, w)``.
        flip: Mirror the result horizontally.
        name: The file name to put in error messages.
        exact: Decode at full size with the exact inverse DCT (the pixels of ``decode_jpeg``, cropped) instead of
            the fast IDCT and, for crops at least twice the output, DCT-domain scaling (see the module notes).
        entropy_index: This file's entropy index, if one was built: the crop is then entropy-decoded alone (the
            same pixels, less work); ``None``: the crop's rows are entropy-decoded from the top of the image.

    Raises:
        OSError: If the image data is corrupt or truncated, or larger than PIL's decompression-bomb limit; the
            message names ``name``. Other errors (a bug, not the file) propagate unchanged.
    """
    try:
        crop = _decode_crop(data, box_fn, (int(out.shape[1]), int(out.shape[2])), exact, entropy_index, name)
    except OSError as err:  # only errors about the image data are OSError here (see _decode_crop)
        why = _IN_MEMORY_FILE.sub("", str(err))  # PIL names our in-memory copy, not the user's file
        raise CorruptImageError(f"Cannot decode image {os.fsdecode(name)!r}: {why}." + CORRUPT_IMAGE_ADVICE) from err
    resize_crop_into(out, crop, flip)


_IN_MEMORY_FILE = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def roi_decode_available() -> bool:
    """Whether the compiled region-of-interest JPEG decoder (``_jpegroi``, libjpeg-turbo) is in use."""
    return _jpegroi is not None


def decode_center_crop(path: str, size: int, crop_fraction: float = 1.0, exact: bool = False) -> np.ndarray:
    """Read ``path`` and return its central crop (``crop_fraction`` of the shorter side) resized to ``size``.

    Returns a ``size x size x 3`` uint8 array (what the HDF5 raw mode and the tensor cache store).

    Raises:
        OSError: If the file cannot be read or decoded; the message names it.
    """
    with open(path, "rb") as f:
        data = f.read()
    return decode_center_crop_bytes(data, path, size, crop_fraction, exact)


def decode_center_crop_bytes(
    data: bytes, name: str, size: int, crop_fraction: float = 1.0, exact: bool = False
) -> np.ndarray:
    """:func:`decode_center_crop` of an image already read (``name``, its path or URL, is for errors)."""
    out = torch.empty((size, size, 3), dtype=torch.uint8)
    box_fn = lambda w, h: center_crop_box(w, h, crop_fraction)  # noqa: E731
    decode_resized_crop(data, out.permute(2, 0, 1), box_fn, name=name, exact=exact)
    return out.numpy()


def pillow_simd_installed() -> bool:
    """Whether the installed PIL is pillow-simd (its versions end in ``.postN``; plain Pillow's do not).

    pillow-simd speeds up PIL's resize and filters, which this package uses for non-JPEG inputs and the
    DCT-domain (``draft``) path; the JPEG decode itself is libjpeg-turbo either way.
    """
    import PIL

    return ".post" in PIL.__version__
