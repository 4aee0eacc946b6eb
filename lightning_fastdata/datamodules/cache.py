"""``TensorCacheDataModule``: decode and resize once into a uint8 cache, then train with no decode at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.augment.crop import crop_resize_flip
from lightning_fastdata.cache.dataset import (
    TensorCacheDataset,
    build_tensor_cache,
    check_augment_on,
    check_verify_source,
    open_jpeg_cache,
    open_tensor_cache,
)
from lightning_fastdata.cache.manifest import read_manifest
from lightning_fastdata.datamodules.arguments import refuse_old_names
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datamodules.folder import FolderSource
from lightning_fastdata.datasets.hdf5 import HDF5Dataset
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.batch import DeviceBatch
from lightning_fastdata.loading.storage.bucket_index import DEFAULT_INDEX_TTL

__all__ = ["TensorCacheDataModule"]


class TensorCacheDataModule(FastDataModule):
    """Train from a preprocessed uint8 cache of an image folder; random resized crop and flip still work.

    ``prepare_data()`` (called by the Trainer on local rank 0 of each node, or on global rank 0 only when
    ``prepare_data_per_node=False``; the other ranks wait) builds the cache once: training images as their
    central square resized to ``cache_size``, validation images resized and center-cropped to ``image_size``.
    A cache built from other files or parameters is detected (fingerprint of paths, sizes and mtimes) and
    rebuilt, or refused with ``read_only=True``. ``setup()`` opens it read-only as memory maps, so it works
    when the cache is larger than RAM. See :mod:`lightning_fastdata.cache.dataset` for the format.

    Args:
        root: Image folder (``root/<class>/<image>``), or a bucket URL of one.
        cache_dir: Directory of the cache (created; built under ``<cache_dir>.partial`` and renamed when done).
        cache_size: Side of the stored training squares (crops are taken from them; >= ``image_size``).
        val_root: Validation folder; default: a seeded ``val_fraction`` split of ``root``.
        augment_on: ``"workers"``: crop and flip uint8 in the loader workers; ``"device"``: ship the cached
            squares and crop/flip/resize on the training device after transfer (one batched op; moves
            ``(cache_size / image_size)^2`` more bytes, frees the CPUs).
        read_only: Never build: a missing or stale cache is an error.
        build_processes: Decoding processes for the build; default: usable CPUs.
        storage: ``"raw"``: uint8 arrays (no decode at all per epoch; ``cache_size^2 x 3`` bytes per image).
            ``"jpeg"``: each image re-encoded once, shorter side ``cache_size``, at ``quality`` (~1/7 of the
            raw size here; decoded per epoch by the region-of-interest path): for data that does not fit in
            RAM or on the local disk as raw pixels. Crops use the whole image, not the central square.
        quality: JPEG quality of ``storage="jpeg"``.
        index_dir: Keep the scanned file list of ``root`` here and reuse it while the folders are unchanged (see
            :class:`ImageFolderDataModule`); ``None``: scan at every ``prepare_data``.
        verify_source: How ``prepare_data`` checks a built cache against ``root`` at each run. ``"files"``: one
            ``stat`` per source file (size and mtime; ``O(files)``: minutes on a network file system for ImageNet).
            ``"folders"``: the file list and the mtimes of its folders, recorded at build time (``O(folders)``,
            the docs' Scale page has the figures): sees files added, removed, renamed or replaced by a
            rename, but not a file rewritten in place under the same name (then run once with ``"files"``, or
            delete the cache). From a bucket neither applies: the build lists the bucket again and compares every
            object's key, size and ETag.
        storage_options: Object-store settings for a bucket ``root`` (``s3://bucket/train``), as
            :class:`ImageFolderDataModule` takes them (secrets are not saved in hparams); default: the standard
            environment. The cache is built once per node (``prepare_data``) into the local ``cache_dir``, the
            objects read by the build processes a chunk at a time, fetched concurrently.
        index_ttl: Seconds a bucket listing kept in ``index_dir`` is reused without listing again.
        test_root: Test folder (or URL) of the same class sub-folders, for ``trainer.test``: read and decoded
            straight from the folder with the validation transforms (the same centre crops the cache keeps for
            validation; a set evaluated once gains nothing from a cache build). ``None``: no test set.
        labels: Labels from a table (``.csv``/``.parquet``) instead of class sub-folders, as
            :class:`ImageFolderDataModule` takes it; the cache keeps them (``uint8`` multi-hot rows with
            ``multi_label``), and a changed table is a changed source (the cache is built again).
        multi_label: With ``labels``: several labels per image (:class:`ImageFolderDataModule`).
        class_names: With ``labels``: the class list in label order (:class:`ImageFolderDataModule`).
        label_separator: With ``multi_label``: what separates a cell's labels (:class:`ImageFolderDataModule`).
        id_column: With ``labels``: the table's id column (:class:`ImageFolderDataModule`).
        label_column: With ``labels``: the table's label column (:class:`ImageFolderDataModule`).
        **kwargs: Augmentation, split and loader arguments of :class:`FastDataModule`.

    Raises:
        FileNotFoundError: If ``root`` (or ``val_root``) is not an image folder.
        ValueError: On an impossible argument.
    """

    def __init__(
        self,
        root: str,
        cache_dir: str,
        cache_size: int = 256,
        val_root: str | None = None,
        augment_on: Literal["workers", "device"] = "workers",
        read_only: bool = False,
        build_processes: int | None = None,
        index_dir: str | None = None,
        storage: Literal["raw", "jpeg"] = "raw",
        quality: int = 90,
        verify_source: Literal["files", "folders"] = "files",
        storage_options: dict[str, Any] | None = None,
        index_ttl: float = DEFAULT_INDEX_TTL,
        test_root: str | None = None,
        labels: str | None = None,
        multi_label: bool = False,
        class_names: list[str] | None = None,
        label_separator: str = " ",
        id_column: str | None = None,
        label_column: str | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("on_corrupt", "raise") != "raise":
            raise InvalidValueError(
                f"TensorCacheDataModule does not take on_corrupt={kwargs['on_corrupt']!r}: the cache build stops at "
                "the first corrupt image and names it (replace or remove it, then build again); the cache itself "
                "holds no corrupt images."
            )
        refuse_old_names(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        save_init_hparams(self)
        check_augment_on(augment_on)
        if storage not in ("raw", "jpeg"):
            raise InvalidValueError(f"storage should be 'raw' or 'jpeg', got {storage!r}.")
        if storage == "jpeg" and augment_on == "device":
            raise InvalidValueError(
                "storage='jpeg' decodes each crop in the loader workers; augment_on='device' needs storage='raw' "
                "(the device crops uint8 squares)."
            )
        check_verify_source(verify_source)
        if not 1 <= quality <= 100:
            raise InvalidValueError(f"quality should be 1..100 (JPEG quality), got {quality!r}.")
        image_size = max(self.dataset_kwargs["image_size"], self.val_crop_size)
        if cache_size < image_size:
            raise InvalidValueError(
                f"cache_size={cache_size!r} is smaller than image_size={image_size!r} (or val_crop_size, the larger); "
                "crops would be upscaled. Use cache_size >= image_size (e.g. 256 for 224)."
            )
        self.source = FolderSource(
            root,
            val_root,
            index_dir,
            storage_options,
            index_ttl,
            test_root,
            labels,
            multi_label,
            class_names,
            label_separator,
            id_column,
            label_column,
        )
        self.multi_label = self.source.multi_label
        self.cache_dir = os.fspath(cache_dir)
        self.cache_size = cache_size
        self.augment_on = augment_on
        self.read_only = read_only
        self.build_processes = build_processes
        self.storage = storage
        self.quality = quality
        self.verify_source = verify_source
        self._prepared = False

    @override
    def find_classes(self) -> tuple[str, ...]:
        """The class folders (or the label table's classes), read on first use."""
        return self.source.classes

    @property
    def num_classes(self) -> int:
        """Number of class folders."""
        return len(self.classes)

    @override
    def predict_storage_options(self) -> dict[str, Any] | None:
        """This module's ``storage_options`` (also for a bucket ``predict_root``)."""
        return self.source.storage_options

    @override
    def prepare_data(self) -> None:
        """Build the cache if it is missing or stale (or raise, with ``read_only``)."""
        train_index, val_index = self.source.indexes(self.split)
        build_tensor_cache(
            self.cache_dir,
            train_index,
            val_index,
            cache_size=self.cache_size,
            image_size=self.val_crop_size,  # the validation crops are made once, at build time
            crop_fraction=self.val_crop_fraction,
            processes=self.build_processes,
            read_only=self.read_only,
            storage=self.storage,
            quality=self.quality,
            exact_decode=self.dataset_kwargs["exact_decode"],
            verify_source=self.verify_source,
            storages=self.source.storages,
        )
        self._prepared = True

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_root``'s images, decoded from the folder with the validation transforms (``None`` without it)."""
        return self.source.test_dataset(self.split_kwargs(False))

    @override
    def decodes_images(self) -> bool:
        """Whether the cache holds JPEGs (``storage="jpeg"``), which the loaders decode."""
        return self.storage == "jpeg"

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Open the cache's splits as memory-mapped datasets.

        Without a Trainer (a notebook, plain torch) nobody called :meth:`prepare_data`: it runs here, so a
        missing cache is built and a stale one is rebuilt (or refused with ``read_only``), never used silently.
        """
        if self.trainer is None and not self._prepared:
            self.prepare_data()
        if self.storage == "jpeg":
            train_file, val_file = open_jpeg_cache(self.cache_dir, "train"), open_jpeg_cache(self.cache_dir, "val")
            assert train_file is not None
            return (
                HDF5Dataset(train_file, **self.split_kwargs(True)),
                None if val_file is None else HDF5Dataset(val_file, **self.split_kwargs(False)),
            )
        kw = {k: self.dataset_kwargs[k] for k in ("image_size", "scale", "ratio", "seed")}
        kw["source"] = str(((read_manifest(Path(self.cache_dir)) or {}).get("params") or {}).get("fingerprint", ""))
        train_path, train_labels = open_tensor_cache(self.cache_dir, "train")
        train = TensorCacheDataset(
            train_path,
            train_labels,
            self.data_classes,
            True,
            augment_on=self._placement(),
            transform=self.train_transforms,
            **kw,
        )
        val_path, val_labels = open_tensor_cache(self.cache_dir, "val")
        kw["image_size"] = self.val_crop_size
        val = (
            TensorCacheDataset(val_path, val_labels, self.data_classes, False, transform=self.val_transforms, **kw)
            if len(val_labels)
            else None
        )
        return train, val

    def _placement(self) -> Literal["workers", "device"]:
        """``augment_on``, except on a CPU Trainer, where the device crop is slower than the workers' (warned)."""
        if self.augment_on == "device" and self.trainer is not None:
            device = self.trainer.strategy.root_device
            if device.type == "cpu":
                rank_zero_warn(
                    "TensorCacheDataModule(augment_on='device') on a CPU Trainer would crop in the training process "
                    "(slower than the workers' crop: see the Benchmarks page of the docs); cropping in the loader "
                    "workers instead "
                    "(augment_on='workers'). augment_on='device' pays off on a GPU."
                )
                return "workers"
        return self.augment_on

    @override
    def _after_transfer(self, batch: Any) -> Any:
        """With ``augment_on="device"``: crop, resize and flip the cached squares here, then normalise."""
        if isinstance(batch, DeviceBatch) and batch.boxes is not None and batch.flips is not None:
            cropped = crop_resize_flip(batch.images, batch.boxes, batch.flips, self.dataset_kwargs["image_size"])
            if batch.keys is not None:  # the policies work on uint8, as in the workers' path
                as_uint8 = cropped.round_().clamp_(0, 255).to(torch.uint8)
                return self.transfer.augment(as_uint8, batch.labels, batch.keys, getattr(self, "num_classes", None))
            return self.transfer.format_images(self.normalizer(cropped)), batch.labels
        return super()._after_transfer(batch)
