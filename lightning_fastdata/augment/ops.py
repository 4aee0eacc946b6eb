"""torchvision's v2 image ops on a whole uint8 batch, with a different parameter for each sample.

Each function takes ``images`` (uint8 ``N x 3 x H x W``, any memory format, any device) and per-sample parameters
as length-``N`` tensors, and returns what ``torchvision.transforms.v2.functional``'s op returns for each sample with
its own parameter, computed for the whole batch at once (one affine grid per sample, one blend factor per sample,
one histogram per sample and channel). ``tests/augment/test_augment.py`` compares every op with torchvision's
on the same images and parameters: the integer ops (posterize, solarize, autocontrast, equalize, erase, and the
affine ops at multiples of 90 degrees) bit for bit; the blends and the warps within the bounds stated there.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.functional import conv2d, grid_sample
from torchvision.transforms.v2 import functional as F

import lightning_fastdata.augment.torchvision_internals as tv
from lightning_fastdata._ext import native
from lightning_fastdata.augment.kernels import warp_images

__all__ = [
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "adjust_sharpness",
    "affine",
    "autocontrast",
    "equalize",
    "erase",
    "erase_masked",
    "posterize",
    "quarter_turns",
    "solarize",
    "scaled_theta",
    "to_device",
    "warp_scaled",
]


def to_device(values: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values.to(device, dtype)`` that never waits for the device.

    A copy from pageable host memory to a GPU synchronises the stream (torch waits for it to finish, and with it
    everything queued before: the previous training step); the per-sample parameters are drawn on the host, so a
    host tensor goes through pinned memory and is copied asynchronously, in stream order.
    """
    if dtype is not None and values.dtype != dtype:
        values = values.to(dtype)  # converted where it is (IEEE rounding: the same numbers on any device)
    if values.device.type != "cpu" or device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


def _per_sample(values: torch.Tensor, images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return to_device(values, images.device, dtype).view(-1, 1, 1, 1)


def _gray(images: torch.Tensor) -> torch.Tensor:
    """Torchvision's ``rgb_to_grayscale`` in float32, floored (what its uint8 colour ops blend with)."""
    r, g, b = images.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3).floor_()


def _blend(images: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``images * ratio + other * (1 - ratio)``, clamped and truncated to uint8 (torchvision's ``_blend``)."""
    r = _per_sample(ratio, images, torch.float64)
    out = images.to(torch.float32).mul(r.to(torch.float32))
    # one fused multiply-add per pixel, as torchvision's add_(other, alpha=1 - ratio) (two roundings differ by one
    # level on ~0.05% of pixels)
    out.addcmul_(other, (1.0 - r).to(torch.float32))
    return out.clamp_(0, 255).to(torch.uint8)


def adjust_brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``F.adjust_brightness`` with a factor per sample."""
    return images.to(torch.float32).mul(_per_sample(factor, images)).clamp_(0, 255).to(torch.uint8)


def adjust_saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``F.adjust_saturation`` with a factor per sample."""
    return _blend(images, _gray(images), factor)


def adjust_contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``F.adjust_contrast`` with a factor per sample (blend with each sample's mean grey level)."""
    mean = torch.mean(_gray(images), dim=(-3, -2, -1), keepdim=True)
    return _blend(images, mean, factor)


def adjust_hue(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``F.adjust_hue`` with a hue shift (-0.5 to 0.5) per sample.

    torchvision's own colour-space conversions (batch-generic already; :mod:`.torchvision_internals`); where they
    are missing, ``F.adjust_hue`` per sample.
    """
    if tv.rgb_to_hsv is None or tv.hsv_to_rgb is None:
        shifts = factor.to(torch.float64).tolist()
        return torch.stack([F.adjust_hue(image, float(shift)) for image, shift in zip(images, shifts)])
    hsv = tv.rgb_to_hsv(F.to_dtype(images, torch.float32, scale=True))
    h, s, v = hsv.unbind(dim=-3)
    h.add_(to_device(factor, images.device, torch.float64).to(torch.float32).view(-1, 1, 1)).remainder_(1.0)
    return F.to_dtype(tv.hsv_to_rgb(torch.stack((h, s, v), dim=-3)), torch.uint8, scale=True)


def adjust_sharpness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``F.adjust_sharpness`` with a factor per sample (the border rows and columns are kept, as torchvision's)."""
    n, c, h, w = images.shape
    if h <= 2 or w <= 2:
        return images
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = to_device(torch.tensor([[a, a, a], [a, b, a], [a, a, a]], dtype=torch.float32), images.device)
    out = images.to(torch.float32, copy=True)
    blurred = conv2d(out, kernel.expand(c, 1, 3, 3), groups=c).round_()
    view = out[..., 1:-1, 1:-1]
    view.addcmul_(blurred.sub_(view), (1.0 - _per_sample(factor, images, torch.float64)).to(torch.float32))
    return out.clamp_(0, 255).to(torch.uint8)


def posterize(images: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``F.posterize`` with a bit count (0-8) per sample."""
    bits = to_device(bits, images.device, torch.int64).clamp(0, 8)
    mask = ((1 << bits) - 1) << (8 - bits)
    return images & mask.to(torch.uint8).view(-1, 1, 1, 1)


def solarize(images: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """``F.solarize`` with a threshold (0-255 scale) per sample."""
    return torch.where(images.to(torch.float32) >= _per_sample(threshold, images), 255 - images, images)


def autocontrast(images: torch.Tensor) -> torch.Tensor:
    """``F.autocontrast`` (already per sample and channel in torchvision)."""
    return F.autocontrast(images)


def equalize(images: torch.Tensor) -> torch.Tensor:
    """``F.equalize`` (already per sample and channel in torchvision: one histogram each)."""
    return F.equalize(images)


def affine(
    images: torch.Tensor,
    angle: torch.Tensor,
    translate: torch.Tensor,
    shear: torch.Tensor,
    center: torch.Tensor | None = None,
    fill: float | None = None,
    interpolation: str = "nearest",
) -> torch.Tensor:
    """``F.affine`` (``"nearest"`` or ``"bilinear"``) with an angle, translation, shear and centre per sample (scale 1).

    The per-sample matrices are computed on the host, in float64 as torchvision computes its one matrix, and reach
    the device in one copy: the same numbers on every device, and two dozen fewer launches per batch on a GPU.

    Args:
        images: uint8 ``N x 3 x H x W``.
        angle: ``N`` degrees, as ``F.affine``'s (:func:`rotate` is ``F.rotate``'s convention).
        translate: ``N x 2`` pixels (x, y).
        shear: ``N x 2`` degrees (x, y).
        center: ``N x 2`` pixel centres, or ``None`` for the image centre (``F.affine``'s ``center``).
        fill: Value outside the image; ``None`` is black (torchvision's default).
        interpolation: ``"nearest"`` (TrivialAugment's and RandAugment's default) or ``"bilinear"``.
    """
    n, _, h, w = images.shape
    return _warp(images, _inverse_affine(n, h, w, angle, translate, shear, center), fill, interpolation)


def _host64(values: torch.Tensor) -> np.ndarray:
    """Per-sample parameters as float64 on the host (drawn there: a device tensor is read back, waiting for it)."""
    return values.detach().to(device="cpu", dtype=torch.float64).numpy()


def _inverse_affine(
    n: int,
    h: int,
    w: int,
    angle: torch.Tensor,
    translate: torch.Tensor,
    shear: torch.Tensor,
    center: torch.Tensor | None,
) -> torch.Tensor:
    """Torchvision's ``_get_inverse_affine_matrix`` for each sample (scale 1): float32 ``N x 2 x 3`` on the host."""
    rot = np.deg2rad(_host64(angle))
    sx, sy = np.deg2rad(_host64(shear)).reshape(n, 2).T
    if center is None:
        cx = cy = np.zeros(n)
    else:
        c = _host64(center).reshape(n, 2)
        cx, cy = c[:, 0] - w * 0.5, c[:, 1] - h * 0.5
    tx, ty = _host64(translate).reshape(n, 2).T
    a = np.cos(rot - sy) / np.cos(sy)
    b = -(a * np.tan(sx) + np.sin(rot))
    cc = np.sin(rot - sy) / np.cos(sy)
    d = np.cos(rot) - cc * np.tan(sx)
    m0, m1, m3, m4 = d, -b, -cc, a
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.from_numpy(np.stack([m0, m1, m2, m3, m4, m5], axis=1).astype(np.float32).reshape(n, 2, 3))


def rotate(
    images: torch.Tensor, angle: torch.Tensor, fill: float | None = None, interpolation: str = "nearest"
) -> torch.Tensor:
    """``F.rotate`` with an angle per sample (about the centre, no expand).

    Multiples of 90 degrees on square images are exact transposes, as in torchvision.
    """
    n = images.shape[0]
    angle = angle.to(device="cpu", dtype=torch.float64) % 360
    zeros = torch.zeros(n, 2, dtype=torch.float64)
    out = affine(images, -angle, zeros, zeros, None, fill, interpolation)
    return quarter_turns(images, out, angle)


def quarter_turns(
    images: torch.Tensor, out: torch.Tensor, angle: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """``out`` with the exact turn of ``images`` where ``angle`` (``F.rotate``'s, in [0, 360)) is a multiple of 90.

    Torchvision's rotate turns such samples exactly (odd turns only on square images). ``rows`` (bool ``N``):
    only those samples are rotations. The angles (and ``rows``) on the host; ``out`` is changed in place.
    """
    h, w = images.shape[-2:]
    quarter = torch.remainder(angle, 90) == 0
    if rows is not None:
        quarter &= rows
    # which turn each sample gets (-1: none), read on the host: no wait on the device, a few ops whatever the batch
    turns = torch.where(quarter.cpu(), (angle / 90).round().long().cpu() % 4, -1).tolist()
    for k in sorted(set(turns) - {-1}):
        if k % 2 and h != w:
            continue
        index = to_device(torch.tensor([i for i, t in enumerate(turns) if t == k]), images.device)
        out[index] = torch.rot90(images[index], k=k, dims=(-2, -1))
    return out


def _warp(images: torch.Tensor, theta: torch.Tensor, fill: float | None, mode: str) -> torch.Tensor:
    """Torchvision's ``_affine_grid`` + ``_apply_grid_transform``, one grid per sample (``theta`` on the host)."""
    h, w = images.shape[-2:]
    return warp_scaled(images, to_device(scaled_theta(theta, h, w), images.device), fill, mode)


def scaled_theta(theta: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse affines (``N x 2 x 3``) as :func:`warp_scaled` takes them: transposed, rescaled to ``[-1, 1]``.

    On the host: float32 division rounds the same everywhere.
    """
    return theta.transpose(1, 2).div(torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float32))


def warp_scaled(images: torch.Tensor, scaled: torch.Tensor, fill: float | None, mode: str) -> torch.Tensor:
    """The warp of :func:`_warp` by :func:`scaled_theta`'s matrices, already where ``images`` are (no copy here)."""
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation should be 'nearest' or 'bilinear' on tensors, got {mode!r}.")
    n, c, h, w = images.shape
    dev = images.device
    if mode == "nearest" and dev.type == "cpu" and native.imageops_available():  # the same arithmetic in C
        return warp_images(images, scaled, None if fill is None else int(round(float(fill))), bilinear=False)
    # torchvision's base grid: pixel centres relative to the image centre, and 1
    bx = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=dev)
    by = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=dev)
    if mode == "nearest":
        return _gather_nearest(images, bx, by, scaled, fill)
    # the grid element by element, (x * s0 + y * s1) + s2, as torchvision's bmm computes it on a CPU: the same
    # roundings on every device, and no matrix product that TF32 would round (an identity warp stays exact)
    rows, cols = by.view(1, h, 1, 1), bx.view(1, 1, w, 1)
    grid = torch.add(cols * scaled[:, 0].view(n, 1, 1, 2), rows * scaled[:, 1].view(n, 1, 1, 2))
    grid = grid.add_(scaled[:, 2].view(n, 1, 1, 2))
    source = images.to(torch.float32)
    if fill is not None:
        source = torch.cat((source, torch.ones((n, 1, h, w), dtype=torch.float32, device=dev)), dim=1)
    out = grid_sample(source, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if fill is not None:
        out, mask = torch.tensor_split(out, indices=(-1,), dim=-3)
        out = out.sub_(float(fill)).mul_(mask.expand_as(out)).add_(float(fill))
    return out.round_().to(torch.uint8)


def _gather_nearest(
    images: torch.Tensor, bx: torch.Tensor, by: torch.Tensor, scaled: torch.Tensor, fill: float | None
) -> torch.Tensor:
    """The nearest-neighbour warp of ``images`` by the rescaled affine ``scaled`` (``N x 3 x 2``), as a gather.

    torchvision computes the grid with a ``bmm`` of the base grid and ``scaled`` and samples the image converted to
    float with ``grid_sample(mode="nearest", padding_mode="zeros", align_corners=False)``. Here each grid coordinate
    is ``(bx * s0 + by * s1) + s2`` (what that ``bmm`` computes on a CPU: the same float32 roundings, one product
    after the other), its source pixel ``(g + 1) * (size / 2) - 0.5`` rounded half to even (grid_sample's CPU
    kernel), and the uint8 pixels are gathered directly: the same pixels as torchvision's on a CPU (tested op by op
    against it), 5-10x faster per image, and the same pixels on every device (no ``bmm`` or ``grid_sample``
    kernel of the device involved). A pixel whose source lies outside the image gets ``fill`` (``None``: black).
    On a CPU with the compiled kernels, :func:`_warp` runs the same arithmetic in C (``_ext/imageops.c``) instead.
    """
    n, c, h, w = images.shape
    outside = 0 if fill is None else int(round(float(fill)))
    rows, cols = by.view(1, h, 1), bx.view(1, 1, w)

    def source(k: int, size: int) -> torch.Tensor:
        s = scaled[:, :, k].reshape(n, 3, 1, 1)
        g = torch.add(cols * s[:, 0], rows * s[:, 1]).add_(s[:, 2])
        return g.add_(1).mul_(size / 2).sub_(0.5).round_()

    x, y = source(0, w), source(1, h)
    inside = (x >= 0) & (x <= w - 1) & (y >= 0) & (y <= h - 1)
    x = x.clamp_(0, w - 1).to(torch.int64)
    index = y.clamp_(0, h - 1).to(torch.int64).mul_(w).add_(x).view(n, 1, h * w)
    out = torch.gather(images.reshape(n, c, h * w), 2, index.expand(n, c, h * w)).view(n, c, h, w)
    return out.masked_fill_(~inside.unsqueeze(1), outside)


def erase(images: torch.Tensor, boxes: torch.Tensor, value: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """``F.erase``: set ``boxes`` (``N x 4`` ``(top, left, height, width)``; height 0: nothing) to ``value``.

    On a CPU, one slice per erased box: the work is the erased area, not the batch (a mask over the whole batch cost
    0.6 ms per image there). Elsewhere, one mask for the whole batch (:func:`erase_masked`): a dozen launches
    instead of three per box (~180 of a GPU batch's ~570 host calls with the recipe's p=0.25 at 256 images).
    """
    if images.device.type != "cpu":
        return erase_masked(images, boxes, value, inplace)
    b = boxes.to(device="cpu", dtype=torch.int64)
    out = images if inplace else images.clone()
    for i, (top, left, h, w) in enumerate(b.tolist()):
        if h > 0:
            out[i, :, top : top + h, left : left + w] = value
    return out


def erase_masked(images: torch.Tensor, boxes: torch.Tensor, value: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """:func:`erase` as one mask over the batch: the same pixels, a fixed number of ops whatever the box count."""
    n, _, h, w = images.shape
    top, left, height, width = to_device(boxes.to(torch.int64), images.device).view(n, 4, 1).unbind(1)
    rows = torch.arange(h, device=images.device).view(1, h)
    cols = torch.arange(w, device=images.device).view(1, w)
    inside_rows = (rows >= top) & (rows < top + height)  # N x H
    inside_cols = (cols >= left) & (cols < left + width)  # N x W
    mask = (inside_rows.view(n, 1, h, 1) & inside_cols.view(n, 1, 1, w)).expand_as(images)
    return images.masked_fill_(mask, value) if inplace else images.masked_fill(mask, value)


def shear_degrees(magnitude: torch.Tensor) -> torch.Tensor:
    """TrivialAugment's shear magnitude (a tangent) in degrees, as torchvision converts it."""
    return torch.rad2deg(torch.atan(magnitude.to(torch.float64)))
