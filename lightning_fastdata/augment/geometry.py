"""Crop geometry: where a crop lies in an image (random resized, centre) and resizing a crop into a batch slot.

Every random number of a crop and its flip comes from the sample's key (:func:`crop_draws`, the scheme of
:mod:`~lightning_fastdata.augment.keyed` that the policies, erasing and mixing use too), so a sample's crop does
not depend on the worker, the batch it is in, or where a run resumed.

The decoder (``loading/jpeg/decode.py``) asks for a box once it knows an image's size and decodes only that box; the
tensor cache's device crop (:mod:`~lightning_fastdata.augment.crop`) takes the same boxes from its workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from lightning_fastdata.augment.keyed import uniforms

__all__ = [
    "CROP_DRAWS",
    "Box",
    "center_crop_box",
    "crop_draws",
    "flip_of",
    "random_resized_crop_box",
    "resize_crop_into",
]

#: A crop in full-resolution pixel coordinates, ``(top, left, height, width)``.
Box = tuple[int, int, int, int]

#: The keyed stream of the crop and flip (each draw has its own: adding one changes no other's numbers).
CROP_STREAM = 0x7C0
#: torchvision's ``RandomResizedCrop.get_params`` tries ten boxes before it falls back to the centre.
CROP_TRIES = 10
#: Numbers per sample: the flip, then four per try.
CROP_DRAWS = 1 + 4 * CROP_TRIES


def crop_draws(seed: int, keys: Sequence[Sequence[int]]) -> np.ndarray:
    """Each sample's crop-and-flip numbers: ``len(keys) x CROP_DRAWS`` floats in ``[0, 1)``, from its key alone.

    The same keyed scheme (:func:`~lightning_fastdata.augment.keyed.uniforms`) as every other draw, on its own
    stream: the flip first, then four numbers for each of torchvision's ten tries (area, log aspect, top, left).

    Args:
        seed: The DataModule's seed.
        keys: ``(epoch, index, repeat)`` per sample.
    """
    k = torch.tensor([tuple(key) for key in keys], dtype=torch.int64).view(-1, 3)
    return uniforms(seed, k, CROP_STREAM, CROP_DRAWS).numpy()


def flip_of(draws: Sequence[float] | np.ndarray) -> bool:
    """Whether a sample is mirrored (probability 0.5), from its :func:`crop_draws` row."""
    return bool(draws[0] < 0.5)


def random_resized_crop_box(
    draws: Sequence[float] | np.ndarray,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """A crop as ``torchvision.transforms.RandomResizedCrop.get_params`` makes it, from a :func:`crop_draws` row.

    torchvision's algorithm, try by try (the area and the log aspect uniform in their ranges, the first try that
    fits wins; the centre crop clamped to ``ratio`` if none does), with each try's four numbers taken from
    ``draws`` instead of torch's generator. ``draws`` may be any ``CROP_DRAWS`` numbers in ``[0, 1)`` (e.g.
    ``rng.random(CROP_DRAWS)`` where a generator is wanted).
    """
    if len(draws) < CROP_DRAWS:
        raise ValueError(f"random_resized_crop_box needs {CROP_DRAWS} draws, got {len(draws)}.")
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for t in range(CROP_TRIES):
        u_area, u_aspect, u_top, u_left = (float(x) for x in draws[1 + 4 * t : 5 + 4 * t])
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u_aspect)
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(u_top * (height - h + 1)), int(u_left * (width - w + 1)), h, w
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
