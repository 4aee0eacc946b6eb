"""A user's ``torchvision.transforms.v2`` transform on each detection sample, its boxes following by ``tv_tensors``.

``DetectionDataModule(train_transforms=...)`` runs it in the loader workers after the recipe's window: it gets the
sample as torchvision's detection transforms take one, ``(tv_tensors.Image, {"boxes": tv_tensors.BoundingBoxes
(XYXY, the image's canvas), "labels": ..., "iscrowd": ...})``, and returns the same structure (any v2 transform or
``Compose`` does: the boxes follow every geometric step by torchvision's own dispatch). Its randomness comes from
torch's generator, seeded from ``(seed, epoch, index, repeat)`` around each call and put back after, so a resumed run
makes the same samples. Afterwards the boxes are clamped to the image and those under ``min_size`` pixels dropped
with their labels (``SanitizeBoundingBoxes``' rule); the image stays uint8 and may change size (the batch pads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_fastdata.augment.keyed import sample_seed
from lightning_fastdata.augment.sample import describe_transform
from lightning_fastdata.errors import InvalidTypeError
from lightning_fastdata.sources.window import Window

__all__ = ["BoxTransform", "TransformedRecipe"]

#: A key's stream for the user's detection transform.
_STREAM = 0x7F2


class BoxTransform:
    """Apply ``transform`` to one image and its target with torch's generator seeded from the key (docstring).

    Args:
        transform: A ``torchvision.transforms.v2`` transform (or any callable of ``(image, target)``).
        seed: The DataModule's seed.
        min_size: Boxes narrower or lower than this after the transform are dropped.

    Raises:
        TypeError: If ``transform`` is not callable.
    """

    def __init__(self, transform: Callable[..., Any], seed: int, min_size: float = 1.0) -> None:
        if not callable(transform):
            raise InvalidTypeError(
                f"train_transforms should be a torchvision.transforms.v2 transform (or a callable of image and "
                f"target), got {type(transform).__name__}."
            )
        self.transform, self.seed, self.min_size = transform, int(seed), float(min_size)

    def __call__(
        self, key: Sequence[int], image: torch.Tensor, target: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The transformed ``image`` (uint8 ``3 x H x W``) and target (boxes clamped, the degenerate dropped)."""
        from torchvision import tv_tensors

        h, w = int(image.shape[-2]), int(image.shape[-1])
        sample = (tv_tensors.Image(image.contiguous()),
                  {"boxes": tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=(h, w)),
                   "labels": target["labels"], "iscrowd": target["iscrowd"]})  # fmt: skip
        if "masks" in target:  # instance masks follow the geometric steps as tv_tensors.Mask
            sample[1]["masks"] = tv_tensors.Mask(target["masks"])
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(sample_seed(self.seed, key, _STREAM))
        try:
            out = self.transform(*sample)
        finally:
            generator.set_state(state)
        picture, kept = self._checked(out, image)
        for field in ("image_id", "orig_size"):  # what the image is, whatever the transform did to it
            if field in target:
                kept[field] = target[field]
        return picture, kept

    def _checked(self, out: Any, image: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ok = isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) and "boxes" in out[1]
        picture = out[0] if ok else None
        if not (isinstance(picture, torch.Tensor) and picture.dtype == torch.uint8 and picture.ndim == 3):
            raise InvalidTypeError(
                f"train_transforms ({describe_transform(self.transform)}) should return (uint8 3 x H x W image, target "
                "dict with its boxes), as torchvision's v2 transforms do for (tv_tensors.Image, {'boxes': "
                "BoundingBoxes, ...}); leave out ToDtype/Normalize (the DataModule normalises on the device)."
            )
        target = out[1]
        h, w = int(picture.shape[-2]), int(picture.shape[-1])
        boxes = target["boxes"].as_subclass(torch.Tensor).to(torch.float32).reshape(-1, 4)
        boxes = torch.stack([boxes[:, 0].clamp(0, w), boxes[:, 1].clamp(0, h), boxes[:, 2].clamp(0, w),
                             boxes[:, 3].clamp(0, h)], dim=1)  # fmt: skip
        keep = ((boxes[:, 2] - boxes[:, 0]) >= self.min_size) & ((boxes[:, 3] - boxes[:, 1]) >= self.min_size)
        labels, crowds = target["labels"], target["iscrowd"]
        if len(labels) != len(boxes) or len(crowds) != len(boxes):
            raise InvalidTypeError(
                f"train_transforms ({describe_transform(self.transform)}) returned {len(boxes)} boxes and "
                f"{len(labels)} labels: a step that drops boxes should drop their labels (SanitizeBoundingBoxes "
                "does, with labels_getter finding 'labels')."
            )
        picture = picture.as_subclass(torch.Tensor).contiguous()
        kept = {"boxes": boxes[keep].contiguous(), "labels": labels[keep], "iscrowd": crowds[keep]}
        if "masks" in target:
            kept["masks"] = target["masks"].as_subclass(torch.Tensor)[keep].to(torch.uint8).contiguous()
        return picture, kept


@dataclass(frozen=True)
class TransformedRecipe:
    """A detection recipe followed by a user's transform: the recipe's window and pixel step, then ``after``."""

    recipe: Any
    after: BoxTransform

    def draws(self, seed: int, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """The recipe's numbers."""
        return list(self.recipe.draws(seed, keys))

    def window(self, draws: np.ndarray | None, width: int, height: int, value: Any) -> Window:
        """The recipe's window."""
        return self.recipe.window(draws, width, height, value)

    def paint(self, draws: np.ndarray | None, pixels: torch.Tensor) -> torch.Tensor:
        """The recipe's pixel step, where it has one."""
        paint = getattr(self.recipe, "paint", None)
        return pixels if paint is None else paint(draws, pixels)
