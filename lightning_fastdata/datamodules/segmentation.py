"""``SegmentationDataModule``: images and masks from a VOC-style folder, with the loaders every module has.

Issue 63, first part: the folder source (:class:`~lightning_fastdata.datasets.segmentation.SegmentationFolderDataset`)
through this package's loaders (stateful, sharded, resumable, workers, pinned memory), its batches normalised on the
device with their masks made ``int64`` there. Sampling settings, mixes and the other sources come later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.augment.segmentation import IGNORE_INDEX
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.segmentation import SegmentationFolderDataset
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.batch import Batch

__all__ = ["SegmentationDataModule"]


class SegmentationDataModule(FastDataModule):
    """Train and validate on a VOC-style segmentation folder as torchvision's segmentation reference does.

    Training batches: the reference's random resize (0.5-2x ``base_size``), flip and ``crop_size`` crop, the image's
    crop decoded alone and its mask sampled through the same window; validation at ``base_size``, padded to the
    batch's largest image (images 0, masks ``ignore_index``). On the device the images become normalised floats and
    the masks ``int64``: ``images, masks = batch`` in ``training_step``.

    Args:
        root: The folder (``JPEGImages``, ``SegmentationClass``, ``ImageSets/Segmentation``).
        num_classes: The classes the masks hold (VOC: 21).
        class_names: Their names, in index order; ``None``: the numbers.
        base_size: The reference's base size (520).
        crop_size: The training crop (480).
        hflip_prob: The training flip's probability.
        train_split: The split list ``ImageSets/Segmentation/<train_split>.txt`` trained on.
        val_split: The split validated on, or ``None``.
        test_split: The split ``trainer.test`` reads, or ``None``.
        ignore_index: The mask value of borders and padding (the loss ignores it).
        **kwargs: Loader arguments of :class:`FastDataModule` (``batch_size``, ``num_workers``, ``seed``, ...).

    Raises:
        ValueError: On a bad argument, or sampling settings (not supported here yet).
    """

    test_argument = "test_split"

    def __init__(
        self,
        root: str,
        num_classes: int = 21,
        class_names: list[str] | None = None,
        base_size: int = 520,
        crop_size: int = 480,
        hflip_prob: float = 0.5,
        train_split: str = "train",
        val_split: str | None = "val",
        test_split: str | None = None,
        ignore_index: int = IGNORE_INDEX,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("image_size", crop_size)
        kwargs.setdefault("val_fraction", 0.0)
        super().__init__(**kwargs)
        save_init_hparams(self)
        if self.sampling.changes_draws or self.sampling.subsets:
            raise InvalidValueError(
                "SegmentationDataModule takes no sampling settings yet (sample_weights, epoch_size, classes, "
                "max_per_class, fraction): an image holds several classes, so they need a per-pixel definition."
            )
        if class_names is not None and len(class_names) != num_classes:
            raise InvalidValueError(f"class_names names {len(class_names)} classes, num_classes is {num_classes}.")
        self.root = os.fspath(root)
        self.classes = tuple(class_names) if class_names is not None else tuple(str(k) for k in range(num_classes))
        self.settings_of_windows: dict[str, Any] = dict(
            num_classes=num_classes, base_size=base_size, crop_size=crop_size, hflip_prob=hflip_prob,
            ignore_index=ignore_index,
        )  # fmt: skip
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        self.ignore_index = ignore_index

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    def _dataset(self, split: str, train: bool) -> SegmentationFolderDataset:
        return SegmentationFolderDataset(self.root, split, train=train, seed=self.seed, **self.settings_of_windows)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """The training split, and the validation split if its list exists."""
        val = None
        if self.val_split is not None:
            if (Path(self.root) / "ImageSets" / "Segmentation" / f"{self.val_split}.txt").is_file():
                val = self._dataset(self.val_split, False)
        return self._dataset(self.train_split, True), val

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_split``'s samples at the base size (``None`` without ``test_split``)."""
        return None if self.test_split is None else self._dataset(self.test_split, False)

    @override
    def _after_transfer(self, batch: Any) -> Any:
        """Normalised float images and ``int64`` masks, on the device."""
        out = self.transfer.after_transfer(batch, None)  # the images normalised (channels-last by default)
        return Batch(out[0], out[1].long())
