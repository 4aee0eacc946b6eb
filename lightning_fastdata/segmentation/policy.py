"""The device policies on images and their masks: geometric ops move both, colour ops the image alone.

``SegmentationDataModule(device_transforms=TrivialAugmentWide())`` runs the package's batched policies
(:class:`~lightning_fastdata.augment.batched.TrivialAugmentWide`, ``RandAugment``) on the training device as the
classification modules do, each sample's op and magnitude drawn from its key. A sample that draws a geometric op
(``ShearX``/``ShearY``/``TranslateX``/``TranslateY``/``Rotate``) has its mask warped by the very same affine map,
sampled by nearest neighbour, the area the warp brings in from outside the image filled with ``ignore_index``; a
colour op (brightness, solarize, equalize, ...) leaves the mask as it is. ``ColorJitter`` touches images only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lightning_fastdata.augment.batched import _WARPS, ColorJitter, _apply_grouped, _apply_warps, _Policy
from lightning_fastdata.augment.keyed import sample_seed
from lightning_fastdata.errors import InvalidTypeError

__all__ = ["SegmentationDeviceAugment", "policy_with_masks"]


def policy_with_masks(
    policy: _Policy, images: torch.Tensor, masks: torch.Tensor, keys: torch.Tensor, seed: int, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy`` on a uint8 batch and its masks (``N x H x W``, uint8): warps on both, colour ops on images only."""
    height, width = images.shape[-2:]
    warped = masks.unsqueeze(1)
    for op_names, magnitude in policy.params(keys, seed, height, width):
        images = policy._apply_round_grouped(op_names, magnitude, images)
        groups = ["warp" if name in _WARPS else "keep" for name in op_names]

        if "warp" in groups:
            warped = _apply_grouped(warped, groups, _mask_warps(op_names, magnitude, ignore_index))
    return images, warped.squeeze(1)


def _mask_warps(op_names: list[str], magnitude: torch.Tensor, ignore_index: int) -> Any:
    """What :func:`_apply_grouped` applies to the masks of a round: the samples' warps, nearest, filled ignored."""

    def apply(group: str, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        if group != "warp":
            return None
        picked = [op_names[i] for i in rows.tolist()]
        return _apply_warps(picked, x, magnitude[rows], float(ignore_index), "nearest")

    return apply


class SegmentationDeviceAugment:
    """A segmentation module's ``device_transforms``: each in turn on the uint8 images and their masks.

    Args:
        transforms: The package's policies (``TrivialAugmentWide``, ``RandAugment``) and ``ColorJitter``.
        seed: The DataModule's seed (each entry draws from its own, as the classification pipeline's do).
        ignore_index: The mask value of what a warp brings in from outside the image.

    Raises:
        TypeError: For any other transform (a transform that does not know masks would leave them behind).
    """

    def __init__(self, transforms: Sequence[Any], seed: int, ignore_index: int) -> None:
        for t in transforms:
            if not isinstance(t, (_Policy, ColorJitter)):
                raise InvalidTypeError(
                    f"device_transforms of a SegmentationDataModule takes lightning_fastdata.augment's "
                    f"TrivialAugmentWide, RandAugment (their geometric ops move the masks too) and ColorJitter, got "
                    f"{type(t).__name__}: a transform that does not know masks would leave them behind."
                )
        self.transforms = list(transforms)
        self.ignore_index = ignore_index
        seen: dict[int, int] = {}
        self._seeds: list[int] = []
        for t in self.transforms:
            stream = int(getattr(t, "stream", 0))
            k = seen[stream] = seen.get(stream, -1) + 1
            self._seeds.append(int(seed) if k == 0 else sample_seed(int(seed), [k], stream))

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def __call__(
        self, images: torch.Tensor, masks: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The augmented uint8 images and their masks."""
        for t, seed in zip(self.transforms, self._seeds):
            if isinstance(t, _Policy):
                images, masks = policy_with_masks(t, images, masks, keys, seed, self.ignore_index)
            else:
                images = t(images, keys, seed)
        return images, masks
