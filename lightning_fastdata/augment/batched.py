"""Per-sample augmentation policies for a whole batch on the training device, drawn from the samples' keys.

:class:`TrivialAugmentWide` and :class:`RandAugment` are torchvision's v2 policies (their op tables are read from
torchvision itself, so the magnitudes are its magnitudes) with one difference that is the point: torchvision's
transform applied to a batch applies *one* op with *one* magnitude to every image; these draw an op and a magnitude
for each sample, as torchvision does when it runs once per image in a loader worker, and apply them to the whole
batch at once with :mod:`~lightning_fastdata.augment.ops`. :class:`RandomErasing` likewise erases one box
per sample. Every draw is a function of ``(seed, epoch, index, repeat)``
(:func:`~lightning_fastdata.augment.keyed.uniforms`): the same on a CPU and a GPU, with any worker count,
and after a resume.

Each policy is a ``torch.nn.Module`` whose ``forward(images, keys, seed)`` returns the augmented batch; the
DataModules call them (``device_transforms`` before normalisation on uint8, ``batch_transforms`` after it).
:func:`to_batched` turns a user's torchvision object (``v2.TrivialAugmentWide()``, ``v2.RandAugment()``,
``v2.RandomErasing()``) into its per-sample twin with the same arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torchvision.transforms import v2

import lightning_fastdata.augment.graphed.static as static
import lightning_fastdata.augment.ops as ops
import lightning_fastdata.augment.torchvision_internals as tv
from lightning_fastdata.augment.keyed import uniforms
from lightning_fastdata.errors import InvalidValueError

__all__ = ["ColorJitter", "KeyedTransform", "RandAugment", "RandomErasing", "TrivialAugmentWide", "to_batched"]


class KeyedTransform(nn.Module):
    """A batch transform whose randomness comes from the samples' keys: ``forward(images, keys, seed)``."""

    #: A distinct stream of random numbers per policy (two policies in one pipeline draw independently).
    stream = 0

    def to_torchvision(self) -> nn.Module:  # pragma: no cover
        """Torchvision's per-image transform this one batches (what a torchvision loader of the recipe runs)."""
        raise NotImplementedError

    def forward(self, images: torch.Tensor, keys: torch.Tensor, seed: int) -> torch.Tensor:  # pragma: no cover
        """Return the augmented ``images``."""
        raise NotImplementedError


def _interpolation(value: Any) -> str:
    mode = getattr(value, "value", value)
    if mode not in ("nearest", "bilinear"):
        raise InvalidValueError(f"interpolation should be 'nearest' or 'bilinear' on the device, got {value!r}.")
    return str(mode)


def _fill(value: Any) -> float | None:
    if isinstance(value, dict):  # torchvision's per-type fill mapping
        value = next(iter(value.values()), None)
    if isinstance(value, (list, tuple)):
        if len(set(value)) > 1:
            raise InvalidValueError(f"fill should be one value for all channels on the device, got {value!r}.")
        value = value[0] if value else None
    return None if value is None else float(value)


def _apply_op(name: str, images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Torchvision's ``_apply_image_or_video_transform`` for one op, a magnitude per sample (float64, CPU).

    The geometric ops (:data:`_WARPS`) are not here: :func:`_apply_warps` does all of them in one warp.
    """
    if name == "Identity":
        return images
    if name == "Brightness":
        return ops.adjust_brightness(images, 1.0 + magnitude)
    if name == "Color":
        return ops.adjust_saturation(images, 1.0 + magnitude)
    if name == "Contrast":
        return ops.adjust_contrast(images, 1.0 + magnitude)
    if name == "Sharpness":
        return ops.adjust_sharpness(images, 1.0 + magnitude)
    if name == "Posterize":
        return ops.posterize(images, magnitude.to(torch.int64))
    if name == "Solarize":
        return ops.solarize(images, 255.0 * magnitude)
    if name == "AutoContrast":
        return ops.autocontrast(images)
    if name == "Equalize":
        return ops.equalize(images)
    if name == "Invert":
        return 255 - images
    raise InvalidValueError(f"No batched op for {name!r}.")


#: The policies' geometric ops: one affine warp for all their samples (a parameter set each), not one per op.
_WARPS = static.WARPS

#: Every op a policy can apply on the batch (:func:`_apply_op` and :func:`_apply_warps`).
BATCHED_OPS = frozenset(
    _WARPS
    + ("Identity", "Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast")
    + ("Equalize", "Invert")
)


def _apply_warps(
    names: Sequence[str], images: torch.Tensor, magnitude: torch.Tensor, fill: float | None, mode: str
) -> torch.Tensor:
    """Torchvision's ``ShearX``/``ShearY``/``TranslateX``/``TranslateY``/``Rotate``, each sample its own (``names``).

    Each sample's parameters as torchvision's op gives them (float64, host), all in one ``affine``: its host-side
    set-up and its warp launched once per batch instead of once per op.
    """
    h, w = images.shape[-2:]
    angle, translate, shear, center, turn, rotating = static.warp_parameters(names, magnitude, h, w)
    out = ops.affine(images, angle, translate, shear, center, fill, mode)
    return ops.quarter_turns(images, out, turn, rotating)


def _apply_grouped(
    images: torch.Tensor, groups: Sequence[Any], apply: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor | None]
) -> torch.Tensor:
    """One op per group of samples: ``apply(group, images[rows], rows)`` for each group in ``groups`` (one per sample).

    ``rows`` are the group's samples (CPU int64); ``apply`` returns their new images, or ``None`` to leave them.
    Every group reads the input batch, not another group's output; the result is a new batch.
    """
    out = images.clone()
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    # every group's rows in one tensor, on the device in one copy; each group reads its slice (a view: no launch)
    every = torch.tensor([i for rows in members.values() for i in rows], dtype=torch.int64)
    on_device = ops.to_device(every, images.device)
    start = 0
    for group, rows in members.items():
        stop = start + len(rows)
        idx = on_device[start:stop]
        new = apply(group, images[idx], every[start:stop])
        if new is not None:
            out[idx] = new
        start = stop
    return out


class _Policy(KeyedTransform):
    """``num_ops`` ops in turn, each drawn per sample from ``space`` (torchvision's table for the policy)."""

    space: dict[str, tuple[Callable[[int, int, int], torch.Tensor | None], bool]] = {}
    num_ops = 1
    num_magnitude_bins = 31
    magnitude: int | None = None  # None: a random bin per sample (TrivialAugment); else this bin (RandAugment)
    #: How a round is applied: ``"grouped"`` (each op to the samples that drew it: the fewest pixels touched, the
    #: CPU's path) or ``"static"`` (every op over the whole batch, identities elsewhere: the same pixels with a fixed
    #: sequence of ops and shapes, :mod:`~lightning_fastdata.augment.graphed.static`, for a CUDA graph).
    shapes = "grouped"

    def __init__(self, interpolation: str, fill: Any) -> None:
        super().__init__()
        if not self.space:
            raise InvalidValueError(
                f"{type(self).__name__} on the device draws from torchvision's table of ops and magnitudes, which "
                f"this torchvision lacks ({', '.join(tv.MISSING)}); give torchvision's own policy to train_transforms "
                "(it runs per sample in the loader workers) instead."
            )
        unknown = sorted(set(self.space) - BATCHED_OPS)
        if unknown:
            raise InvalidValueError(
                f"{type(self).__name__}'s table of ops (torchvision's) holds {unknown}, which have no batched op on "
                "the device; give torchvision's own policy to train_transforms (it runs per sample in the loader "
                "workers) instead."
            )
        self.interpolation = _interpolation(interpolation)
        self.fill = _fill(fill)
        self._tables: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each op's magnitude per bin (a row per op of ``space``, float64; zeros for an op without), and signed.

        torchvision's float32 tables read as Python floats, as it reads them; built once per image size.
        """
        key = (self.num_magnitude_bins, height, width)
        if key not in self._tables:
            rows, signs = [], []
            for table, signed in self.space.values():
                values = table(self.num_magnitude_bins, height, width)
                zeros = torch.zeros(self.num_magnitude_bins, dtype=torch.float64)
                rows.append(zeros if values is None else values.to(torch.float64))
                signs.append(bool(signed) and values is not None)
            self._tables[key] = (torch.stack(rows), torch.tensor(signs))
        return self._tables[key]

    def params(self, keys: torch.Tensor, seed: int, height: int, width: int) -> list[tuple[list[str], torch.Tensor]]:
        """Per op round: each sample's op name and signed magnitude (float64, CPU), as torchvision would draw them."""
        names = list(self.space)
        u = uniforms(seed, keys.cpu(), self.stream, 3 * self.num_ops)
        table, signed = self._table(height, width)
        rounds = []
        for r in range(self.num_ops):  # a handful of ops on N numbers per round, whatever N (host time per batch)
            choice = (u[:, 3 * r] * len(names)).long().clamp_(max=len(names) - 1)
            bins = (u[:, 3 * r + 1] * self.num_magnitude_bins).long().clamp_(max=self.num_magnitude_bins - 1)
            if self.magnitude is not None:
                bins.fill_(self.magnitude)
            negative = signed[choice] & (u[:, 3 * r + 2] <= 0.5)
            magnitude = table[choice, bins]
            rounds.append(([names[c] for c in choice.tolist()], torch.where(negative, -magnitude, magnitude)))
        return rounds

    def forward(self, images: torch.Tensor, keys: torch.Tensor, seed: int) -> torch.Tensor:
        """Apply each sample's drawn op(s) to the uint8 batch (grouped by op, one batched call per op)."""
        if images.dtype != torch.uint8:
            raise InvalidValueError(
                f"{type(self).__name__} runs on uint8 batches (before normalisation), got {images.dtype}."
            )
        height, width = images.shape[-2:]
        for op_names, magnitude in self.params(keys, seed, height, width):
            if self.shapes == "static":
                images = static.apply_round(images, op_names, magnitude, self.fill, self.interpolation)
            else:
                images = self._apply_round_grouped(op_names, magnitude, images)
        return images

    def _apply_round_grouped(self, op_names: list[str], magnitude: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """One round: each sample's op (``op_names``, signed ``magnitude``) applied to the samples that drew it."""

        def apply(name: str, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            if name == "warp":
                picked = [op_names[i] for i in rows.tolist()]
                return _apply_warps(picked, x, magnitude[rows], self.fill, self.interpolation)
            return _apply_op(name, x, magnitude[rows])

        return _apply_grouped(images, ["warp" if n in _WARPS else n for n in op_names], apply)


class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide`` with an op and a magnitude drawn per sample, on the whole batch.

    Args:
        num_magnitude_bins: As torchvision's (31).
        interpolation: ``"nearest"`` (default, as torchvision's) or ``"bilinear"``.
        fill: Value outside a warped image; ``None`` is black.
    """

    space = tv.augmentation_space(v2.TrivialAugmentWide) or {}
    stream = 0x7A1

    def __init__(self, num_magnitude_bins: int = 31, interpolation: str = "nearest", fill: float | None = None) -> None:
        super().__init__(interpolation, fill)
        if num_magnitude_bins < 2:
            raise InvalidValueError(f"num_magnitude_bins should be at least 2, got {num_magnitude_bins!r}.")
        self.num_magnitude_bins = num_magnitude_bins

    def to_torchvision(self) -> nn.Module:
        """``v2.TrivialAugmentWide`` with the same arguments."""
        return v2.TrivialAugmentWide(self.num_magnitude_bins, v2.InterpolationMode(self.interpolation), self.fill)


class RandAugment(_Policy):
    """torchvision's ``RandAugment``: ``num_ops`` ops per sample, each drawn per sample, at bin ``magnitude``.

    Args:
        num_ops: Ops applied in turn to each sample (2).
        magnitude: The magnitude bin (9 of 31).
        num_magnitude_bins: As torchvision's (31).
        interpolation: ``"nearest"`` (default) or ``"bilinear"``.
        fill: Value outside a warped image; ``None`` is black.
    """

    space = tv.augmentation_space(v2.RandAugment) or {}
    stream = 0x7A2

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: str = "nearest",
        fill: float | None = None,
    ) -> None:
        super().__init__(interpolation, fill)
        if num_ops < 1 or not 0 <= magnitude < num_magnitude_bins:
            raise InvalidValueError(
                f"RandAugment needs num_ops >= 1 and 0 <= magnitude < num_magnitude_bins, got num_ops={num_ops!r}, "
                f"magnitude={magnitude!r}, num_magnitude_bins={num_magnitude_bins!r}."
            )
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, magnitude, num_magnitude_bins

    def to_torchvision(self) -> nn.Module:
        """``v2.RandAugment`` with the same arguments."""
        mode = v2.InterpolationMode(self.interpolation)
        return v2.RandAugment(self.num_ops, int(self.magnitude or 0), self.num_magnitude_bins, mode, self.fill)


def _jitter_range(
    value: float | tuple[float, float] | None, name: str, center: float, bound: float
) -> tuple[float, float] | None:
    """Torchvision's ``ColorJitter._check_input``: a number ``v`` means ``[center - v, center + v]``."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        if value < 0:
            raise InvalidValueError(f"If {name} is a single number, it must be non negative, got {value!r}.")
        low, high = center - float(value), center + float(value)
        if name != "hue":
            low = max(low, 0.0)
    else:
        low, high = float(value[0]), float(value[1])
    if not (-bound if name == "hue" else 0.0) <= low <= high <= (bound if name == "hue" else math.inf):
        raise InvalidValueError(
            f"{name} values should be between {(-bound, bound) if name == 'hue' else '0 and inf'}, got {value!r}."
        )
    return None if low == high == center else (low, high)


class ColorJitter(KeyedTransform):
    """torchvision's ``ColorJitter`` with its own order of the four adjustments and its own factors per sample.

    Args:
        brightness: How much to jitter brightness: a number ``b`` (factor in ``[max(0, 1 - b), 1 + b]``) or a range.
        contrast: The same for contrast.
        saturation: The same for saturation.
        hue: A number ``h`` in ``[0, 0.5]`` (shift in ``[-h, h]``) or a range within ``[-0.5, 0.5]``.
    """

    stream = 0x7A4

    def __init__(
        self,
        brightness: float | tuple[float, float] | None = None,
        contrast: float | tuple[float, float] | None = None,
        saturation: float | tuple[float, float] | None = None,
        hue: float | tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.brightness = _jitter_range(brightness, "brightness", 1.0, 0.0)
        self.contrast = _jitter_range(contrast, "contrast", 1.0, 0.0)
        self.saturation = _jitter_range(saturation, "saturation", 1.0, 0.0)
        self.hue = _jitter_range(hue, "hue", 0.0, 0.5)

    def to_torchvision(self) -> nn.Module:
        """``v2.ColorJitter`` with the same ranges."""
        return v2.ColorJitter(self.brightness, self.contrast, self.saturation, self.hue)

    def params(self, keys: torch.Tensor, seed: int) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Each sample's order of the four adjustments (``N x 4``) and their factors (``None``: not jittered)."""
        u = uniforms(seed, keys.cpu(), self.stream, 8)
        order = torch.argsort(u[:, :4], dim=1)  # a uniformly random permutation per sample
        factors: list[torch.Tensor | None] = []
        for k, span in enumerate((self.brightness, self.contrast, self.saturation, self.hue)):
            factors.append(None if span is None else span[0] + (span[1] - span[0]) * u[:, 4 + k])
        return order, factors

    def forward(self, images: torch.Tensor, keys: torch.Tensor, seed: int) -> torch.Tensor:
        """Apply each sample's adjustments in its order."""
        if images.dtype != torch.uint8:
            raise InvalidValueError(f"ColorJitter runs on uint8 batches (device_transforms), got {images.dtype}.")
        order, factors = self.params(keys, seed)
        fns = (ops.adjust_brightness, ops.adjust_contrast, ops.adjust_saturation, ops.adjust_hue)

        def adjust(k: int, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
            factor = factors[k]
            return None if factor is None else fns[k](x, factor[rows])

        for position in range(4):
            images = _apply_grouped(images, order[:, position].tolist(), adjust)
        return images


class RandomErasing(KeyedTransform):
    """torchvision's ``RandomErasing``, one box (or none) drawn per sample; on normalised float or uint8 batches.

    The box is drawn as torchvision draws it: up to 10 tries of an area in ``scale`` and an aspect ratio in
    ``ratio`` (log-uniform), the first that fits wins, none: nothing erased.

    Args:
        p: Probability that a sample is erased.
        scale: Area range of the box, as a fraction of the image.
        ratio: Aspect-ratio range of the box.
        value: Fill value (0: the mean colour after normalisation, as torchvision's recipe applies it).
        inplace: Erase in the given batch instead of a copy (as torchvision's ``inplace``).
    """

    stream = 0x7A3
    tries = 10

    def __init__(
        self,
        p: float = 0.5,
        scale: tuple[float, float] = (0.02, 0.33),
        ratio: tuple[float, float] = (0.3, 3.3),
        value: float = 0.0,
        inplace: bool = False,
    ) -> None:
        super().__init__()
        if not 0 <= p <= 1:
            raise InvalidValueError(f"p should be a probability in [0, 1], got {p!r}.")
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise InvalidValueError(
                f"scale should be in (0, 1] and ratio positive, got scale={scale!r}, ratio={ratio!r}."
            )
        if not isinstance(value, (int, float)):
            raise InvalidValueError(
                f"value should be one number on the device ('random' is not supported), got {value!r}."
            )
        self.p, self.scale, self.ratio, self.value = float(p), tuple(scale), tuple(ratio), float(value)
        self.inplace = bool(inplace)

    def to_torchvision(self) -> nn.Module:
        """``v2.RandomErasing`` with the same arguments."""
        return v2.RandomErasing(self.p, self.scale, self.ratio, self.value, self.inplace)

    def boxes(self, keys: torch.Tensor, seed: int, height: int, width: int) -> torch.Tensor:
        """Each sample's ``(top, left, height, width)``; height 0 where nothing is erased. CPU int64 ``N x 4``."""
        n = len(keys)
        u = uniforms(seed, keys.cpu(), self.stream, 1 + 4 * self.tries)
        area = height * width
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        tries = u[:, 1:].view(n, self.tries, 4)  # every try of every sample at once: ~20 ops a batch, not ~150
        erase_area = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * tries[..., 0])
        aspect = torch.exp(lo + (hi - lo) * tries[..., 1])
        h = torch.sqrt(erase_area * aspect).round().long()
        w = torch.sqrt(erase_area / aspect).round().long()
        top = (tries[..., 2] * (height - h + 1)).long()
        left = (tries[..., 3] * (width - w + 1)).long()
        fits = (h < height) & (w < width)
        first = fits.to(torch.uint8).argmax(1, keepdim=True)  # the first try that fits wins (0 where none does)
        chosen = torch.stack([top, left, h, w], 2).gather(1, first.unsqueeze(2).expand(n, 1, 4)).squeeze(1)
        erased = (u[:, 0] < self.p) & fits.any(1)
        return torch.where(erased.unsqueeze(1), chosen, torch.zeros_like(chosen))

    def forward(self, images: torch.Tensor, keys: torch.Tensor, seed: int) -> torch.Tensor:
        """Erase each sample's box."""
        return ops.erase(images, self.boxes(keys, seed, *images.shape[-2:]), self.value, self.inplace)


def to_batched(transform: Any) -> Any:
    """A torchvision per-image policy as its per-sample batched twin (same arguments); anything else unchanged.

    Raises:
        ValueError: If the torchvision object uses what the batched op does not support (named).
    """
    if isinstance(transform, v2.TrivialAugmentWide):
        return TrivialAugmentWide(transform.num_magnitude_bins, transform.interpolation, transform.fill)
    if isinstance(transform, v2.RandAugment):
        return RandAugment(
            transform.num_ops,
            transform.magnitude,
            transform.num_magnitude_bins,
            transform.interpolation,
            transform.fill,
        )
    if isinstance(transform, v2.ColorJitter):
        t = transform
        return ColorJitter(t.brightness, t.contrast, t.saturation, t.hue)
    if isinstance(transform, v2.RandomErasing):
        value = transform.value
        if value is None or isinstance(value, str):
            raise InvalidValueError("RandomErasing(value='random') has no batched twin; use a number (0 is the mean).")
        values = value if isinstance(value, (list, tuple)) else [value]
        if len(set(values)) > 1:
            raise InvalidValueError(f"RandomErasing's value should be one number on the device, got {value!r}.")
        t = transform
        return RandomErasing(t.p, tuple(t.scale), tuple(t.ratio), float(values[0]), bool(t.inplace))
    return transform
