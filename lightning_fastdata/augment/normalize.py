"""Turn uint8 image batches into normalised float on whatever device they are on.

On the CPU (a CPU-only training step, the benchmarks' "CPU normalise" rows) the float batch is 4x the bytes of
the uint8 one, 77 MB for 128 images at 224 px, in memory fresh from the kernel: glibc maps such a block anew for
each batch and each of its 4 KiB pages faults and is zeroed on first write, which cost more than the arithmetic
(0.367 ms per image on one core; 0.161 into memory written before; ``benchmarks/normalise.py``). So the output is
allocated with transparent huge pages advised (``madvise(MADV_HUGEPAGE)``, Linux; where the kernel's THP setting
is ``never``, or elsewhere, nothing changes): 512x fewer faults, 0.188 ms. Then a conversion, a multiply and an
add, the same operations (and so the same bits) as before. Nothing is reused between batches, so a batch the
caller keeps is never overwritten.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from typing import Any

import torch

from lightning_fastdata.errors import InvalidTypeError, InvalidValueError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Normalizer"]

#: torchvision's ImageNet statistics, on the 0-1 scale users know.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalizer:
    """``(x / 255 - mean) / std`` for uint8 ``N x 3 x H x W`` batches, as one multiply and one add.

    Scale and shift tensors are cached per device and dtype, so no host-to-device copy happens per batch.
    The output keeps the input's memory format (channels-last in, channels-last out).

    Args:
        mean: Per-channel mean on the 0-1 scale.
        std: Per-channel standard deviation on the 0-1 scale.
        dtype: Floating dtype of the output.
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if len(mean) != 3 or len(std) != 3:
            raise InvalidValueError(f"mean and std should have 3 values (RGB), got mean={mean!r}, std={std!r}.")
        if any(s <= 0 for s in std):
            raise InvalidValueError(f"std values should be positive, got {std!r}.")
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.dtype = dtype
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, self.dtype)
        if key not in self._cache:
            std = torch.tensor(self.std, dtype=torch.float64)
            mean = torch.tensor(self.mean, dtype=torch.float64)
            scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1)
            shift = (-mean / std).view(1, 3, 1, 1)
            self._cache[key] = (scale.to(device, self.dtype), shift.to(device, self.dtype))
        return self._cache[key]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Normalise a batch of pixel values on the 0-255 scale: uint8 (copied) or float (in place)."""
        if images.dtype != torch.uint8 and not images.is_floating_point():
            raise InvalidTypeError(f"Normalizer expects uint8 or float pixel values (0-255), got {images.dtype}.")
        scale, shift = self._constants(images.device)
        if images.dtype == torch.uint8 and images.device.type == "cpu":
            out = torch.empty_like(images, dtype=self.dtype)  # the input's memory format (channels-last stays)
            advise_huge_pages(out)
            return out.copy_(images).mul_(scale).add_(shift)
        return images.to(self.dtype).mul_(scale).add_(shift)

    def denormalize(self, images: torch.Tensor) -> torch.Tensor:
        """Map normalised floats back to uint8 (for showing a batch)."""
        scale, shift = self._constants(images.device)
        return ((images.to(self.dtype) - shift) / scale).round_().clamp_(0, 255).to(torch.uint8)


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_madvise: Any = None  # None: not looked up yet; False: not available


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask the kernel for transparent huge pages under ``tensor``'s memory, before it is first written.

    Only the 2 MiB-aligned part inside the tensor is advised (never a neighbour's memory); tensors under 4 MiB are
    left alone. Returns whether the advice was given (Linux with ``madvise``); the kernel may still use small
    pages (THP ``never``, no free huge page), which only costs the faults this avoids.
    """
    global _madvise
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes < 2 * _HUGE_PAGE or tensor.device.type != "cpu" or not sys.platform.startswith("linux"):
        return False
    if _madvise is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    if _madvise is False:
        return False
    ptr = storage.data_ptr()
    start = -(-ptr // _HUGE_PAGE) * _HUGE_PAGE
    end = (ptr + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    return end > start and _madvise(start, end - start, _MADV_HUGEPAGE) == 0
