"""torchvision's SSD recipes (its detection reference's ``"ssd"`` and ``"ssdlite"`` presets) as one keyed window.

The reference chains, per sample, ``RandomPhotometricDistort``, ``RandomZoomOut`` (the image placed at a random
spot of a canvas 1-4 times its size, filled with the mean colour ``(123, 117, 104)``, half the time),
``RandomIoUCrop`` (SSD's crop: an option of minimum IoU drawn from ``0, .1, .3, .5, .7, .9`` or "as it is", then up
to 40 crops of 0.3-1 of each side and aspect 0.5-2 tried until one holds a box's centre and a box of that IoU; the
boxes whose centre falls outside are dropped) and ``RandomHorizontalFlip``; the SSD model then resizes to a
``300 x 300`` square (SSDlite: ``320 x 320``, no distortion, no zoom-out). Here the zoom-out, the crop, the flip and
the resize are one :class:`~lightning_fastdata.sources.window.Window`: the part of the image inside the crop is
decoded alone, straight to its place in the square, the rest is the fill; the boxes follow the same map. Every draw
comes from the sample's key (the crop's trials from a generator seeded by one of its numbers), so an epoch is the
same whatever the workers and a resumed run draws what the uninterrupted one did.

Where it differs from the reference, by design: the distortion runs after the window, on the image's pixels in the
square (the fill is left the mean, as the reference leaves it), so contrast's mean is the crop's, not the whole
image's; boxes under one pixel are dropped in the square's pixels (the reference: before the model's resize).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from lightning_fastdata.augment.kernels import adjust_hue
from lightning_fastdata.augment.keyed import uniforms
from lightning_fastdata.augment.worker import adjust_brightness, adjust_contrast
from lightning_fastdata.sources.window import Window

__all__ = ["SSD_MEAN", "SSDRecipe", "iou_crop", "photometric_distort"]

#: The reference's fill of the zoom-out (the mean colour of ImageNet in 0-255).
SSD_MEAN = (123, 117, 104)
#: The keyed stream of an SSD sample's numbers, and how many it draws.
_STREAM, _DRAWS = 0x55D, 18
#: ``RandomIoUCrop``'s minimum-IoU options (1.0: the image as it is) and trials per option.
IOU_OPTIONS, TRIALS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0), 40
#: A bound on the options drawn (the reference draws until one succeeds; "as it is" ends it 1 time in 7).
MAX_ROUNDS = 1000
#: The six orders of the three channels (``RandomPhotometricDistort``'s permutation, one drawn).
_PERMUTATIONS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))


def iou_crop(boxes: np.ndarray, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """``RandomIoUCrop``'s crop ``(left, top, width, height)`` of a ``width x height`` image, or ``None`` (as it is).

    ``boxes``: XYXY in the image's pixels. An option's 40 trials are drawn together and the first that holds its
    rules is taken (the reference's order). An image without boxes is left as it is (the reference draws options
    until "as it is" comes up: the same result); after ``MAX_ROUNDS`` options, likewise.
    """
    if not len(boxes):
        return None
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for _ in range(MAX_ROUNDS):
        least = IOU_OPTIONS[int(rng.integers(len(IOU_OPTIONS)))]
        if least >= 1.0:
            return None
        u = rng.random((TRIALS, 4))
        new_w = (width * (0.3 + 0.7 * u[:, 0])).astype(np.int64)
        new_h = (height * (0.3 + 0.7 * u[:, 1])).astype(np.int64)
        left = ((width - new_w) * u[:, 2]).astype(np.int64)
        top = ((height - new_h) * u[:, 3]).astype(np.int64)
        shaped = (new_w > 0) & (new_h > 0)
        aspect = new_w / np.maximum(new_h, 1)
        shaped &= (aspect >= 0.5) & (aspect <= 2.0)
        right, bottom = (left + new_w)[:, None], (top + new_h)[:, None]
        within = (left[:, None] < cx) & (cx < right) & (top[:, None] < cy) & (cy < bottom)  # trials x boxes
        inter = np.clip(np.minimum(boxes[:, 2], right) - np.maximum(boxes[:, 0], left[:, None]), 0, None) * np.clip(
            np.minimum(boxes[:, 3], bottom) - np.maximum(boxes[:, 1], top[:, None]), 0, None
        )
        iou = inter / (areas + (new_w * new_h)[:, None] - inter)
        good = shaped & within.any(axis=1) & (np.where(within, iou, -1.0).max(axis=1) >= least)
        if good.any():
            k = int(np.argmax(good))
            return int(left[k]), int(top[k]), int(new_w[k]), int(new_h[k])
    return None


def photometric_distort(draws: np.ndarray, pixels: torch.Tensor) -> torch.Tensor:
    """``RandomPhotometricDistort`` (its defaults, each step with probability 0.5) of ``3 x h x w`` uint8 pixels.

    ``draws``: ten numbers in ``[0, 1)``: brightness (apply, factor in 0.875-1.125), contrast (apply, factor in
    0.5-1.5, before or after saturation and hue), saturation (apply, 0.5-1.5), hue (apply, -0.05-0.05), the channels'
    permutation (apply, which). torchvision's pixels bit for bit, brightness and contrast by a lookup of its own
    arithmetic on the 256 levels, hue by a compiled kernel of its float32 arithmetic
    (``augment/kernels.py``' ``adjust_hue``).
    """
    u = [float(v) for v in draws]
    out = pixels
    if u[0] < 0.5:
        out = adjust_brightness(out, 0.875 + 0.25 * u[1])
    contrast, before = (0.5 + u[3]) if u[2] < 0.5 else None, u[4] < 0.5
    if contrast is not None and before:
        out = adjust_contrast(out, contrast)
    if u[5] < 0.5:
        out = F.adjust_saturation(out, 0.5 + u[6])
    if u[7] < 0.5:
        out = adjust_hue(out, -0.05 + 0.1 * u[8])
    if contrast is not None and not before:
        out = adjust_contrast(out, contrast)
    if u[9] < 0.5:
        out = F.permute_channels(out, list(_PERMUTATIONS[min(int(u[10] * 6), 5)]))
    return out


def _axis(start: int, length: int, crop_start: int, crop_length: int, out: int) -> tuple[int, int, int, int]:
    """One axis: the image's part inside the crop (source start, extent) and its place in the output (start, extent).

    ``start, length``: the image on the canvas; ``crop_start, crop_length``: the crop on the canvas.
    """
    lo, hi = max(start, crop_start), min(start + length, crop_start + crop_length)
    scale = out / crop_length
    a, b = round((lo - crop_start) * scale), round((hi - crop_start) * scale)
    return lo - start, hi - lo, a, max(1, b - a)


@dataclass(frozen=True)
class SSDRecipe:
    """The SSD presets (module docstring) as a :class:`~lightning_fastdata.sources.window.WindowRecipe`.

    Attributes:
        size: The output square's side (SSD300: 300; SSDlite320: 320).
        zoom_out: ``RandomZoomOut`` onto ``fill`` (sides 1-4 times the image's), half the time.
        distort: ``RandomPhotometricDistort`` of the image's pixels.
        hflip_prob: The flip's probability.
        fill: The zoom-out's colour.
    """

    size: int = 300
    zoom_out: bool = True
    distort: bool = True
    hflip_prob: float = 0.5
    fill: tuple[int, int, int] = SSD_MEAN

    def draws(self, seed: int, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """Eighteen numbers a sample: the zoom-out's four, the flip's, the crop's generator seed, the distortion's."""
        k = torch.tensor([tuple(key) for key in keys], dtype=torch.int64).view(-1, 3)
        return list(uniforms(seed, k, _STREAM, _DRAWS).numpy())

    def window(self, draws: np.ndarray | None, width: int, height: int, value: Any) -> Window:
        """The zoom-out, the IoU crop (by ``value``'s boxes), the flip and the resize to the square, as one window."""
        assert draws is not None
        u = [float(v) for v in draws]
        cw, ch, left, top = width, height, 0, 0  # the canvas, and the image's place on it
        if self.zoom_out and u[0] < 0.5:
            r = 1.0 + 3.0 * u[1]
            cw, ch = int(width * r), int(height * r)
            left, top = int((cw - width) * u[2]), int((ch - height) * u[3])
        boxes = np.asarray(value["boxes"], np.float64).reshape(-1, 4) + [left, top, left, top]
        crop = iou_crop(boxes, cw, ch, np.random.default_rng(int(u[5] * 2**53)))
        cl, ct, cwid, chei = crop if crop is not None else (0, 0, cw, ch)
        sx, bw, px, pw = _axis(left, width, cl, cwid, self.size)
        sy, bh, py, ph = _axis(top, height, ct, chei, self.size)
        flip = u[4] < self.hflip_prob
        if flip:  # the square mirrored: the image's part lands on the other side, mirrored
            px = self.size - px - pw
        fill = self.fill if self.zoom_out else (0, 0, 0)
        return Window((sy, sx, bh, bw), (py, px, ph, pw), (self.size, self.size), flip, fill, crop is not None)

    def paint(self, draws: np.ndarray | None, pixels: torch.Tensor) -> torch.Tensor:
        """The photometric distortion of the image's pixels (where the recipe has it), else the pixels."""
        if not self.distort or draws is None:
            return pixels
        return photometric_distort(np.asarray(draws)[6:17], pixels)
