"""Crop geometry: where a crop lies in an image (random resized, centre) and resizing a crop into a batch slot.

The decoder (``loading/jpeg/decode.py``) asks for a box once it knows an image's size and decodes only that box; the
tensor cache's device crop (:mod:`~lightning_fastdata.augment.crop`) takes the same boxes from its workers.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["Box", "center_crop_box", "random_resized_crop_box", "resize_crop_into"]

#: A crop in full-resolution pixel coordinates, ``(top, left, height, width)``.
Box = tuple[int, int, int, int]


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


def resize_crop_into(out: torch.Tensor, chw: torch.Tensor, flip: bool = False) -> None:
    """Resize a ``3 x h x w`` crop (uint8 or float) into ``out`` (``3 x H x W``), flipping if asked."""
    if tuple(chw.shape[1:]) != tuple(out.shape[1:]):
        # torch's uint8 antialiased kernel is vectorised for channels-last input; planar input is 2x slower.
        x = chw.unsqueeze(0).contiguous(memory_format=torch.channels_last)
        chw = F.interpolate(x, size=tuple(out.shape[1:]), mode="bilinear", antialias=True)[0]
    out.copy_(chw.flip(-1) if flip else chw)
