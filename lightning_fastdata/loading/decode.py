"""Decode an encoded image straight into a resized crop, spending as little as the crop allows.

Measured on this project's 2-core machine (photo-like 500x375 JPEGs, one core, see ``benchmarks/``):
``torchvision.io.decode_jpeg`` decodes ~15% faster than PIL's ``open().convert()``, and torch's uint8
antialiased bilinear resize on a channels-last tensor is ~3x faster than PIL's ``resize`` (6,200 vs 1,900
crops/s for 300->224). So JPEGs go through ``decode_jpeg`` and torch's resize, except when the crop is at
least twice the output size: then PIL's ``draft`` decodes at 1/2, 1/4 or 1/8 scale in the DCT domain,
which is cheaper than any full decode. Other formats, and JPEG modes ``decode_jpeg`` cannot convert
exactly as PIL does (CMYK, YCCK), go through PIL's ``convert("RGB")``, as torchvision's ``ImageFolder`` does.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

__all__ = ["Box", "center_crop_box", "decode_resized_crop", "pillow_simd_installed", "random_resized_crop_box"]

#: A crop in full-resolution pixel coordinates: ``(top, left, height, width)``.
Box = tuple[int, int, int, int]

_JPEG_MAGIC = b"\xff\xd8\xff"


def random_resized_crop_box(
    rng: np.random.Generator,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """Sample a crop as ``torchvision.transforms.RandomResizedCrop.get_params`` does, from ``rng``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop_box(width: int, height: int, crop_fraction: float = 0.875) -> Box:
    """Return the box of ``Resize(round(S / crop_fraction)) + CenterCrop(S)`` in original pixels.

    The classic evaluation transform resizes the shorter side to ``S / 0.875`` (256 for 224) and takes the
    central ``S x S``; that is the central square of side ``crop_fraction * min(width, height)``.
    """
    side = max(1, int(round(min(width, height) * crop_fraction)))
    return (height - side) // 2, (width - side) // 2, side, side


def _resize_into(out: torch.Tensor, chw: torch.Tensor, flip: bool) -> None:
    """Resize a uint8 ``3 x h x w`` crop into ``out`` (``3 x H x W``), flipping horizontally if asked."""
    if tuple(chw.shape[1:]) != tuple(out.shape[1:]):
        # torch's uint8 antialiased kernel is vectorised for channels-last input; planar input is 2x slower.
        x = chw.unsqueeze(0).contiguous(memory_format=torch.channels_last)
        chw = F.interpolate(x, size=tuple(out.shape[1:]), mode="bilinear", antialias=True)[0]
    out.copy_(chw.flip(-1) if flip else chw)


def _draft_scale(box: Box, out_hw: tuple[int, int]) -> int:
    """Largest DCT reduction (1, 2, 4 or 8) that keeps the crop at least as large as the output."""
    factor = min(box[2] // out_hw[0], box[3] // out_hw[1])
    return next((s for s in (8, 4, 2) if factor >= s), 1)


def decode_resized_crop(
    data: bytes,
    out: torch.Tensor,
    box_fn: Callable[[int, int], Box],
    flip: bool = False,
    name: str = "<bytes>",
) -> None:
    """Decode ``data`` and write the resized crop ``box_fn(width, height)`` into ``out`` as RGB.

    Args:
        data: The encoded image file's bytes.
        out: A uint8 ``3 x H x W`` tensor (any strides) that receives the result.
        box_fn: Given the full image's width and height, returns the crop box ``(top, left, h, w)``.
        flip: Mirror the result horizontally.
        name: The file name to put in error messages.

    Raises:
        OSError: If the image is corrupt or truncated; the message names ``name``.
    """
    out_hw = (int(out.shape[1]), int(out.shape[2]))
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        box = box_fn(width, height)
        top, left, h, w = box
        if img.format == "JPEG" and img.mode in ("RGB", "L") and data.startswith(_JPEG_MAGIC):
            scale = _draft_scale(box, out_hw)
            if scale > 1:
                # Decoded at 1/scale in the DCT domain: reduced pixel i covers full pixels [i*scale, (i+1)*scale).
                img.draft("RGB", (width // scale, height // scale))
                reduced = img.convert("RGB")
                fbox = (left / scale, top / scale, (left + w) / scale, (top + h) / scale)
                # The reduced image is small, so PIL's resize (which takes a sub-pixel box) costs little here.
                small = reduced.resize((out_hw[1], out_hw[0]), Image.Resampling.BILINEAR, box=fbox)
                chw = torch.from_numpy(np.array(small)).permute(2, 0, 1)
                top, left, h, w = 0, 0, out_hw[0], out_hw[1]
            else:
                from torchvision.io import ImageReadMode, decode_jpeg

                raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                with warnings.catch_warnings():
                    # torchvision 0.29 deprecates its decoders in favour of torchcodec; still the fastest here.
                    warnings.simplefilter("ignore", DeprecationWarning)
                    chw = decode_jpeg(raw, mode=ImageReadMode.RGB)
        else:
            chw = torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)
    except (OSError, RuntimeError, ValueError, SyntaxError, EOFError) as err:  # PIL's, libjpeg's, torchvision's
        raise OSError(
            f"Cannot decode image {name!r}: {err}. The file is corrupt or truncated: replace or delete it, or "
            "pass on_corrupt='skip' to skip such files (each is logged and counted)."
        ) from err
    _resize_into(out, chw[:, top : top + h, left : left + w], flip)


def pillow_simd_installed() -> bool:
    """Whether the installed PIL is pillow-simd (its versions end in ``.postN``; plain Pillow's do not).

    pillow-simd speeds up PIL's resize and filters, which this package uses for non-JPEG inputs and the
    DCT-domain (``draft``) path; the JPEG decode itself is libjpeg-turbo either way.
    """
    import PIL

    return ".post" in PIL.__version__
