"""``ImageFolderDataModule``: a folder of class sub-folders of images, decoded fast."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.loading.index import FileIndex, find_classes, scan_image_folder

__all__ = ["FolderSource", "ImageFolderDataModule"]


class FolderSource:
    """A training folder of class sub-folders and an optional validation folder with the same classes.

    Shared by :class:`ImageFolderDataModule` and the tensor cache module. Only the class folders are listed
    here (cheap), so that LightningCLI can link ``num_classes`` and a wrong path fails before training starts;
    the full scan happens in :meth:`indexes`.

    Args:
        root: Training folder.
        val_root: Validation folder, or ``None`` to split ``root``.

    Raises:
        FileNotFoundError: If a folder is missing or holds no class folder.
        ValueError: If the two folders have different class folders.
    """

    def __init__(self, root: str, val_root: str | None = None) -> None:
        self.root = os.fspath(root)
        self.val_root = None if val_root is None else os.fspath(val_root)
        self.classes = find_classes(self.root)
        if self.val_root is not None:
            val_classes = find_classes(self.val_root)
            if val_classes != self.classes:
                raise ValueError(
                    f"val_root {self.val_root!r} has class folders {list(val_classes)} but root {self.root!r} has "
                    f"{list(self.classes)}; both need the same class folders."
                )

    def indexes(
        self, split: Callable[[int], tuple[np.ndarray, np.ndarray | None]]
    ) -> tuple[FileIndex, FileIndex | None]:
        """Scan once; return ``(train, val)`` indexes: ``val_root``'s, or ``split`` of ``root``'s rows."""
        index = scan_image_folder(self.root, self.classes)
        if self.val_root is not None:
            return index, scan_image_folder(self.val_root, self.classes)
        train_rows, val_rows = split(len(index))
        return index.subset(train_rows), None if val_rows is None else index.subset(val_rows)


class ImageFolderDataModule(FastDataModule):
    """Train (and validate) from ``root/<class>/<image>``, with torchvision ``ImageFolder``'s labels.

    Training samples get ``RandomResizedCrop(image_size, scale, ratio)`` and a horizontal flip, decoded
    straight into the crop; validation samples the classic ``Resize(image_size / crop_fraction)`` +
    ``CenterCrop(image_size)``. Validation comes from ``val_root`` (same class folders) or, if it is not
    given, from a seeded split of ``val_fraction`` of ``root``.

    Args:
        root: Folder of class sub-folders.
        val_root: Validation folder of the same class sub-folders; default: split ``root`` by ``val_fraction``.
        **kwargs: Augmentation, split and loader arguments of :class:`FastDataModule` (``image_size``,
            ``batch_size``, ``num_workers``, ...).

    Raises:
        FileNotFoundError: If ``root`` (or ``val_root``) is missing or holds no class folder.
        ValueError: On an impossible argument.
    """

    def __init__(self, root: str, val_root: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.source = FolderSource(root, val_root)
        self.classes = self.source.classes

    @property
    def num_classes(self) -> int:
        """Number of class folders."""
        return len(self.classes)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Scan the folder(s) once and build the train and validation datasets."""
        train_index, val_index = self.source.indexes(self.split)
        train = ImageFolderDataset(train_index, train=True, **self.dataset_kwargs)
        val = None if val_index is None else ImageFolderDataset(val_index, train=False, **self.dataset_kwargs)
        return train, val
