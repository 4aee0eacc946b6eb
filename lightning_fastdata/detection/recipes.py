"""torchvision's detection recipes by their names, as windows an image and its boxes follow.

``"hflip"`` (the reference's default: a horizontal flip, the image at its own size; the model resizes it),
``"multiscale"`` (``RandomShortestSize`` of 480-800 in steps of 32, at most 1333 on the longer side, then the flip),
``"lsj"`` (large-scale jitter: ``ScaleJitter`` to 0.1-2 times a ``1024 x 1024`` fit, the reference's
``FixedSizeCrop`` of ``1024 x 1024`` padded with the mean colour, then the flip), ``"ssd"`` and ``"ssdlite"``
(:mod:`~lightning_fastdata.detection.ssd`: the zoom-out, the IoU crop, the flip and the model's resize to a square as
one window, the photometric distortion after it) and the evaluation (the image as it is). Each sample's numbers come
from its key (``(epoch, index, repeat)``), so an epoch is the same whatever the workers, and a resumed run draws what
the uninterrupted one did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from lightning_fastdata.augment.keyed import uniforms
from lightning_fastdata.detection.ssd import SSD_MEAN, SSDRecipe
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.sources.window import Window

__all__ = [
    "DETECTION_RECIPES",
    "DetectionRecipe",
    "FlipRecipe",
    "SSDRecipe",
    "ScaleJitterRecipe",
    "WholeImage",
    "detection_recipe",
]

DetectionRecipe = Literal["hflip", "multiscale", "lsj", "ssd", "ssdlite"]
#: The recipes ``data_augmentation=`` takes (torchvision's reference's names).
DETECTION_RECIPES = ("hflip", "multiscale", "lsj", "ssd", "ssdlite")
#: The keyed stream of a detection sample's numbers.
_STREAM = 0xDE7
#: The reference's multi-scale shorter sides (480, 512, ..., 800) and longest side.
MULTISCALE = tuple(range(480, 801, 32))
MAX_SIZE = 1333


@dataclass(frozen=True)
class WholeImage:
    """The image as it is (evaluation): no draw, no resize, no flip."""

    def draws(self, seed: int, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """No numbers."""
        return [None] * len(keys)

    def window(self, draws: np.ndarray | None, width: int, height: int, value: Any) -> Window:
        """The whole image, in place."""
        return Window((0, 0, height, width), (0, 0, height, width), (height, width), False)


@dataclass(frozen=True)
class FlipRecipe:
    """A horizontal flip with ``hflip_prob``, after a random shortest-side resize where ``sizes`` are given.

    Attributes:
        hflip_prob: The flip's probability (the reference's 0.5).
        sizes: ``RandomShortestSize``'s shorter sides (one drawn per sample), or ``()``: the image's own size.
        max_size: The longest side's bound with ``sizes``.
    """

    hflip_prob: float = 0.5
    sizes: tuple[int, ...] = ()
    max_size: int | None = None

    def draws(self, seed: int, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """Two numbers a sample: the flip's and the size's."""
        k = torch.tensor([tuple(key) for key in keys], dtype=torch.int64).view(-1, 3)
        return list(uniforms(seed, k, _STREAM, 2).numpy())

    def window(self, draws: np.ndarray | None, width: int, height: int, value: Any) -> Window:
        """The whole image, resized as ``RandomShortestSize`` does (``int`` of the scaled sides), maybe mirrored."""
        assert draws is not None
        out_h, out_w = height, width
        if self.sizes:
            side = self.sizes[min(int(float(draws[1]) * len(self.sizes)), len(self.sizes) - 1)]
            r = side / min(height, width)
            if self.max_size is not None:
                r = min(r, self.max_size / max(height, width))
            out_h, out_w = max(1, int(height * r)), max(1, int(width * r))
        return Window((0, 0, height, width), (0, 0, out_h, out_w), (out_h, out_w), float(draws[0]) < self.hflip_prob)


@dataclass(frozen=True)
class ScaleJitterRecipe:
    """Large-scale jitter (the reference's ``"lsj"``): the scale, the fixed-size crop and its padding, the flip.

    ``ScaleJitter(target_size=(size, size), scale_range)``: the image resized by ``min(size / h, size / w)`` times a
    scale drawn in ``scale_range`` (``int`` of the scaled sides); ``FixedSizeCrop(size, fill)``: a ``size x size``
    part of it where it is larger (one random number places both offsets, as the reference's does), padded on the
    right and bottom with ``fill`` where it is smaller; then the flip of the whole square. The crop's edges are
    rounded to the source's pixels (the boxes follow the window as the pixels do).

    Attributes:
        size: The square's side (the reference's 1024).
        scale_range: The scale's range.
        hflip_prob: The flip's probability.
        fill: The padding's colour (the reference's mean).
    """

    size: int = 1024
    scale_range: tuple[float, float] = (0.1, 2.0)
    hflip_prob: float = 0.5
    fill: tuple[int, int, int] = SSD_MEAN

    def draws(self, seed: int, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """Three numbers a sample: the scale's, the crop's, the flip's."""
        k = torch.tensor([tuple(key) for key in keys], dtype=torch.int64).view(-1, 3)
        return list(uniforms(seed, k, _STREAM + 1, 3).numpy())

    def window(self, draws: np.ndarray | None, width: int, height: int, value: Any) -> Window:
        """The scaled image's ``size x size`` part, padded, maybe mirrored, as one window."""
        assert draws is not None
        lo, hi = self.scale_range
        r = min(self.size / height, self.size / width) * (lo + float(draws[0]) * (hi - lo))
        new_w, new_h = max(1, int(width * r)), max(1, int(height * r))
        out_w, out_h = min(new_w, self.size), min(new_h, self.size)
        u = float(draws[1])
        top, left = int(max(new_h - self.size, 0) * u), int(max(new_w - self.size, 0) * u)
        ry, rx = new_h / height, new_w / width
        sy, sx = min(height - 1, round(top / ry)), min(width - 1, round(left / rx))
        bh, bw = max(1, min(height - sy, round(out_h / ry))), max(1, min(width - sx, round(out_w / rx)))
        flip = float(draws[2]) < self.hflip_prob
        px = self.size - out_w if flip else 0
        return Window((sy, sx, bh, bw), (0, px, out_h, out_w), (self.size, self.size), flip, self.fill)


def detection_recipe(
    name: str, hflip_prob: float = 0.5, image_size: int | None = None
) -> FlipRecipe | SSDRecipe | ScaleJitterRecipe:
    """The training recipe of torchvision's detection reference named ``name`` (module docstring).

    ``image_size``: the output square of the square recipes (``None``: lsj's 1024, the SSD models' 300 and 320).

    Raises:
        ValueError: For a name not in :data:`DETECTION_RECIPES`.
    """
    if name == "hflip":
        return FlipRecipe(hflip_prob)
    if name == "multiscale":
        return FlipRecipe(hflip_prob, MULTISCALE, MAX_SIZE)
    if name == "lsj":
        return ScaleJitterRecipe(image_size or 1024, hflip_prob=hflip_prob)
    if name == "ssd":
        return SSDRecipe(image_size or 300, hflip_prob=hflip_prob)
    if name == "ssdlite":
        return SSDRecipe(image_size or 320, zoom_out=False, distort=False, hflip_prob=hflip_prob)
    raise InvalidValueError(
        f"data_augmentation should be one of {', '.join(map(repr, DETECTION_RECIPES))} (torchvision's detection "
        f"reference's names), got {name!r}."
    )
