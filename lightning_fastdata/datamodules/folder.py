"""``ImageFolderDataModule``: a folder of class sub-folders of images, decoded fast."""

from __future__ import annotations

import os
from typing import Literal

import numpy as np
from torch.utils.data import Dataset

from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.loading.index import find_classes, scan_image_folder
from lightning_fastdata.loading.normalize import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["ImageFolderDataModule"]


class ImageFolderDataModule(FastDataModule):
    """Train (and validate) from ``root/<class>/<image>``, with torchvision ``ImageFolder``'s labels.

    Training samples get ``RandomResizedCrop(image_size, scale, ratio)`` and a horizontal flip, decoded
    straight into the crop; validation samples the classic ``Resize(image_size / crop_fraction)`` +
    ``CenterCrop(image_size)``. Validation comes from ``val_root`` (same class folders) or, if it is not
    given, from a seeded split of ``val_fraction`` of ``root``.

    Args:
        root: Folder of class sub-folders.
        val_root: Validation folder of the same class sub-folders; default: split ``root``.
        val_fraction: Fraction of ``root`` held out for validation when ``val_root`` is not given; 0 for none.
        image_size: Side of the square training and validation images.
        scale: Area range of the random crop (``RandomResizedCrop``'s ``scale``).
        ratio: Aspect-ratio range of the random crop.
        crop_fraction: Validation crop as a fraction of the shorter side (0.875: 224 out of 256).
        on_corrupt: ``"raise"`` on a corrupt or truncated image (naming it), or ``"skip"`` it: each skipped file
            is logged and the count is reported after every epoch.
        batch_size: See :class:`FastDataModule`.
        num_workers: See :class:`FastDataModule`.
        pin_memory: See :class:`FastDataModule`.
        persistent_workers: See :class:`FastDataModule`.
        prefetch_factor: See :class:`FastDataModule`.
        shuffle: See :class:`FastDataModule`.
        drop_last: See :class:`FastDataModule`.
        seed: See :class:`FastDataModule`.
        mean: See :class:`FastDataModule`.
        std: See :class:`FastDataModule`.
        in_order: See :class:`FastDataModule`.
        snapshot_every_n_steps: See :class:`FastDataModule`.

    Raises:
        FileNotFoundError: If ``root`` (or ``val_root``) is missing or holds no class folder.
        ValueError: On an impossible argument.
    """

    def __init__(
        self,
        root: str,
        val_root: str | None = None,
        val_fraction: float = 0.1,
        image_size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        crop_fraction: float = 0.875,
        on_corrupt: Literal["raise", "skip"] = "raise",
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        in_order: bool = True,
        snapshot_every_n_steps: int = 1,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            mean=mean,
            std=std,
            in_order=in_order,
            snapshot_every_n_steps=snapshot_every_n_steps,
        )
        self.save_hyperparameters()
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction should be in [0, 1), got {val_fraction!r}.")
        if image_size <= 0:
            raise ValueError(f"image_size should be a positive int, got {image_size!r}.")
        self.root = os.fspath(root)
        self.val_root = None if val_root is None else os.fspath(val_root)
        self.val_fraction = val_fraction
        # Only the class folders are listed here (cheap), so that LightningCLI can link num_classes and a
        # wrong path fails before training starts; the full scan happens once, in setup().
        self.classes = find_classes(self.root)
        if self.val_root is not None:
            val_classes = find_classes(self.val_root)
            if val_classes != self.classes:
                raise ValueError(
                    f"val_root {self.val_root!r} has class folders {list(val_classes)} but root {self.root!r} has "
                    f"{list(self.classes)}; both need the same class folders."
                )
        self._dataset_kwargs = dict(
            image_size=image_size,
            scale=scale,
            ratio=ratio,
            crop_fraction=crop_fraction,
            seed=seed,
            on_corrupt=on_corrupt,
        )

    @property
    def num_classes(self) -> int:
        """Number of class folders."""
        return len(self.classes)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Scan the folder(s) once and build the train and validation datasets."""
        index = scan_image_folder(self.root, self.classes)
        if self.val_root is not None:
            train_index, val_index = index, scan_image_folder(self.val_root, self.classes)
        elif self.val_fraction > 0:
            order = np.random.default_rng(self.seed).permutation(len(index))
            n_val = max(1, int(round(len(index) * self.val_fraction)))
            train_index, val_index = index.subset(np.sort(order[n_val:])), index.subset(np.sort(order[:n_val]))
        else:
            train_index, val_index = index, None
        train = ImageFolderDataset(train_index, train=True, **self._dataset_kwargs)  # type: ignore[arg-type]
        val = None if val_index is None else ImageFolderDataset(val_index, train=False, **self._dataset_kwargs)  # type: ignore[arg-type]
        return train, val
