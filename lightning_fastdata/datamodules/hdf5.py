"""``HDF5DataModule``: one HDF5 file of images and labels, safe with any number of workers and ranks."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.hdf5 import HDF5Dataset
from lightning_fastdata.datasets.hdf5_file import Layout, inspect_hdf5
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.download import node_local_copy

__all__ = ["HDF5DataModule"]


class HDF5DataModule(FastDataModule):
    """Train, validate and test from HDF5 files; see :class:`~lightning_fastdata.HDF5Dataset` for the layouts.

    Write such a file with ``fastdata convert hdf5 --src FOLDER --dst FILE`` (or
    :func:`~lightning_fastdata.convert_folder_to_hdf5`); files you wrote yourself are read by naming the keys
    and, if needed, the layout.

    Args:
        path: The HDF5 file, or its URL in a bucket (``s3://bucket/train.h5``: copied once into ``cache_dir``).
        val_path: A validation file (or URL) of the same layout; default: split ``path`` by ``val_fraction``.
        images_key: Dataset of the images.
        labels_key: Dataset of the labels.
        layout: ``"auto"``, ``"encoded"``, ``"hwc"`` or ``"chw"``.
        offsets_key: Offsets dataset of encoded images stored as one blob.
        locking: HDF5 file locking; set ``False`` on NFS/Lustre where locking fails or hangs.
        cache_dir: Where a URL's file is copied (:func:`~lightning_fastdata.loading.storage.download.node_local_copy`:
            atomic, resumable, checked by size and ETag; the first process of a node downloads, the others wait
            and reuse it). Node-local for once per node; shared for once in total. Needed with a URL.
        storage_options: Object-store settings for a URL
            (:class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`); ``None``: the environment's.
        entropy_index: Decode each training crop with the entropy index kept in the file, where it has one (files
            written by ``fastdata convert hdf5`` in encoded mode, and the tensor cache's ``storage="jpeg"``): the
            same pixels, each crop entropy-decoded alone. ``False``: never.
        test_path: A test file (or URL) of the same layout and labels, for ``trainer.test``: the validation
            transforms, every sample once over all ranks. ``None``: no test set.
        **kwargs: Augmentation, split and loader arguments of :class:`FastDataModule`.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: On a bad file layout (checked here, before training starts) or an impossible argument.
    """

    def __init__(
        self,
        path: str,
        val_path: str | None = None,
        images_key: str = "images",
        labels_key: str = "labels",
        layout: Layout = "auto",
        offsets_key: str = "offsets",
        locking: bool | None = None,
        cache_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        entropy_index: bool = True,
        test_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        save_init_hparams(self)
        self.entropy_index = bool(entropy_index)
        for given in (path, val_path, test_path):
            if given is not None and is_url(given) and cache_dir is None:
                raise InvalidValueError(
                    f"{given!r} is in a bucket: pass cache_dir, a local folder to copy it into (node-local disk)."
                )
        self.storage_options = storage_options
        self.path = self._local(path, cache_dir, storage_options)
        self.val_path = None if val_path is None else self._local(val_path, cache_dir, storage_options)
        self.test_path = None if test_path is None else self._local(test_path, cache_dir, storage_options)
        self.file_kwargs: dict[str, Any] = dict(
            images_key=images_key, labels_key=labels_key, layout=layout, offsets_key=offsets_key, locking=locking
        )
        inspected = inspect_hdf5(self.path, images_key, labels_key, layout, offsets_key, locking)
        self.classes = inspected.classes
        #: Several labels per sample: the file's labels are multi-hot rows (``N x C``).
        self.multi_label = inspected.labels.ndim == 2
        for what, other_path in (("validation", self.val_path), ("test", self.test_path)):
            if other_path is None:
                continue
            other = inspect_hdf5(other_path, images_key, labels_key, layout, offsets_key, locking)
            if other.labels.shape[1:] != inspected.labels.shape[1:]:
                raise InvalidValueError(
                    f"{other_path!r}[{labels_key!r}] has labels of shape {other.labels.shape}, the training file "
                    f"{self.path!r} {inspected.labels.shape}; the {what} file must use the training file's labels."
                )
            if self.multi_label:  # the same columns: nothing out of range
                continue
            bad = np.flatnonzero(other.labels >= len(self.data_classes))
            if bad.size:
                raise InvalidValueError(
                    f"{other_path!r}[{labels_key!r}][{bad[0]}] = {other.labels[bad[0]]} is out of range for the "
                    f"{len(self.data_classes)} classes of the training file {self.path!r} ({bad.size} such labels); "
                    f"the {what} file must use the training file's labels."
                )

    @staticmethod
    def _local(path: str, cache_dir: str | None, storage_options: dict[str, Any] | None) -> str:
        if is_url(path) and cache_dir is not None:
            return os.fspath(node_local_copy(path, cache_dir, storage_options))
        if storage_options:
            raise InvalidValueError(f"storage_options is for a URL path, but {path!r} is local; remove it.")
        return os.fspath(path)

    @override
    def predict_storage_options(self) -> dict[str, Any] | None:
        """This module's ``storage_options`` (also for a bucket ``predict_root``)."""
        return self.storage_options

    @property
    def num_classes(self) -> int:
        """Number of classes (the file's ``classes`` attribute, or the largest label + 1)."""
        return len(self.classes)

    @override
    def decodes_images(self) -> bool:
        """Whether the file holds encoded images (``layout="encoded"``), which the loaders decode."""
        dataset = self.train_dataset
        return isinstance(dataset, HDF5Dataset) and dataset.layout.kind == "encoded"

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Build the train and validation datasets: each file inspected once (one open), read lazily by each reader."""
        locking = self.file_kwargs["locking"]
        train_kw = {**self.split_kwargs(True), "entropy_index": self.entropy_index}
        val_kw = {**self.split_kwargs(False), "entropy_index": False}  # a central crop skips little
        layout = inspect_hdf5(self.path, **self.file_kwargs)  # again: the file may have changed since __init__
        if self.val_path is not None:
            val_layout = inspect_hdf5(self.val_path, **self.file_kwargs)
            return HDF5Dataset(layout, locking=locking, **train_kw), HDF5Dataset(val_layout, locking=locking, **val_kw)
        train_rows, val_rows = self.split(len(layout.labels))
        train = HDF5Dataset(layout, indices=train_rows, locking=locking, **train_kw)
        val = None if val_rows is None else HDF5Dataset(layout, indices=val_rows, locking=locking, **val_kw)
        return train, val

    test_argument = "test_path"

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_path``'s samples with the validation transforms (``None`` without ``test_path``)."""
        if self.test_path is None:
            return None
        layout = inspect_hdf5(self.test_path, **self.file_kwargs)
        test_kw = {**self.split_kwargs(False), "entropy_index": False}
        return HDF5Dataset(layout, locking=self.file_kwargs["locking"], **test_kw)
