"""The training device's part of a recipe: per-sample policies, normalisation, then batch transforms.

``device_transforms`` run on the uint8 batch (``N x 3 x S x S``) right after transfer: per-sample policies
(:class:`~lightning_fastdata.augment.batched.TrivialAugmentWide`, ``RandAugment``; torchvision's own
objects are turned into these). Then the batch is normalised to float. Then ``batch_transforms`` run with the
labels: ``RandomErasing`` (per sample), and anything that takes ``(images, labels)`` and returns them, such as
``torchvision.transforms.v2.MixUp``/``CutMix``/``RandomChoice``. Before the first of those, the labels become
one-hot float targets (``N x C``) when the number of classes is known, so ``v2.MixUp(alpha=0.2)`` needs no
``num_classes``; multi-hot rows (several labels per image) become float as they are. MixUp and CutMix make them
soft.

Randomness: our policies draw from the samples' keys, each entry of the pipeline its own numbers (two
``RandomErasing`` entries erase two boxes, as torchvision's two objects do: the first of a kind draws as it always
has, a later one of the same kind from a seed of its place); any other transform runs with torch's generators (CPU and
the batch's device) seeded from the batch's keys and put back afterwards, so MixUp's ``lambda`` and CutMix's box
are the same for the same batch in every run, resumed or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_fastdata.augment.batched import KeyedTransform, to_batched
from lightning_fastdata.augment.keyed import batch_seed, sample_seed
from lightning_fastdata.errors import InvalidTypeError

__all__ = ["DeviceAugment", "as_transform_list", "mixable_targets"]


def as_transform_list(value: Any, what: str) -> list[Any]:
    """``None``, one transform or a list of them, as a list (torchvision objects turned into batched twins).

    Raises:
        TypeError: If an entry is not callable (naming the argument and the entry).
    """
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if not callable(item):
            raise InvalidTypeError(
                f"{what} should hold callables (torchvision.transforms.v2 objects, lightning_fastdata.augment ops, "
                f"functions), got {type(item).__name__}."
            )
    return [to_batched(item) for item in items]


def mixable_targets(labels: torch.Tensor, num_classes: int | None, dtype: torch.dtype) -> torch.Tensor:
    """``labels`` as the rows a mixing blends, in ``dtype``.

    Class positions one-hot (with ``num_classes``), multi-hot rows as they are; float rows unchanged. On the CPU by
    ``one_hot`` (which refuses a label out of range); on a device by a comparison: the same 0/1 values, with no range
    check that would wait for the device (and capturable in a CUDA graph).
    """
    if labels.dim() == 1 and num_classes is not None:
        if labels.device.type == "cpu":
            return torch.nn.functional.one_hot(labels, num_classes).to(dtype)
        return (labels.unsqueeze(1) == torch.arange(num_classes, device=labels.device)).to(dtype)
    if labels.dim() == 2 and not labels.is_floating_point():  # multi-hot rows: mixed as they are
        return labels.to(dtype)
    return labels


def _seeded(fn: Callable[..., Any], seed: int, device: torch.device, *args: Any) -> Any:
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(seed)
        return fn(*args)


class DeviceAugment:
    """Run ``device_transforms``, normalise, run ``batch_transforms``; on whatever device the batch is on.

    Args:
        device_transforms: Per-sample policies on the uint8 batch (before normalisation).
        batch_transforms: Transforms of ``(images, labels)`` after normalisation.
        seed: The DataModule's seed.
    """

    def __init__(self, device_transforms: Sequence[Any], batch_transforms: Sequence[Any], seed: int) -> None:
        self.device_transforms = list(device_transforms)
        self.batch_transforms = list(batch_transforms)
        self.seed = int(seed)
        # each keyed entry's seed: the seed for the first entry of a stream, one of its place for a later one
        seen: dict[int, int] = {}
        self._seeds: list[int] = []
        for t in [*self.device_transforms, *self.batch_transforms]:
            stream = int(getattr(t, "stream", 0))
            k = seen[stream] = seen.get(stream, -1) + 1
            self._seeds.append(self.seed if k == 0 else sample_seed(self.seed, [k], stream))

    def __bool__(self) -> bool:
        return bool(self.device_transforms or self.batch_transforms)

    def __call__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        keys: torch.Tensor,
        normalize: Callable[[torch.Tensor], torch.Tensor],
        num_classes: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the augmented, normalised ``images`` and the (possibly soft) targets."""
        after = len(self.device_transforms)
        for i, t in enumerate(self.device_transforms):
            if isinstance(t, KeyedTransform):
                images = t(images, keys, self._seeds[i])
            else:
                images = _seeded(t, batch_seed(self.seed, keys, 100 + i), images.device, images)
        images = normalize(images)
        for i, t in enumerate(self.batch_transforms):
            if isinstance(t, KeyedTransform):
                images = t(images, keys, self._seeds[after + i])
            else:
                labels = mixable_targets(labels, num_classes, images.dtype)
                images, labels = _seeded(t, batch_seed(self.seed, keys, 200 + i), images.device, images, labels)
        return images, labels
