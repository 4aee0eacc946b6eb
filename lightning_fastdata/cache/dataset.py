"""The tensor cache: images decoded and resized once into uint8 ``.npy`` arrays, read by memory map.

Layout of ``cache_dir`` (format version 1; any tool that reads ``.npy`` can open it):

- ``train_images.npy``: uint8 ``N x S x S x 3``, the central square of each training image resized to
  ``S = cache_size`` (random resized crops are taken from it at training time);
- ``val_images.npy``: uint8 ``M x I x I x 3``, validation images already resized and center-cropped to
  ``I = image_size`` (``Resize(I / crop_fraction) + CenterCrop(I)``);
- ``train_labels.npy``, ``val_labels.npy``: int64;
- ``manifest.json``: ``format_version``, the build parameters, ``classes``, counts, a ``fingerprint`` of
  the source (sha256 of every file's relative path, size and mtime), and ``source``: the file list's sha256 and
  the mtimes of the folders holding the files, taken before the build decoded anything (what
  ``verify_source="folders"`` compares in ``O(folders)``; see
  :func:`~lightning_fastdata.cache.source.folders_unchanged`).

With ``storage="jpeg"`` (the compact cache, for data bigger than RAM) the arrays are replaced by ``train.h5`` and
``val.h5``: each image re-encoded once with its shorter side ``cache_size`` at JPEG ``quality``, in the
converter's encoded HDF5 layout (see :func:`~lightning_fastdata.convert_folder_to_hdf5`), decoded by the
region-of-interest path at training time; validation is resized and center-cropped when read.

Four modules, one job each: this one reads a split (:class:`TensorCacheDataset`); :mod:`.build` builds
(locked, resumable, renamed into place when complete); :mod:`.manifest` says whether a cache is current and
opens its splits; :mod:`.source` tells whether the source folder changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from lightning_fastdata.augment.geometry import flip_of, random_resized_crop_box
from lightning_fastdata.cache.build import build_tensor_cache, check_verify_source
from lightning_fastdata.cache.manifest import (
    CACHE_FORMAT_VERSION,
    CacheParams,
    open_jpeg_cache,
    open_tensor_cache,
    write_manifest,
)
from lightning_fastdata.datasets.arrays import MappedFile, gather_hwc
from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.batch import DeviceBatch, EncodedBatch
from lightning_fastdata.loading.index.identity import DataIdentity
from lightning_fastdata.loading.sampler import SampleKey
from lightning_fastdata.loading.transport.collate import empty_image_batch

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CacheParams",
    "TensorCacheDataset",
    "build_tensor_cache",
    "check_augment_on",
    "check_verify_source",
    "open_jpeg_cache",
    "open_tensor_cache",
    "write_manifest",
]


def check_augment_on(augment_on: str) -> None:
    """The one check of ``augment_on`` (the DataModule calls it in ``__init__``, the dataset in its own).

    Raises:
        ValueError: If it is neither ``"workers"`` nor ``"device"``.
    """
    if augment_on not in ("workers", "device"):
        raise InvalidValueError(f"augment_on should be 'workers' or 'device', got {augment_on!r}.")


class TensorCacheDataset(AugmentedImageDataset):
    """Samples of one split of a tensor cache, read by memory map, augmented without any decode.

    Training crops (``RandomResizedCrop`` + flip, per-sample randomness from ``(seed, epoch, index)``) are
    taken from the cached squares either here, in the workers (``augment_on="workers"``, uint8 resize), or on
    the training device after transfer (``augment_on="device"``: the batch is the whole cached squares plus
    the crop boxes and flips, cropped by the DataModule's ``on_after_batch_transfer`` in one batched op).

    Args:
        images_path: The split's ``*_images.npy``.
        labels: The split's labels.
        classes: Class names.
        train: Random crops if ``True``; stored validation crops (already at ``image_size``) if ``False``.
        image_size: Side of the output.
        augment_on: ``"workers"`` or ``"device"``.
        scale: Area range of the random crop.
        ratio: Aspect-ratio range of the random crop.
        seed: Seed of the per-sample augmentation.
        source: The fingerprint of the files the cache was built from (its manifest's): part of the identity a resume
            state checks (:meth:`make_identity`).
        transform: A per-sample transform after the crop (as the other datasets' ``transform``); not with
            ``augment_on="device"`` in training.
    """

    def __init__(
        self,
        images_path: str,
        labels: np.ndarray,
        classes: Sequence[str],
        train: bool = True,
        image_size: int = 224,
        augment_on: Literal["workers", "device"] = "workers",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        seed: int = 0,
        source: str = "",
        transform: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        # Validation crops were made at build time, so here they are only copied (crop_fraction 1, same size).
        super().__init__(train, image_size, scale, ratio, crop_fraction=1.0, seed=seed, transform=transform)
        if transform is not None and train and augment_on == "device":
            raise InvalidValueError(
                "A per-sample transform runs in the loader workers after the crop, and augment_on='device' crops on "
                "the device: use augment_on='workers' with train_transforms, or batched device ops in "
                "batch_transforms."
            )
        check_augment_on(augment_on)
        self.images_path = images_path
        labels = np.asarray(labels)
        self._labels = labels.astype(np.uint8) if labels.ndim == 2 else labels.astype(np.int64)  # multi-hot: uint8
        self.classes = tuple(classes)
        self.augment_on = augment_on
        self._signature = MappedFile.signature(images_path)
        self._images: np.ndarray | None = None
        self._mapped: MappedFile | None = None
        self.source = source

    per_process_attrs = ("_images", "_mapped")

    @property
    def targets(self) -> np.ndarray:
        """Labels of the split."""
        return self._labels

    def describe(self, index: int) -> str:
        """``file[index]``."""
        return f"{self.images_path}[{index}]"

    def make_identity(self) -> DataIdentity:
        """Each sample's position and label, the array file's size and the fingerprint of the files it was made of."""
        size = self._signature[0] if self._signature else 0
        return DataIdentity.of(self.images_path, super().make_identity().samples, f"cache|{self.source}|{size}")

    def _array(self) -> np.ndarray:
        """This process's memory map, after checking that the file was not changed under it (one ``fstat``)."""
        if not self._handles_open():
            self._mapped = MappedFile(self.images_path, self._signature, "Tensor cache file")
            self._images = np.load(self.images_path, mmap_mode="r")
            self._mark_handles_open()
        else:
            assert self._mapped is not None
            self._mapped.check()
        return self._images  # type: ignore[return-value]

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """One sorted gather from the memory map."""
        return list(gather_hwc(self._array().__getitem__, indices))

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> tuple[torch.Tensor, ...] | DeviceBatch | EncodedBatch:
        """Batches; with ``augment_on="device"`` in training: a ``DeviceBatch`` of squares with boxes and flips."""
        if not (self.train and self.augment_on == "device"):
            return super().__getitems__(keys)
        full_keys = [self._key(key) for key in keys]
        draws = self._crop_draws(full_keys)  # training: a row per sample, as the workers path draws them
        indices = np.fromiter((key[1] for key in full_keys), dtype=np.int64, count=len(full_keys))
        sources = gather_hwc(self._array().__getitem__, indices)
        side = int(sources[0].shape[-1])
        images = empty_image_batch(len(keys), side, side)
        boxes = torch.empty((len(keys), 4), dtype=torch.int64)
        flips = torch.empty(len(keys), dtype=torch.bool)
        for slot, (sample_draws, source) in enumerate(zip(draws, sources)):
            assert sample_draws is not None
            # the same draws as the workers path (AugmentedImageDataset._render)
            flips[slot] = flip_of(sample_draws)
            boxes[slot] = torch.tensor(random_resized_crop_box(sample_draws, side, side, self.scale, self.ratio))
            images[slot].copy_(source)
        return self._batch(images, self.labels_of(indices), full_keys, boxes=boxes, flips=flips)
