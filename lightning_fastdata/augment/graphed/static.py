"""A policy's ops with static shapes: every op over the whole batch, identity parameters where a sample drew another.

The grouped path (:func:`~lightning_fastdata.augment.batched._apply_grouped`) applies each op to the samples that
drew it: the ops launched, their shapes and the host-to-device copies depend on the draws. Here every op of the
policy's table runs on the whole batch in a fixed order, with parameters that are exact identities for the samples
that did not draw it (a factor of 1, posterize to 8 bits, solarize at 256, an identity warp, autocontrast and
equalize chosen by a 0/1 mask), so a round gives each sample exactly its drawn op applied to the round's input: the
same pixels as the grouped path, bit for bit (tested), with a sequence of ops and shapes that does not depend on the
draws. That is what a CUDA graph needs (captured once, replayed each batch) and what the training thread's host time
per batch gains from (a fixed number of launches); on the CPU, the grouped path stays the faster one.

Exactness of the identities: uint8 x float32 ``1.0`` and ``+ 0 * other`` leave every value as it is; the sharpness
blur is built from shifted adds in float32 (its true value is never within 1/26 of a rounding boundary, so the
rounded blur is the one ``conv2d`` gives, without a convolution whose TF32 arithmetic could move it); the identity
warp's source coordinates round to the pixel itself; quarter turns are integer matrices (the exact transposes
torchvision makes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

import lightning_fastdata.augment.ops as ops

__all__ = [
    "WARPS",
    "Layout",
    "apply_parameters",
    "apply_round",
    "pack",
    "round_parameters",
    "sharpness_blur",
    "unpack",
    "warp_parameters",
]

#: The policies' geometric ops (one affine warp each sample; the identity for the others).
WARPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


def sharpness_blur(images: torch.Tensor) -> torch.Tensor:
    """Torchvision's sharpness blur of the inner pixels (``N x C x (H-2) x (W-2)``, float32, rounded) by shifted adds.

    The 3 x 3 kernel is 1/13 around and 5/13 in the centre: the neighbours' sum is an integer (exact in float32),
    so ``(sum + 5 * centre) / 13`` is within float32 rounding of the true value, which is never within 1/26 of a
    half: rounding gives what torchvision's ``conv2d`` gives, on every device and precision setting.
    """
    x = images.to(torch.float32)
    h, w = x.shape[-2:]
    total = x[..., 0 : h - 2, 0 : w - 2] + x[..., 0 : h - 2, 1 : w - 1]
    for dy, dx in ((0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (2, 2)):
        total = total + x[..., dy : h - 2 + dy, dx : w - 2 + dx]
    return total.add_(x[..., 1 : h - 1, 1 : w - 1], alpha=5.0).div_(13.0).round_()


def _sharpen(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``ops.adjust_sharpness`` with the blur by shifted adds (factor 1: the images as they are)."""
    h, w = images.shape[-2:]
    if h <= 2 or w <= 2:
        return images
    out = images.to(torch.float32, copy=True)
    view = out[..., 1:-1, 1:-1]
    ratio = (1.0 - ops.to_device(factor, images.device, torch.float64).view(-1, 1, 1, 1)).to(torch.float32)
    view.addcmul_(sharpness_blur(images).sub_(view), ratio)
    return out.clamp_(0, 255).to(torch.uint8)


def _where(drew: torch.Tensor, changed: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    return torch.where(ops.to_device(drew, images.device).view(-1, 1, 1, 1), changed, images)


def warp_parameters(
    names: Sequence[str], magnitude: torch.Tensor, h: int, w: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sample's ``F.affine`` parameters for its drawn warp op, as torchvision's op gives them (float64, host).

    Returns ``(angle, translate, shear, center, turn, rotating)``: ``F.affine``'s angle, translation and shear,
    the centre (torchvision shears about the top-left corner and translates and rotates about the image centre),
    ``F.rotate``'s angle (``turn``, whose negative is ``angle``) and which samples rotate. Zeros for a sample that
    drew no warp.
    """
    kind = torch.tensor([WARPS.index(n) if n in WARPS else -1 for n in names])
    m = magnitude.to(torch.float64)
    zero = torch.zeros(len(names), dtype=torch.float64)
    degrees = ops.shear_degrees(m)
    shear = torch.stack([torch.where(kind == 0, degrees, zero), torch.where(kind == 1, degrees, zero)], 1)
    shift = torch.trunc(m)
    translate = torch.stack([torch.where(kind == 2, shift, zero), torch.where(kind == 3, shift, zero)], 1)
    rotating = kind == 4
    turn = torch.where(rotating, m % 360, zero)
    middle = torch.tensor([[w * 0.5, h * 0.5]], dtype=torch.float64)
    center = torch.where((kind <= 1).unsqueeze(1), torch.zeros_like(middle), middle)
    return torch.where(rotating, -turn, zero), translate, shear, center, turn, rotating


def _warp_matrices(names: Sequence[str], magnitude: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Each sample's inverse affine (float32 ``N x 2 x 3``, host): its drawn warp's, the identity for the others.

    A rotation by a multiple of 90 degrees is the exact integer matrix of the turn (torchvision turns those images
    exactly; odd turns only on square images).
    """
    angle, translate, shear, center, turn, rotating = warp_parameters(names, magnitude, h, w)
    theta = ops._inverse_affine(len(names), h, w, angle, translate, shear, center)
    theta[torch.tensor([n not in WARPS for n in names])] = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    quarter = rotating & (torch.remainder(turn, 90) == 0)
    for i in np.flatnonzero(quarter.numpy()).tolist():
        k = int(round(float(turn[i]) / 90)) % 4
        if k % 2 and h != w:
            continue
        # the inverse of rot90(k) (counter-clockwise) about the centre, on pixel-centre coordinates
        c, s = [(1, 0), (0, 1), (-1, 0), (0, -1)][k]
        theta[i] = torch.tensor([[c, -s, 0.0], [s, c, 0.0]], dtype=torch.float32)
    return theta


def round_parameters(names: Sequence[str], magnitude: torch.Tensor, h: int, w: int) -> dict[str, torch.Tensor]:
    """Every op's per-sample parameters for one round, on the host: the drawn op's, or the identity.

    What :func:`apply_parameters` reads (:func:`pack` puts a batch's in one buffer). ``names[i]`` is sample ``i``'s
    op, ``magnitude[i]`` its signed magnitude (float64).
    """
    drew = {name: torch.tensor([n == name for n in names]) for name in set(names)}
    none = torch.zeros(len(names), dtype=torch.bool)

    def factor(name: str) -> torch.Tensor:
        return torch.where(drew.get(name, none), 1.0 + magnitude, 1.0)

    return {
        "scaled": ops.scaled_theta(_warp_matrices(names, magnitude, h, w), h, w),
        "brightness": factor("Brightness"),
        "color": factor("Color"),
        "contrast": factor("Contrast"),
        "sharpness": factor("Sharpness"),
        "bits": torch.where(drew.get("Posterize", none), magnitude, 8.0).to(torch.int64),
        "threshold": torch.where(drew.get("Solarize", none), 255.0 * magnitude, 256.0),
        "autocontrast": drew.get("AutoContrast", none),
        "equalize": drew.get("Equalize", none),
        "invert": drew.get("Invert", none),
    }


def apply_parameters(images: torch.Tensor, p: dict[str, torch.Tensor], fill: float | None, mode: str) -> torch.Tensor:
    """One round over the whole batch with :func:`round_parameters`' values.

    The values may be on the host, or already on the device: then nothing is copied and nothing read back.
    """
    out = ops.warp_scaled(images, ops.to_device(p["scaled"], images.device), fill, mode)
    out = ops.adjust_brightness(out, p["brightness"])
    out = ops.adjust_saturation(out, p["color"])
    out = ops.adjust_contrast(out, p["contrast"])
    out = _sharpen(out, p["sharpness"])
    out = ops.posterize(out, p["bits"])
    out = ops.solarize(out, p["threshold"])
    out = _where(p["autocontrast"], F.autocontrast(out), out)
    out = _where(p["equalize"], F.equalize(out), out)
    return _where(p["invert"], 255 - out, out)


def apply_round(
    images: torch.Tensor, names: Sequence[str], magnitude: torch.Tensor, fill: float | None, mode: str
) -> torch.Tensor:
    """One op round of a policy, every op over the whole batch: the same pixels as the grouped path.

    Each sample's drawn op is ``names[i]`` with the signed ``magnitude[i]`` (on the host), the module docstring says
    how the others are identities.
    """
    return apply_parameters(images, round_parameters(names, magnitude, *images.shape[-2:]), fill, mode)


#: Where each parameter lies in a packed buffer: its name, dtype, shape, and its slice of the buffer.
Layout = list[tuple[str, torch.dtype, tuple[int, ...], int, int]]


def pack(parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Layout]:
    """Host parameters in one float64 buffer (one copy to the device), and where each lies.

    float64 holds every value exactly: float32 and float64 numbers, small integers, and 0/1 for masks.
    """
    layout: Layout = []
    flat, start = [], 0
    for name, t in parts.items():
        flat.append(t.reshape(-1).to(torch.float64))
        layout.append((name, t.dtype, tuple(t.shape), start, start + t.numel()))
        start += t.numel()
    return torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64), layout


def unpack(buffer: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """:func:`pack`'s parameters out of ``buffer`` (wherever it is), each with its dtype and shape again."""
    out = {}
    for name, dtype, shape, start, stop in layout:
        part = buffer[start:stop].view(shape)
        out[name] = part != 0 if dtype == torch.bool else part.to(dtype)
    return out
