"""``SegmentationFolderDataset``: images and their masks from a VOC-style folder, through one window each.

The layout is VOC's: ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (palette PNGs whose indices are the
classes, 255 on object borders) and ``ImageSets/Segmentation/<split>.txt`` listing a split's ids. Each sample's
image and mask go through one :class:`~lightning_fastdata.augment.segmentation.Window` (torchvision's segmentation
reference: a random resize, a flip and a padded crop in training; the base size in evaluation): the image decoded
only where the window needs it, the mask decoded once and sampled into the same place. A batch is a
:class:`~lightning_fastdata.loading.batch.Batch` of uint8 images ``N x 3 x H x W`` and uint8 masks ``N x H x W``
(evaluation batches padded to their largest image: images with 0, masks with the ignore index).

Issue 63, first part: the dataset and its checks; its DataModule, model and metrics come next.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from lightning_fastdata.augment.segmentation import (
    IGNORE_INDEX,
    Window,
    eval_window,
    render_mask,
    train_window,
    window_draws,
)
from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop

__all__ = ["SegmentationFolderDataset", "read_mask"]


def read_mask(data: bytes, name: str) -> np.ndarray:
    """A mask file's class indices (``H x W`` uint8): a palette or grey PNG's values as they are.

    Raises:
        DataError: For an RGB mask (its colours are not classes: give a palette PNG) or an unreadable file (named).
    """
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode not in ("P", "L"):
                raise DataError(
                    f"{name} is a {im.mode} mask: its pixels are colours, not classes. Give palette (P) or grey (L) "
                    "PNGs whose values are the class indices (VOC's SegmentationClass), or convert it with a colour "
                    "table first."
                )
            return np.asarray(im, dtype=np.uint8).copy()
    except OSError as err:
        raise DataError(f"{name} is not a readable mask ({err}).") from None


class SegmentationFolderDataset(Dataset):
    """A VOC-style folder's split as whole batches of images and masks (module docstring).

    Args:
        root: The folder (``JPEGImages``, ``SegmentationClass``, ``ImageSets/Segmentation``).
        split: The list ``ImageSets/Segmentation/<split>.txt`` names the ids of.
        num_classes: The classes a mask may hold (``0 .. num_classes - 1``, and ``ignore_index``).
        train: The reference's training window (random resize, flip, padded crop); else its evaluation (base size).
        base_size: The reference's base size (its ``--base-size``, 520).
        crop_size: The training crop (its ``--crop-size``, 480).
        hflip_prob: The flip's probability.
        seed: The seed every sample's window is drawn from, with its key ``(epoch, index, repeat)``.
        ignore_index: The mask value of borders and padding.

    Raises:
        FileNotFoundError: If the split's list or an image or mask it names is missing (named).
        ValueError: On a bad argument (named).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str = "train",
        num_classes: int = 21,
        train: bool = True,
        base_size: int = 520,
        crop_size: int = 480,
        hflip_prob: float = 0.5,
        seed: int = 0,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if not 0 < num_classes <= 255 or not 0 <= ignore_index <= 255 or ignore_index < num_classes:
            raise InvalidValueError(
                f"num_classes={num_classes!r} and ignore_index={ignore_index!r}: masks are uint8, so classes are "
                "0 .. num_classes - 1 below the ignore index (at most 255)."
            )
        if base_size < 1 or crop_size < 1:
            raise InvalidValueError(f"base_size and crop_size should be positive, got {base_size!r}, {crop_size!r}.")
        self.root = Path(root)
        listing = self.root / "ImageSets" / "Segmentation" / f"{split}.txt"
        if not listing.is_file():
            raise PathNotFoundError(f"{listing} does not exist: a VOC-style folder lists each split's ids there.")
        self.ids = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
        if not self.ids:
            raise InvalidValueError(f"{listing} lists no id.")
        for i in self.ids:
            for path in (self.image_path(i), self.mask_path(i)):
                if not path.is_file():
                    kind = "image" if path.suffix == ".jpg" else "mask"
                    raise PathNotFoundError(f"{listing} names {i!r}, whose {kind} {path} does not exist.")
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.train, self.base_size, self.crop_size = train, base_size, crop_size
        self.hflip_prob, self.seed = hflip_prob, seed

    def image_path(self, sample_id: str) -> Path:
        """Sample ``sample_id``'s image."""
        return self.root / "JPEGImages" / f"{sample_id}.jpg"

    def mask_path(self, sample_id: str) -> Path:
        """Sample ``sample_id``'s mask."""
        return self.root / "SegmentationClass" / f"{sample_id}.png"

    def __len__(self) -> int:
        return len(self.ids)

    def _key(self, key: Any) -> tuple[int, int, int]:
        if isinstance(key, (tuple, list)):
            full = (int(key[0]), int(key[1]), int(key[2]) if len(key) > 2 else 0)
        else:
            full = (0, int(key), 0)
        if not 0 <= full[1] < len(self):
            raise IndexError(f"index {full[1]} is out of range for a dataset of {len(self)} samples.")
        return full

    def _mask(self, sample_id: str, size: tuple[int, int]) -> np.ndarray:
        path = self.mask_path(sample_id)
        mask = read_mask(path.read_bytes(), str(path))
        if mask.shape != size:
            raise DataError(
                f"{path} is {mask.shape[1]}x{mask.shape[0]}, its image {self.image_path(sample_id)} is "
                f"{size[1]}x{size[0]}: a mask must be its image's size."
            )
        bad = (mask >= self.num_classes) & (mask != self.ignore_index)
        if bad.any():
            raise DataError(
                f"{path} holds the value {int(mask[bad].max())}, above the {self.num_classes} classes (and not the "
                f"ignore index {self.ignore_index}): give num_classes= the classes the masks use."
            )
        return mask

    def window(self, full_key: tuple[int, int, int], width: int, height: int) -> Window:
        """The sample's window: the training one drawn from its key, or the evaluation one."""
        if not self.train:
            return eval_window(width, height, self.base_size)
        draws = window_draws(self.seed, [full_key])[0]
        return train_window(draws, width, height, self.base_size, self.crop_size, hflip_prob=self.hflip_prob)

    def _sample(self, full_key: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        sample_id = self.ids[full_key[1]]
        path = self.image_path(sample_id)
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
        win = self.window(full_key, width, height)
        image = torch.zeros(3, *win.size, dtype=torch.uint8)
        top, left, ph, pw = win.place
        decode_resized_crop(data, image[:, top : top + ph, left : left + pw], lambda w, h: win.box, win.flip, str(path))
        mask = render_mask(self._mask(sample_id, (height, width)), win)
        if self.ignore_index != IGNORE_INDEX:
            mask[mask == IGNORE_INDEX] = self.ignore_index
        return image, mask

    def __getitems__(self, keys: Sequence[Any]) -> Batch:
        """A batch: images (uint8 ``N x 3 x H x W``) and masks (uint8 ``N x H x W``), padded to the largest."""
        samples = [self._sample(self._key(k)) for k in keys]
        h = max(int(image.shape[1]) for image, _ in samples)
        w = max(int(image.shape[2]) for image, _ in samples)
        images = torch.zeros(len(samples), 3, h, w, dtype=torch.uint8)
        masks = torch.full((len(samples), h, w), self.ignore_index, dtype=torch.uint8)
        for k, (image, mask) in enumerate(samples):
            images[k, :, : image.shape[1], : image.shape[2]] = image
            masks[k, : mask.shape[0], : mask.shape[1]] = mask
        return Batch(images, masks)

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(image, mask)`` of one sample."""
        images, masks = self.__getitems__([key])
        return images[0], masks[0]
