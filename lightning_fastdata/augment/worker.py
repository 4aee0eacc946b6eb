"""torchvision's per-image policies, run in the workers with faster kernels: the same draws, the same pixels.

A user's ``v2.TrivialAugmentWide()`` (or ``RandAugment``, ``AutoAugment``, ``AugMix``) in ``train_transforms``
runs once per sample in a loader worker. torchvision warps a uint8 image by converting it to float, building a grid
with a ``bmm`` and sampling it with ``grid_sample``: ~1 ms for a 176 px crop on one core, and five of
TrivialAugment's fourteen ops are warps. :func:`accelerate` gives the DataModule a twin of the user's object, built
with the same constructor arguments (read from its public attributes), whose class is a subclass of torchvision's
that keeps torchvision's ``forward`` (so the op and magnitude are drawn from torch's generator exactly as torchvision
draws them) and replaces the application of an op to a plain uint8 CPU tensor, where a faster kernel gives the same
pixels:

- the warps (shear, translate, rotate), nearest or bilinear (torchvision's reference recipe uses bilinear):
  torchvision's own inverse affine matrix, then ``_ext/imageops.c``, which repeats the float32 arithmetic of
  torchvision's grid and of ``grid_sample``'s CPU kernel per pixel on the uint8 pixels directly (~4x faster);
- the ops that map each level of a channel to one level (brightness, contrast once the mean is known, solarize,
  autocontrast, equalize): a 256-entry table per channel, computed by torchvision's own arithmetic on the 256
  levels (equalize's integer histogram scheme in numpy), then one lookup per pixel (3-6x faster).

Every other case (sharpness and saturation, a fill per channel, a fill with bilinear warps, other interpolations,
PIL images, videos, tensors on a GPU, an install without the compiled extension) is torchvision's own code.
``tests/augment/test_augment.py`` compares each op at every magnitude bin and sign, and whole policies under the
same seeds, with torchvision's, bit for bit (the bilinear warp runs eight pixels at a time with AVX2 and FMA where
the CPU has them, else one at a time with the same arithmetic; ``LIGHTNING_FASTDATA_NO_AVX2=1`` forces the latter,
which the tests compare too).
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

import lightning_fastdata.augment.torchvision_internals as tv
from lightning_fastdata._ext import native
from lightning_fastdata.augment.kernels import base_grid, copy_image, histograms, lookup, memory_of, warp_images

__all__ = [
    "adjust_brightness",
    "adjust_contrast",
    "WorkerAugMix",
    "WorkerAutoAugment",
    "WorkerRandAugment",
    "WorkerTrivialAugmentWide",
    "accelerate",
    "copy_image",
]


def _warp(image: torch.Tensor, matrix: list[float], fill: int | None, bilinear: bool) -> torch.Tensor:
    """``image`` (uint8 ``C x H x W``) warped by torchvision's inverse affine ``matrix`` (``fill``: nearest only)."""
    h, w = image.shape[-2:]
    half = base_grid(w, h)[2]
    theta = np.asarray(matrix, dtype=np.float32).reshape(2, 3)  # torch.tensor(matrix, dtype=float32)
    scaled = torch.from_numpy(theta.T / half)  # _affine_grid's rescaled theta (3 x 2), the same float32 division
    return warp_images(image.unsqueeze(0), scaled.unsqueeze(0), fill, bilinear)[0]


_NO_FILL = -1


def _fill_value(fill: Any) -> int | None:
    """The op's one fill value for a plain tensor, ``_NO_FILL`` for none (black), ``None`` if per channel."""
    value = tv.get_fill(fill, torch.Tensor)
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            return None
        value = value[0]
    return _NO_FILL if value is None else int(round(float(value)))


#: The 256 uint8 levels as a one-channel image (1 x 1 x 256): torchvision's own op applied to it gives a table.
_LEVELS = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)


def _equalize_table(image: torch.Tensor) -> torch.Tensor:
    """Torchvision's ``equalize_image`` lookup table per channel (integer arithmetic, PIL's scheme), ``C x 256``."""
    hist = histograms(image)
    cum = np.cumsum(hist, axis=1)
    top = hist[np.arange(len(hist)), np.argmax(cum, axis=1)]  # the count of each channel's highest level
    step = ((cum[:, -1] - top) // 255)[:, None]
    table = np.clip((cum[:, :-1] + step // 2) // np.maximum(step, 1), 0, 255)
    table = np.concatenate([np.zeros((len(hist), 1), dtype=table.dtype), table], axis=1)
    identity = np.broadcast_to(np.arange(256), table.shape)
    return torch.from_numpy(np.where(step == 0, identity, table).astype(np.uint8))  # step 0: channel left as is


def _autocontrast_table(image: torch.Tensor) -> torch.Tensor:
    """Torchvision's ``autocontrast_image`` per channel as a table: its float32 arithmetic on the 256 levels."""
    present = histograms(image) > 0
    minimum = np.argmax(present, axis=1).astype(np.float32)[:, None]  # each channel's lowest level (its amin)
    maximum = (255 - np.argmax(present[:, ::-1], axis=1)).astype(np.float32)[:, None]  # and highest (amax)
    flat = maximum == minimum
    inv_scale = np.where(flat, np.float32(1), (maximum - minimum) * np.float32(1.0 / 255))
    minimum = np.where(flat, np.float32(0), minimum)
    levels = np.arange(256, dtype=np.float32)[None, :]
    return torch.from_numpy(np.clip((levels - minimum) / inv_scale, 0, 255).astype(np.uint8))


@lru_cache(maxsize=256)
def _blend_is_exact(alpha: float) -> bool:
    """Whether ``v + alpha * (b - v)`` (float32, clamped, truncated to uint8) is the same fused and unfused.

    For every ``v`` and ``b`` in 0..255: then the C sharpen's bytes are torchvision's whatever way torch evaluates
    its blend (for most of TrivialAugment's magnitudes; the others are left to torchvision).
    """
    a = np.float32(alpha)
    v = np.arange(256, dtype=np.float32)[:, None]
    d = np.arange(256, dtype=np.float32)[None, :] - v
    unfused = v + (a * d).astype(np.float32)
    fused = (v.astype(np.float64) + np.float64(a) * d.astype(np.float64)).astype(np.float32)
    return bool(np.array_equal(np.clip(unfused, 0, 255).astype(np.uint8), np.clip(fused, 0, 255).astype(np.uint8)))


def _sharpen(image: torch.Tensor, factor: float) -> torch.Tensor | None:
    """Torchvision's ``adjust_sharpness_image`` of a uint8 image by ``_ext/imageops.c``, ``None`` where it can't."""
    c, h, w = image.shape
    alpha = 1.0 - factor
    if not native.imageops_available() or factor < 0 or c not in (1, 3) or h <= 2 or w <= 2:
        return None  # torchvision's own code: its errors, its tiny-image shortcut
    if not _blend_is_exact(float(np.float32(alpha))):
        return None
    assert native.jpegroi is not None
    src, src_memory, src_strides = memory_of(image)
    out, out_memory, out_strides = memory_of(torch.empty_like(src))
    native.jpegroi.sharpen(src_memory, src_strides, out_memory, out_strides, tuple(src.shape), alpha)
    return out


def adjust_brightness(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Torchvision's ``F.adjust_brightness`` of a uint8 image, bit for bit: its op on the 256 levels, then a lookup."""
    return lookup(image, F.adjust_brightness(_LEVELS, factor))


def adjust_contrast(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Torchvision's ``F.adjust_contrast`` of a uint8 RGB image, bit for bit: its grey mean, its blend on the levels."""
    if image.shape[0] != 3:
        return F.adjust_contrast(image, factor)
    gray = tv.rgb_to_grayscale_image(image, num_output_channels=1, preserve_dtype=False).floor_()
    mean = torch.mean(gray, dim=(-3, -2, -1), keepdim=True)
    return lookup(image, tv.blend(_LEVELS, mean, factor))


def _fast_op(image: torch.Tensor, name: str, magnitude: float, interpolation: Any, fill: Any) -> torch.Tensor | None:
    """The op's result by a faster kernel, or ``None`` where torchvision's own code should run."""
    # the ops that map each level of a channel to one level: torchvision's own op applied to the 256 levels is the
    # table (the same float32 arithmetic per pixel), then one lookup per pixel (3-6x faster than the op on the image)
    if name == "Brightness":
        return adjust_brightness(image, 1.0 + magnitude)
    if name == "Contrast" and image.shape[0] == 3:
        return adjust_contrast(image, 1.0 + magnitude)
    if name == "Solarize":
        threshold = float(np.float32(255.0 * magnitude))  # torchvision compares uint8 with a float32 threshold
        if threshold > 255:
            return None  # torchvision raises: let it
        levels = np.arange(256, dtype=np.uint8)
        return lookup(image, torch.from_numpy(np.where(levels >= math.ceil(threshold), 255 - levels, levels)))
    if name == "AutoContrast":
        return lookup(image, _autocontrast_table(image))
    if name == "Equalize":
        return lookup(image, _equalize_table(image))
    if name == "Sharpness":
        return _sharpen(image, 1.0 + magnitude)
    if name not in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate") or not native.imageops_available():
        return None
    mode = getattr(interpolation, "value", interpolation)
    value = _fill_value(fill)
    if value is None or not (
        mode == "nearest" and _NO_FILL <= value <= 255 or mode == "bilinear" and value == _NO_FILL
    ):
        return None  # per-channel fills, a fill with bilinear (torchvision blends a mask), other modes
    h, w = image.shape[-2:]
    if name == "Rotate":
        angle = magnitude % 360
        if angle == 0:
            return image.clone()
        if angle == 180:
            return torch.rot90(image, k=2, dims=(-2, -1))
        if h == w and angle in (90, 270):
            return torch.rot90(image, k=1 if angle == 90 else 3, dims=(-2, -1))
        matrix = tv.get_inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0])
    elif name in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(magnitude))
        shear = [degrees, 0.0] if name == "ShearX" else [0.0, degrees]
        # F.affine's center=[0, 0], relative to the image centre
        matrix = tv.get_inverse_affine_matrix([-w * 0.5, -h * 0.5], 0.0, [0.0, 0.0], 1.0, shear)
    else:
        shift = [float(int(magnitude)), 0.0] if name == "TranslateX" else [0.0, float(int(magnitude))]
        matrix = tv.get_inverse_affine_matrix([0.0, 0.0], 0.0, shift, 1.0, [0.0, 0.0])
    return _warp(image, matrix, None if value == _NO_FILL else value, mode == "bilinear")


class _FastOps:
    """Mixin over a torchvision ``_AutoAugmentBase`` policy: its draws, faster kernels where they are exact."""

    def _apply_image_or_video_transform(
        self, image: Any, transform_id: str, magnitude: float, interpolation: Any, fill: Any
    ) -> Any:
        if (
            type(image) is torch.Tensor  # a plain tensor: not a TVTensor (video) nor PIL
            and image.dtype == torch.uint8
            and image.device.type == "cpu"
            and image.ndim == 3
        ):
            out = _fast_op(image, transform_id, magnitude, interpolation, fill)
            if out is not None:
                return out
        return super()._apply_image_or_video_transform(  # type: ignore[misc]
            image, transform_id, magnitude, interpolation, fill
        )


class WorkerTrivialAugmentWide(_FastOps, v2.TrivialAugmentWide):
    """``v2.TrivialAugmentWide`` with faster exact kernels (see the module's text)."""


class WorkerRandAugment(_FastOps, v2.RandAugment):
    """``v2.RandAugment`` with faster exact kernels."""


class WorkerAutoAugment(_FastOps, v2.AutoAugment):
    """``v2.AutoAugment`` with faster exact kernels."""


class WorkerAugMix(_FastOps, v2.AugMix):
    """``v2.AugMix`` with faster exact kernels."""


#: Each torchvision policy's faster twin, built from the policy's public constructor arguments.
_FAST: dict[type, tuple[type, tuple[str, ...]]] = {
    v2.TrivialAugmentWide: (WorkerTrivialAugmentWide, ("num_magnitude_bins",)),
    v2.RandAugment: (WorkerRandAugment, ("num_ops", "magnitude", "num_magnitude_bins")),
    v2.AutoAugment: (WorkerAutoAugment, ("policy",)),
    v2.AugMix: (WorkerAugMix, ("severity", "mixture_width", "chain_depth", "alpha", "all_ops")),
}
_CONTAINERS = (v2.Compose, v2.RandomApply, v2.RandomChoice, v2.RandomOrder)


def accelerate(transform: Any) -> Any:
    """``transform`` with torchvision's policies in it as their faster twins above (inside containers too).

    A copy where anything changed, the user's object itself otherwise; the user's object is never modified.
    """
    fast = _FAST.get(type(transform)) if not set(tv.WORKER_NAMES) & set(tv.MISSING) else None
    if fast is not None:  # a new object of the faster class, with the user's arguments (read from its attributes)
        cls, names = fast
        args = {name: getattr(transform, name) for name in (*names, "interpolation", "fill")}
        twin = cls(**args)
        twin.train(transform.training)
        return twin
    if type(transform) in _CONTAINERS:
        inner = [accelerate(t) for t in transform.transforms]
        if any(a is not t for a, t in zip(inner, transform.transforms)):
            twin = copy.copy(transform)
            twin.transforms = inner
            return twin
    return transform
