"""A plain torch ``Dataset`` over an image folder that returns whole uint8 batches."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.loading.index import FileIndex, scan_image_folder

__all__ = ["ImageFolderDataset"]


class ImageFolderDataset(AugmentedImageDataset):
    """Images under ``root/<class>/`` with torchvision ``ImageFolder``'s class-to-index mapping.

    Each sample is decoded straight into its resized crop (see :mod:`lightning_fastdata.loading.decode`):
    ``RandomResizedCrop(image_size)`` + horizontal flip when ``train``, else the central crop of
    ``Resize(image_size / crop_fraction) + CenterCrop(image_size)``. Items are uint8 ``3 x S x S`` tensors;
    ``__getitems__`` returns a whole batch ``(images N x 3 x S x S uint8, labels N int64)``, which the
    loaders of this package pass through without another copy. Normalise on the device, after transfer.
    Keys and augmentation are described in :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`.

    Args:
        root: Folder of class sub-folders, or a prebuilt :class:`FileIndex`.
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`
            (``train``, ``image_size``, ``scale``, ``ratio``, ``crop_fraction``, ``seed``, ``on_corrupt``:
            ``"raise"`` names a corrupt file, ``"skip"`` logs it, leaves it out of its batch and counts it).

    Raises:
        ValueError: On an impossible argument.
        FileNotFoundError: If ``root`` is missing, has no class folder, or a class has no image.
    """

    def __init__(self, root: str | FileIndex, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = root if isinstance(root, FileIndex) else scan_image_folder(os.fspath(root))

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a label is a position in this tuple."""
        return self.index.classes

    @property
    def targets(self) -> np.ndarray:
        """All labels, in sample order (torchvision's name)."""
        return self.index.labels

    def describe(self, index: int) -> str:
        """The file's path."""
        return self.index.path(index)

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """Read each file's bytes; a file that cannot be read is returned as its error."""
        sources: list[Source] = []
        for index in indices:
            try:
                with open(self.index.path(int(index)), "rb") as f:
                    sources.append(f.read())
            except OSError as err:
                sources.append(err)  # raised (or skipped) when its turn comes
        return sources
