"""The compiled image kernels (``_ext/imageops.c``) as functions of uint8 CPU tensors.

Warp, level lookup, histogram, hue, planar/interleaved copy: what both halves of the room call, the worker policies
(:mod:`.worker`) and the batched ops on a CPU (:mod:`.ops`). Each falls back to numpy/torch where the extension is
not built, except :func:`warp_images`, which its callers use only when
:func:`~lightning_fastdata._ext.native.imageops_available`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from lightning_fastdata._ext import native

__all__ = ["adjust_hue", "base_grid", "copy_image", "histograms", "lookup", "memory_of", "warp_images"]


@lru_cache(maxsize=64)
def base_grid(width: int, height: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Torchvision's base grid (pixel centres relative to the image centre) and its rescaling, float32."""
    bx = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width)
    by = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height)
    return bx, by, np.array([0.5 * width, 0.5 * height], dtype=np.float32)


def memory_of(t: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, tuple[int, ...]]:
    """A uint8 CPU tensor's memory as a C-contiguous array, with the tensor's strides into it (in bytes).

    A dense tensor in any dimension order (a channels-last crop viewed as ``C x H x W``) is read where it lies;
    anything else is copied first. Returns the tensor actually described (keep it alive while the array is used).
    """
    strides = t.stride()
    order = sorted(range(t.dim()), key=lambda d: -strides[d])
    if not t.permute(order).is_contiguous():
        t = t.contiguous()
        order = list(range(t.dim()))
    return t, t.permute(order).numpy(), tuple(t.stride())


def warp_images(images: torch.Tensor, scaled: torch.Tensor, fill: int | None, bilinear: bool) -> torch.Tensor:
    """uint8 CPU ``images`` (``N x C x H x W``, any layout) warped with ``_ext/imageops.c``, in the same layout.

    ``scaled`` (``N x 3 x 2``) is each image's rescaled affine (``rescaled_theta`` of torchvision's ``_affine_grid``).
    ``fill``: the value outside the image, nearest only (``None``: black; bilinear: zeros padding).
    """
    n, c, h, w = images.shape
    bx, by, _ = base_grid(w, h)
    src, src_memory, src_strides = memory_of(images)
    out, out_memory, out_strides = memory_of(torch.empty_like(src))
    params = scaled.transpose(1, 2).contiguous().numpy()  # per image: x's three coefficients, then y's
    assert native.jpegroi is not None
    native.jpegroi.warp(
        src_memory,
        src_strides,
        out_memory,
        out_strides,
        (n, c, h, w),
        bx.numpy(),
        by.numpy(),
        params,
        fill or 0,
        bilinear,
    )
    return out


def adjust_hue(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Torchvision's ``F.adjust_hue`` of a uint8 RGB ``3 x H x W`` image (any layout, returned in it), bit for bit.

    One pass of the same float32 arithmetic per pixel (``_ext/imageops.c``) instead of torchvision's ~40 tensor ops;
    torchvision's own where the extension is not built (or the image is not RGB).
    """
    if image.shape[0] != 3 or not native.imageops_available() or not hasattr(native.jpegroi, "hue"):
        from torchvision.transforms.v2 import functional as F

        return F.adjust_hue(image, factor)
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f"hue_factor ({factor}) is not in [-0.5, 0.5].")
    assert native.jpegroi is not None
    src, src_memory, src_strides = memory_of(image)
    out, out_memory, out_strides = memory_of(torch.empty_like(src))
    native.jpegroi.hue(src_memory, src_strides, out_memory, out_strides, tuple(src.shape), float(factor))
    return out


def lookup(image: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Each channel of ``image`` (``C x H x W``) through its row of ``table`` (one row for all channels, or ``C``)."""
    rows = table.reshape(-1, 256).contiguous()
    if native.imageops_available():
        assert native.jpegroi is not None
        src, src_memory, src_strides = memory_of(image)
        out, out_memory, out_strides = memory_of(torch.empty_like(src))
        native.jpegroi.lookup(
            src_memory, src_strides, out_memory, out_strides, tuple(src.shape), rows.numpy(), len(rows)
        )
        return out
    pixels, tables = image.contiguous().numpy(), rows.numpy()
    return torch.from_numpy(np.stack([np.take(tables[c % len(tables)], pixels[c]) for c in range(len(pixels))]))


def histograms(image: torch.Tensor) -> np.ndarray:
    """The counts of the 256 levels per channel, ``C x 256`` int64."""
    if native.imageops_available():
        assert native.jpegroi is not None
        src, memory, strides = memory_of(image)
        counts = np.empty((src.shape[0], 256), dtype=np.int64)
        native.jpegroi.histogram(memory, strides, tuple(src.shape), counts)
        return counts
    return np.stack([np.bincount(p.ravel(), minlength=256) for p in image.contiguous().numpy()])


def copy_image(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for uint8 CPU ``C x H x W`` tensors; planar to channels-last and back in C where installed."""
    if (
        native.imageops_available()
        and dst.dtype == src.dtype == torch.uint8
        and dst.device.type == src.device.type == "cpu"
        and dst.dim() == 3
        and dst.shape == src.shape
    ):
        c, h, w = src.shape
        planar, interleaved = (h * w, w, 1), (1, w * c, c)
        kinds = (tuple(src.stride()), tuple(dst.stride()))
        assert native.jpegroi is not None
        if kinds == (planar, interleaved):  # out of the transform into a channels-last batch slot
            native.jpegroi.transpose(src.numpy(), dst.permute(1, 2, 0).numpy(), c, h * w)
            return
        if kinds == (interleaved, planar):  # out of the slot, for the transform
            native.jpegroi.transpose(src.permute(1, 2, 0).numpy(), dst.numpy(), h * w, c)
            return
    dst.copy_(src)  # any other layouts: torch's copy
