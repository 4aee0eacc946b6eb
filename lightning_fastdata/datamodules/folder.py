"""``ImageFolderDataModule``: a folder of class sub-folders of images, decoded fast."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.datamodules.arguments import entropy_index_setting, refuse_old_names
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.folder import ImageFolderDataset
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.index.files import FileIndex, contains_path, refuse_segmentation_root
from lightning_fastdata.loading.index.table import (
    LabelTable,
    check_label_separator,
    labelled_indexes,
    read_label_table,
)
from lightning_fastdata.loading.jpeg.entropy_index import (
    EntropyIndexes,
    PendingEntropyIndex,
    default_index_dir,
    load_entropy_index,
)
from lightning_fastdata.loading.jpeg.entropy_index_build import build_entropy_index, start_background_build
from lightning_fastdata.loading.storage.base import Storage, is_url
from lightning_fastdata.loading.storage.bucket_index import DEFAULT_INDEX_TTL
from lightning_fastdata.loading.storage.registry import open_storage

__all__ = ["FolderSource", "ImageFolderDataModule"]


class FolderSource:
    """A training folder of class sub-folders and an optional validation folder with the same classes.

    Shared by :class:`ImageFolderDataModule` and the tensor cache module. Nothing is read when it is made (a
    DataModule's ``__init__`` reads no data): the class folders (or the label table) are read on the first use of
    :attr:`classes` (``setup``, or LightningCLI's ``num_classes`` link, so a wrong path still fails before training),
    the full scan in :meth:`indexes`.

    Args:
        root: Training folder, or bucket URL (``s3://bucket/train``).
        val_root: Validation folder or URL, or ``None`` to split ``root``.
        index_dir: Keep the scanned file lists here and reuse them while the folders are unchanged
            (:mod:`~lightning_fastdata.loading.index.store`), or, for a bucket, within ``index_ttl`` of the listing
            (:mod:`~lightning_fastdata.loading.storage.bucket_index`); ``None``: scan every time.
        storage_options: Object-store settings for URL roots
            (:class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`); ``None``: the environment's.
        index_ttl: Seconds a bucket listing kept in ``index_dir`` is reused without listing again.
        test_root: Test folder or URL (same classes), or ``None``.
        labels: A label table (``.csv``/``.parquet``, :mod:`~lightning_fastdata.loading.index.table`) whose ids name
            the images of ``root`` (and of ``val_root``/``test_root`` where given): the folders are then listed at any
            depth, not by class sub-folder, and each image takes its row's label. ``None``: class sub-folders.
        multi_label: With ``labels``: several labels per image (a cell of labels split by ``label_separator``, or
            one 0/1 column per class), as ``uint8`` multi-hot rows.
        class_names: With ``labels``: the class list, in label order (every label must be in it); default: the
            table's (its columns, or its labels sorted).
        label_separator: With ``multi_label``: what separates the labels in a cell (``" "``: spaces; ``"|"``:
            ChestX-ray14's ``Finding Labels``, and class names may then hold spaces).
        id_column: With ``labels``: the table's column of image ids (default: its first).
        label_column: With ``labels``: the table's column of labels, the others left out (default: every column
            but the ids'); for a table of more columns, such as ChestX-ray14's ``Data_Entry_2017.csv``.

    Raises:
        ValueError: On a bad argument (the data itself is checked when :attr:`classes` is first read).
    """

    def __init__(
        self,
        root: str,
        val_root: str | None = None,
        index_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        index_ttl: float = DEFAULT_INDEX_TTL,
        test_root: str | None = None,
        labels: str | None = None,
        multi_label: bool = False,
        class_names: list[str] | None = None,
        label_separator: str = " ",
        id_column: str | None = None,
        label_column: str | None = None,
    ) -> None:
        self.root = root if is_url(root) else os.fspath(root)
        self.val_root = None if val_root is None else (val_root if is_url(val_root) else os.fspath(val_root))
        self.test_root = None if test_root is None else (test_root if is_url(test_root) else os.fspath(test_root))
        self.index_dir = None if index_dir is None else os.fspath(index_dir)
        if index_ttl < 0:
            raise InvalidValueError(f"index_ttl should be >= 0 seconds, got {index_ttl!r}.")
        self.index_ttl = float(index_ttl)
        self.storage_options = storage_options
        self._listed: dict[str, FileIndex] = {}
        given = [data for data in (self.root, self.val_root, self.test_root) if data is not None]
        self.storages: dict[str, Storage] = {data: open_storage(data, storage_options) for data in given}
        for data in given:
            if (
                self.index_dir is not None
                and data is not None
                and not is_url(data)
                and contains_path(os.path.realpath(data), os.path.realpath(self.index_dir))
            ):
                raise InvalidValueError(
                    f"index_dir={self.index_dir!r} is inside the data folder {data!r}, which lightning_fastdata never "
                    "writes to; choose a folder outside it (e.g. a cache folder on the node's local disk)."
                )
        if labels is None and (multi_label or class_names is not None):
            raise InvalidValueError(
                "multi_label and class_names describe a label table: pass labels= (a .csv or .parquet file)."
            )
        if labels is None and (id_column is not None or label_column is not None):
            raise InvalidValueError(
                "id_column and label_column name a label table's columns: pass labels= (a .csv or .parquet file)."
            )
        self.multi_label = bool(multi_label)
        self.class_names = class_names
        check_label_separator(label_separator)
        self._table_args = (labels, label_separator, id_column, label_column)
        self._table: LabelTable | None = None
        self._classes_found: tuple[str, ...] | None = None

    @property
    def table(self) -> LabelTable | None:
        """The label table, where labels come from one (else from class sub-folders): read on first use."""
        labels, separator, id_column, label_column = self._table_args
        if labels is not None and self._table is None:
            self._table = read_label_table(labels, separator, id_column, label_column)
        return self._table

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names: the label table's, or the class folders' (every folder's the same), read once.

        Raises:
            FileNotFoundError: If a folder is missing or holds no class folder.
            ValueError: If the folders have different class folders, or the label table does not fit them (named).
        """
        if self._classes_found is not None:
            return self._classes_found
        table = self.table
        if table is not None:
            self._classes_found = table.classes(self.multi_label, self.class_names)
            return self._classes_found
        classes = self._classes(self.root)
        for name, other_root in (("val_root", self.val_root), ("test_root", self.test_root)):
            if other_root is None:
                continue
            other = self._classes(other_root)
            if other != classes:
                raise InvalidValueError(
                    f"{name} {other_root!r} has class folders {list(other)} but root {self.root!r} has "
                    f"{list(classes)}; both need the same class folders (a label is a class folder's position)."
                )
        self._classes_found = classes
        return classes

    def _classes(self, root: str) -> tuple[str, ...]:
        classes = self.storages[root].list_classes()
        refuse_segmentation_root(root, classes)
        return classes

    def indexes(
        self, split: Callable[[int], tuple[np.ndarray, np.ndarray | None]]
    ) -> tuple[FileIndex, FileIndex | None]:
        """Scan once (or reuse the persisted scan); return ``(train, val)``: ``val_root``'s or a split of ``root``."""
        index = self.index(self.root)
        if self.val_root is not None:
            return index, self.index(self.val_root)
        train_rows, val_rows = split(len(index))
        if val_rows is None:  # nothing held out: the index as it is, not a copy
            return index, None
        return index.subset(train_rows), index.subset(val_rows)

    def test_dataset(self, kwargs: dict[str, Any]) -> ImageFolderDataset | None:
        """``test_root``'s images as a dataset built with ``kwargs`` (the validation split's), or ``None``."""
        if self.test_root is None:
            return None
        return ImageFolderDataset(self.index(self.test_root), self.storage_options, **kwargs)

    def index(self, root: str) -> FileIndex:
        """``root``'s file index: reused from ``index_dir`` when still valid, else scanned (and kept there).

        A bucket's listing is also kept in this object: ``prepare_data`` and ``setup`` in one process list once.
        """
        if root in self._listed:
            return self._listed[root]
        if self.table is not None:
            return self._labelled()[root]
        start = time.perf_counter()
        storage = self.storages[root]
        index, lookup = storage.indexed(self.classes, self.index_dir, self.index_ttl)
        took = f"{len(index):,} files in {time.perf_counter() - start:.2f} s"
        scanned = "listed" if storage.remote else "scanned"
        if storage.remote:  # a listing costs requests; a local scan is checked again (its folders may change)
            self._listed[root] = index
        if lookup.reused:
            rank_zero_info(
                f"lightning_fastdata: reused the file index {lookup.path} of {root!r} ({took}; {lookup.how})."
            )
        elif lookup.why is not None:
            rank_zero_warn(f"lightning_fastdata: {scanned} {root!r} again ({took}): {lookup.why}.")
        elif lookup.path is not None:
            how = f"; {lookup.how}" if lookup.how else ""
            rank_zero_info(f"lightning_fastdata: {scanned} {root!r} ({took}{how}); kept the index in {lookup.path}.")
        return index

    def _labelled(self) -> dict[str, FileIndex]:
        """Every folder's images (at any depth) with their labels from the table, listed and joined at once.

        Not kept in ``index_dir``: a listing of the folders and a read of the table, once per process.
        """
        assert self.table is not None
        start = time.perf_counter()
        roots = [data for data in (self.root, self.val_root, self.test_root) if data is not None]
        listed = [self.storages[data].list_images() for data in roots]
        indexes = labelled_indexes(listed, self.table, self.multi_label, self.class_names)
        self._listed.update(zip(roots, indexes))  # listed and joined once per process (this object)
        kind = "several labels" if self.multi_label else "one label"
        rank_zero_info(
            f"lightning_fastdata: {sum(map(len, indexes)):,} images of {', '.join(map(repr, roots))} labelled from "
            f"{self.table.path!r} ({kind} per image, {len(self.classes)} classes: {_shown(self.classes)}; "
            f"{time.perf_counter() - start:.2f} s)."
        )
        return dict(zip(roots, indexes))


def _shown(classes: tuple[str, ...], first: int = 10) -> str:
    return ", ".join(classes[:first]) + (f", ... ({len(classes) - first} more)" if len(classes) > first else "")


class ImageFolderDataModule(FastDataModule):
    """Train (and validate) from ``root/<class>/<image>``, with torchvision ``ImageFolder``'s labels.

    Training samples get ``RandomResizedCrop(image_size, scale, ratio)`` and a horizontal flip, decoded
    straight into the crop; validation and test samples the classic ``Resize(image_size / crop_fraction)`` +
    ``CenterCrop(image_size)``. Validation comes from ``val_root`` (same class folders) or, if it is not
    given, from a seeded split of ``val_fraction`` of ``root``; the test set from ``test_root``.

    Args:
        root: Folder of class sub-folders, or a bucket URL of class prefixes (``s3://bucket/imagenet/train``).
        val_root: Validation folder (or URL) of the same class sub-folders; default: split ``root`` by
            ``val_fraction``.
        index_dir: A folder (node-local or shared) to keep the scanned file list in: ``prepare_data`` scans once
            per node (once in total with ``prepare_data_per_node=False``), every rank and later run reuses it
            while no folder changed (a bucket's listing: within ``index_ttl``). Worth it from ~100k files, on a
            network file system, and for every bucket. ``None``: every rank scans at every start. Never inside
            ``root``.
        storage_options: Object-store settings for URL roots: obstore's keys (``endpoint``, ``access_key_id``,
            ``secret_access_key``, ``region``, ...) and ``max_inflight``, ``timeout``, ``connect_timeout``,
            ``max_retries``, ``retry_timeout``
            (:class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`).
            ``None``: the environment's (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, roles).
        index_ttl: Seconds a bucket listing kept in ``index_dir`` is reused before the bucket is listed again.
        test_root: Test folder (or URL) of the same class sub-folders, for ``trainer.test``: the validation
            transforms, every image once over all ranks. ``None``: no test set (``trainer.test`` says so).
        entropy_index: Decode each JPEG crop from its own bits alone, with an entropy index of the training files
            (:mod:`~lightning_fastdata.loading.jpeg.entropy_index`): the same pixels, ~0.15 ms less per 500 x 375
            image at 224 px; at most 1.5% of the JPEG bytes on disk, in ``index_dir``, else in the per-user cache folder
            (``$LIGHTNING_FASTDATA_CACHE``, ``$XDG_CACHE_HOME/lightning-fastdata`` or
            ``~/.cache/lightning-fastdata``). ``"auto"`` (default): used when it is there; if it is not,
            ``prepare_data`` starts building it in the background (paced: 2.5% of busy CPUs, idle ones whole;
            :mod:`~lightning_fastdata.loading.jpeg.pace`) and training starts at once, every loader process
            taking it up a finished piece at a time as it is built (no pass before the first step; off where the
            compiled decoder is missing; for a bucket root only an index already built is used: a second read of
            every object is not done unasked). ``True``: ``prepare_data`` builds it before training (every file
            read once, all cores). ``False``: never.
        labels: Labels from a table instead of class sub-folders: a ``.csv`` (or ``.parquet``) whose first column
            names each image of ``root`` (its path relative to ``root``, with or without the extension, or its file
            name) and whose other columns give its label(s) (:mod:`~lightning_fastdata.loading.index.table`; the
            Kaggle layout: ``train/`` + ``train.csv``). Images are then found at any depth; one table may also
            label ``val_root`` and ``test_root``. ``None``: class sub-folders.
        multi_label: With ``labels``: several labels per image (a cell of labels split by ``label_separator``, or
            one 0/1 column per class); batches then carry ``uint8`` multi-hot rows (``N x num_classes``), and
            ``ImageClassifier(multi_label=True)`` trains on them (linked by LightningCLI).
        class_names: With ``labels``: the class list in label order (every label must be one of them); default:
            the table's per-class columns in order, else its labels sorted (numerically if all are integers).
        label_separator: With ``multi_label``: what separates the labels in a cell: ``" "`` (default: spaces) or,
            say, ``"|"`` (ChestX-ray14's ``Finding Labels``: ``Atelectasis|Effusion``; class names may then hold
            spaces). A single label is the whole cell, spaces and all.
        id_column: With ``labels``: the table's column of image ids (default: its first).
        label_column: With ``labels``: the table's column of labels, the others left out (default: every column but
            the ids'): ChestX-ray14's ``Data_Entry_2017.csv`` is ``id_column="Image Index"``,
            ``label_column="Finding Labels"``, ``label_separator="|"``.
        **kwargs: Augmentation, split and loader arguments of :class:`FastDataModule` (``image_size``,
            ``batch_size``, ``num_workers``, ...).

    Raises:
        FileNotFoundError: If ``root`` (or ``val_root``) is missing or holds no class folder.
        ValueError: On an impossible argument, or a label table that does not fit the folder (the message names
            the ids, files or classes).
    """

    def __init__(
        self,
        root: str,
        val_root: str | None = None,
        index_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        index_ttl: float = DEFAULT_INDEX_TTL,
        entropy_index: bool | Literal["auto"] = "auto",
        test_root: str | None = None,
        labels: str | None = None,
        multi_label: bool = False,
        class_names: list[str] | None = None,
        label_separator: str = " ",
        id_column: str | None = None,
        label_column: str | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_old_names(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        save_init_hparams(self)
        #: True (built in prepare_data), "auto" (built in the background, taken up as it is built) or False
        self.entropy_index: bool | str = entropy_index_setting(entropy_index)
        self.entropy_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir())
        self.source = FolderSource(
            root, val_root, index_dir, storage_options, index_ttl, test_root, labels, multi_label, class_names,
            label_separator, id_column, label_column,
        )  # fmt: skip
        self.multi_label = self.source.multi_label

    @override
    def find_classes(self) -> tuple[str, ...]:
        """The class folders (or the label table's classes), read on first use."""
        return self.source.classes

    @override
    def predict_storage_options(self) -> dict[str, Any] | None:
        """This module's ``storage_options`` (also for a bucket ``predict_root``)."""
        return self.source.storage_options

    @override
    def prepare_data(self) -> None:
        """With ``index_dir``: scan the folder(s) once here (one process per node), so every rank reuses it.

        With ``entropy_index``, also build (or check and reuse) the training files' entropy index there (not with
        ``decode_on="device"``: the device decodes whole images, and the index only serves the workers' crops).
        """
        if self.source.index_dir is not None:
            for data in (self.source.root, self.source.val_root, self.source.test_root):
                if data is not None:
                    self.source.index(data)
        if self.entropy_index and self.transfer.decode_on == "workers":  # nvJPEG decodes whole images: no index
            train_index, _ = self.source.indexes(self.split)
            storage = self.source.storages[self.source.root]
            if self.entropy_index is True:
                build_entropy_index(train_index, storage, self.entropy_dir)
            elif not is_url(self.source.root):  # "auto": training does not wait for it
                start_background_build(train_index, storage, self.entropy_dir)
            # a bucket with "auto": an index already built is used, none is built unasked (a second read of every
            # object is the user's egress bill and request count); entropy_index=True builds it

    @property
    def num_classes(self) -> int:
        """Number of class folders."""
        return len(self.classes)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Scan the folder(s) once and build the train and validation datasets."""
        train_index, val_index = self.source.indexes(self.split)
        options = self.source.storage_options
        entropy: EntropyIndexes | PendingEntropyIndex | None = None
        if self.entropy_index is True:  # None (warned, naming the folder and why): decoded without it, same pixels
            entropy = load_entropy_index(self.entropy_dir, train_index)
        elif self.entropy_index == "auto":  # taken up as it is built (the same pixels before and after)
            entropy = PendingEntropyIndex(self.entropy_dir, train_index)
        train = ImageFolderDataset(train_index, options, entropy, **self.split_kwargs(True))
        val = None if val_index is None else ImageFolderDataset(val_index, options, **self.split_kwargs(False))
        return train, val

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_root``'s images with the validation transforms (``None`` without ``test_root``)."""
        return self.source.test_dataset(self.split_kwargs(False))
