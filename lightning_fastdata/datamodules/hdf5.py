"""``HDF5DataModule``: one HDF5 file of images and labels, safe with any number of workers and ranks."""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.datamodules.arguments import refuse_old_names
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
        root: The HDF5 file, or its URL in a bucket (``s3://bucket/train.h5``: copied once into ``cache_dir``).
        val_root: A validation file (or URL) of the same layout; default: split ``root`` by ``val_fraction``.
        images_key: Dataset of the images.
        labels_key: Dataset of the labels.
        layout: ``"auto"``, ``"encoded"``, ``"hwc"`` or ``"chw"``.
        offsets_key: Offsets dataset of encoded images stored as one blob.
        locking: HDF5 file locking; set ``False`` on NFS/Lustre where locking fails or hangs.
        cache_dir: Where a URL's file is copied (:func:`~lightning_fastdata.loading.storage.download.node_local_copy`:
            atomic, resumable, checked by size and ETag; the first process of a node downloads, the others wait
            and reuse it), in ``prepare_data``. Node-local for once per node; shared for once in total. Needed with
            a URL.
        storage_options: Object-store settings for a URL
            (:class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`); ``None``: the environment's.
        entropy_index: Decode each training crop with the entropy index kept in the file, where it has one (files
            written by ``fastdata convert hdf5`` in encoded mode, and the tensor cache's ``storage="jpeg"``): the
            same pixels, each crop entropy-decoded alone. ``"auto"`` and ``True`` alike (the index is the file's,
            never built here); ``False``: never.
        test_root: A test file (or URL) of the same layout and labels, for ``trainer.test``: the validation
            transforms, every sample once over all ranks. ``None``: no test set.
        **kwargs: Augmentation, split and loader arguments of :class:`FastDataModule`.

    The files are read on first use (``prepare_data`` copies a URL's, ``setup`` or ``num_classes`` inspects them),
    never in ``__init__``.

    Raises:
        ValueError: On an impossible argument (the files are checked when first read: a missing file, a bad layout,
            validation labels the training file does not have, named).
    """

    test_argument = "test_root"

    def __init__(
        self,
        root: str,
        val_root: str | None = None,
        images_key: str = "images",
        labels_key: str = "labels",
        layout: Layout = "auto",
        offsets_key: str = "offsets",
        locking: bool | None = None,
        cache_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        entropy_index: bool | Literal["auto"] = "auto",
        test_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_old_names(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        save_init_hparams(self)
        if entropy_index not in (True, False, "auto"):
            raise InvalidValueError(f"entropy_index should be True, False or 'auto', got {entropy_index!r}.")
        self.entropy_index = bool(entropy_index)
        given = {"root": os.fspath(root), "val_root": val_root, "test_root": test_root}
        for name, where in given.items():
            if where is not None and is_url(where) and cache_dir is None:
                raise InvalidValueError(
                    f"{name}={where!r} is in a bucket: pass cache_dir, a local folder to copy it into (node-local "
                    "disk)."
                )
            if where is not None and not is_url(where) and storage_options:
                raise InvalidValueError(f"storage_options is for a URL, but {name}={where!r} is local; remove it.")
        self.root: str = os.fspath(root)
        self.val_root, self.test_root = val_root, test_root
        self.storage_options, self.cache_dir = storage_options, cache_dir
        self.file_kwargs: dict[str, Any] = dict(
            images_key=images_key, labels_key=labels_key, layout=layout, offsets_key=offsets_key, locking=locking
        )
        self._local_copies: dict[str, str] = {}
        self._multi_label: bool | None = None
        self._inspected: Any = None

    @property
    def path(self) -> str:
        """The training file on this machine (a URL's copy in ``cache_dir``, made on first use)."""
        return self._local(self.root)

    @property
    def val_path(self) -> str | None:
        """The validation file on this machine, or ``None``."""
        return None if self.val_root is None else self._local(self.val_root)

    @property
    def test_path(self) -> str | None:
        """The test file on this machine, or ``None``."""
        return None if self.test_root is None else self._local(self.test_root)

    def _local(self, where: str) -> str:
        if not is_url(where):
            return os.fspath(where)
        if where not in self._local_copies:
            assert self.cache_dir is not None  # refused in __init__
            self._local_copies[where] = os.fspath(node_local_copy(where, self.cache_dir, self.storage_options))
        return self._local_copies[where]

    @override
    def prepare_data(self) -> None:
        """Copy the files given as URLs into ``cache_dir`` (once per node); nothing for local files."""
        for where in (self.root, self.val_root, self.test_root):
            if where is not None:
                self._local(where)

    @property
    def multi_label(self) -> bool:  # type: ignore[override]
        """Whether samples have several labels (multi-hot ``N x C`` rows in the file), read with the classes."""
        if self._multi_label is None:
            self.find_classes()
        assert self._multi_label is not None
        return self._multi_label

    @override
    def find_classes(self) -> tuple[str, ...]:
        """The training file's classes; the validation and test files checked to use its labels.

        Raises:
            FileNotFoundError: If a file does not exist.
            ValueError: On a bad layout, or validation/test labels of another shape or out of range (named).
        """
        self._inspected = inspect_hdf5(self.path, **self.file_kwargs)  # what the setup that asked builds from
        return self._classes_of(self._inspected)

    def _classes_of(self, inspected: Any) -> tuple[str, ...]:
        """The classes of the training file as ``inspected``; the other files checked against it (find_classes)."""
        self._multi_label = inspected.labels.ndim == 2
        labels_key = self.file_kwargs["labels_key"]
        for what, other_path in (("validation", self.val_path), ("test", self.test_path)):
            if other_path is None:
                continue
            other = inspect_hdf5(other_path, **self.file_kwargs)
            if other.labels.shape[1:] != inspected.labels.shape[1:]:
                raise InvalidValueError(
                    f"{other_path!r}[{labels_key!r}] has labels of shape {other.labels.shape}, the training file "
                    f"{self.path!r} {inspected.labels.shape}; the {what} file must use the training file's labels."
                )
            if self._multi_label:  # the same columns: nothing out of range
                continue
            bad = np.flatnonzero(other.labels >= len(inspected.classes))
            if bad.size:
                raise InvalidValueError(
                    f"{other_path!r}[{labels_key!r}][{bad[0]}] = {other.labels[bad[0]]} is out of range for the "
                    f"{len(inspected.classes)} classes of the training file {self.path!r} ({bad.size} such labels); "
                    f"the {what} file must use the training file's labels."
                )
        return tuple(inspected.classes)

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
        layout, self._inspected = self._inspected or inspect_hdf5(self.path, **self.file_kwargs), None
        if self._data_classes is None:  # one inspection: the classes (read by this setup) and the data
            self.classes = self._classes_of(layout)
        if self.val_path is not None:
            val_layout = inspect_hdf5(self.val_path, **self.file_kwargs)
            return HDF5Dataset(layout, locking=locking, **train_kw), HDF5Dataset(val_layout, locking=locking, **val_kw)
        train_rows, val_rows = self.split(len(layout.labels))
        train = HDF5Dataset(layout, indices=train_rows, locking=locking, **train_kw)
        val = None if val_rows is None else HDF5Dataset(layout, indices=val_rows, locking=locking, **val_kw)
        return train, val

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_root``'s samples with the validation transforms (``None`` without ``test_root``)."""
        if self.test_path is None:
            return None
        layout = inspect_hdf5(self.test_path, **self.file_kwargs)
        test_kw = {**self.split_kwargs(False), "entropy_index": False}
        return HDF5Dataset(layout, locking=self.file_kwargs["locking"], **test_kw)
