"""A user's per-sample transform, run in the loader workers with its randomness taken from the sample's key.

The contract (the Training recipes page of the docs says the same): the transform receives one sample as a
contiguous uint8 ``3 x S x S`` tensor, its own copy (``S`` is the DataModule's ``image_size``; already decoded,
cropped, resized and flipped), and returns a uint8 tensor of that same shape. It may be any callable: a
``torchvision.transforms.v2`` transform, a ``Compose`` of them, a plain function. It may not change the size or the
dtype (normalisation happens on the training device, after transfer), and its randomness must come from torch's
global generator (what every torchvision transform uses), which is seeded from ``(seed, epoch, index, repeat)``
around each call and put back afterwards: the same sample gets the same pixels whatever the worker count, the world
size, or a resume. Randomness from Python's ``random`` or numpy's global generator is not seeded (it would differ
per worker).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_fastdata.augment.kernels import copy_image
from lightning_fastdata.augment.keyed import sample_seed
from lightning_fastdata.augment.worker import accelerate
from lightning_fastdata.errors import InvalidTypeError

__all__ = ["SampleTransform", "describe_transform"]

#: A key's stream for the user's transform (the crop and flip draw theirs from the same key, on their own stream).
_STREAM = 0x7F1


def describe_transform(transform: Any) -> str:
    """A short name for messages: the class name, or a function's qualified name."""
    name = getattr(transform, "__qualname__", None) or type(transform).__name__
    return str(name)


class SampleTransform:
    """Apply ``transform`` to one sample with torch's generator seeded from the sample's key; check the result.

    Args:
        transform: Any callable taking and returning a uint8 ``3 x S x S`` tensor.
        seed: The dataset's seed.
        what: The argument's name, for messages (``"train_transforms"``).

    Raises:
        TypeError: If ``transform`` is not callable.
    """

    def __init__(self, transform: Callable[[torch.Tensor], Any], seed: int, what: str = "train_transforms") -> None:
        if not callable(transform):
            raise InvalidTypeError(
                f"{what} should be a callable (a torchvision.transforms.v2 transform, a Compose, a function), got "
                f"{type(transform).__name__}."
            )
        self.transform = accelerate(transform)  # torchvision's policies with faster kernels: the same pixels
        self.seed = int(seed)
        self.what = what

    def __call__(self, image: torch.Tensor, key: Sequence[int]) -> torch.Tensor:
        """Return the transformed ``image`` (``3 x S x S`` uint8) of the sample with key ``key``."""
        # the CPU generator only: what torchvision's transforms draw from (torch.manual_seed also seeds every
        # accelerator's, lazily: 0.4 ms a call, more than most transforms)
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(sample_seed(self.seed, key, _STREAM))
        try:
            out = self.transform(image)
        finally:
            generator.set_state(state)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or tuple(out.shape) != tuple(image.shape):
            got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
            raise InvalidTypeError(
                f"{self.what} ({describe_transform(self.transform)}) returned {got} for a uint8 "
                f"{tuple(image.shape)} sample; it should return uint8 of the same shape. Leave out "
                "ToDtype/Normalize/ToTensor (the DataModule normalises on the device) and resizes or crops (set "
                "image_size, scale and ratio instead); batch ops such as MixUp/CutMix go in batch_transforms."
            )
        return out

    def apply_into(self, image: torch.Tensor, key: Sequence[int]) -> None:
        """Transform ``image`` in place (any strides: a slot of a channels-last batch).

        The transform gets a contiguous copy; the copies in and out are one pass each in C where the compiled
        kernels are installed (torch's permuted uint8 copies cost 0.15-0.25 ms each per 176 px crop).
        """
        planar = torch.empty(image.shape, dtype=image.dtype)
        copy_image(planar, image)
        copy_image(image, self(planar, key))
