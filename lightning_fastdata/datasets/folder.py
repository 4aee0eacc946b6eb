"""A plain torch ``Dataset`` over an image folder that returns whole uint8 batches."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.errors import InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.index.files import FileIndex, is_image_name
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix, segment_hashes
from lightning_fastdata.loading.jpeg.entropy_index import EntropyIndexes, PendingEntropyIndex
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.registry import open_storage

__all__ = ["ImageFolderDataset", "prediction_index"]

log = logging.getLogger("lightning_fastdata")

#: Files named in "changed since the bucket was listed" warnings, at most, per dataset and run.
_MAX_CHANGED_NAMED = 10


class ImageFolderDataset(AugmentedImageDataset):
    """Images under ``root/<class>/`` with torchvision ``ImageFolder``'s class-to-index mapping.

    Each sample is decoded straight into its resized crop (see :mod:`lightning_fastdata.loading.jpeg.decode`):
    ``RandomResizedCrop(image_size)`` + horizontal flip when ``train``, else the central crop of
    ``Resize(image_size / crop_fraction) + CenterCrop(image_size)``. Items are uint8 ``3 x S x S`` tensors;
    ``__getitems__`` returns a whole batch ``(images N x 3 x S x S uint8, labels N int64)``, which the
    loaders of this package pass through without another copy. Normalise on the device, after transfer.
    Keys and augmentation are described in :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`.

    Args:
        root: Folder of class sub-folders, a bucket URL (``s3://bucket/train``), or a prebuilt :class:`FileIndex`.
        storage_options: Object-store settings for a URL root (credentials, endpoint, ``max_inflight``,
            ``timeout``, ...: :class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`); ``None``: the
            environment's (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
        entropy_indexes: The entropy indexes of these files, in this order
            (:func:`~lightning_fastdata.loading.jpeg.entropy_index_build.build_entropy_index`): JPEG crops are then
            entropy-decoded alone, the same pixels with less work; a
            :class:`~lightning_fastdata.loading.jpeg.entropy_index.PendingEntropyIndex` is used for the files its
            background build has finished. ``None``: decoded from the top of each image.
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`
            (``train``, ``image_size``, ``scale``, ``ratio``, ``crop_fraction``, ``seed``, ``on_corrupt``:
            ``"raise"`` names a corrupt file, ``"skip"`` logs it, leaves it out of its batch and counts it).

    Raises:
        ValueError: On an impossible argument.
        FileNotFoundError: If ``root`` is missing, has no class folder, or a class has no image.
    """

    def __init__(
        self,
        root: str | FileIndex,
        storage_options: dict[str, Any] | None = None,
        entropy_indexes: EntropyIndexes | PendingEntropyIndex | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(root, FileIndex):
            self.index = root
            self.storage = open_storage(root.root, storage_options)
        else:
            self.storage = open_storage(os.fspath(root), storage_options)
            self.index = self.storage.list_files()
        if entropy_indexes is not None and len(entropy_indexes) != len(self.index):
            raise InvalidValueError(
                f"entropy_indexes holds {len(entropy_indexes)} files, this dataset {len(self.index)}: build it from "
                "this dataset's own file list (build_entropy_index(dataset.index, ...))."
            )
        self.entropy_indexes = entropy_indexes
        # which listed files were read with another version, shared by the loader workers (as the skip counts are):
        # each changed object is named once per run, not once per worker
        versions = self.index.versions
        self._changed = None if versions is None else torch.zeros(len(versions), dtype=torch.bool).share_memory_()

    def entropy_index_of(self, index: int) -> bytes | None:
        """The file's entropy index, if one was built (``entropy_indexes``)."""
        return None if self.entropy_indexes is None else self.entropy_indexes.get(index)

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a label is a position in this tuple."""
        return self.index.classes

    @property
    def targets(self) -> np.ndarray:
        """All labels, in sample order (torchvision's name)."""
        return self.index.labels

    def describe(self, index: int) -> str:
        """The file's path (or URL)."""
        return self.storage.url(self.index.relpath(index))

    def make_identity(self) -> DataIdentity:
        """Each file's relative path and label, and in a bucket its size and ETag (as listed), in this order.

        A local file rewritten in place under the same name keeps its identity (no ``stat`` of every file here).
        """
        index = self.index
        samples = segment_hashes(index.path_bytes, index.offsets)
        samples ^= label_hashes(index.labels)
        if index.versions is not None:
            samples ^= mix(index.versions)
        return DataIdentity.of(self.storage.root, samples, "folder|" + "/".join(index.classes))

    @property
    def reads_ahead(self) -> bool:
        """Whether the dataset reads ahead, which only a bucket needs.

        A local file needs no head start (and its worker no copy of the epoch's order).
        """
        return self.storage.remote

    def read_ahead(self, indices: np.ndarray) -> None:
        """From a bucket: start fetching the next batch's objects, so they arrive while this batch decodes."""
        self.storage.read_ahead([self.index.relpath(int(i)) for i in indices])

    def read_sources(self, indices: np.ndarray) -> Iterator[Source]:
        """Each file's bytes, in order (a bucket's fetched concurrently); a file that cannot be read as its error."""
        relpaths = [self.index.relpath(int(i)) for i in indices]
        versions = self.index.versions
        if versions is None:
            return self.storage.read_many(relpaths)
        return self.storage.read_many(
            relpaths, versions[indices].tolist(), lambda k: self._changed_since_listed(int(indices[k]))
        )

    def _changed_since_listed(self, index: int) -> None:
        """Say once per run (up to ten files) that file ``index`` was read with another version than listed."""
        assert self._changed is not None
        if bool(self._changed[index]):
            return
        self._changed[index] = True
        named = int(self._changed.sum())
        if named <= _MAX_CHANGED_NAMED:
            more = " (further changed objects are not named)" if named == _MAX_CHANGED_NAMED else ""
            log.warning(
                "%s changed since the bucket was listed (another size or ETag): its new content is used. A resume "
                "state or entropy index made from the old listing describes other bytes; list again (index_ttl) to "
                "pick it up%s.",
                self.describe(index),
                more,
            )


def prediction_index(source: str, storage_options: dict[str, Any] | None = None) -> FileIndex:
    """The images to predict on, in order; each one's label is its position (what predictions are matched by).

    ``source`` is a folder of images (flat or nested: every image at any depth, sorted by path), a bucket prefix
    (the same, by key), or a text file (``.txt``) with one image path per line (relative to the file's folder, or
    absolute; blank lines and lines starting with ``#`` skipped), kept in the file's order.

    Raises:
        FileNotFoundError: If the folder, prefix or list holds no image, or a listed file is missing (named).
    """
    if not is_url(source) and source.endswith(".txt") and os.path.isfile(source):
        base = os.path.dirname(os.path.abspath(source))
        with open(source, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        paths = [line for line in lines if line and not line.startswith("#")]
        if not paths:
            raise PathNotFoundError(f"{source!r} lists no image (one path per line).")
        missing = [p for p in paths if not os.path.isfile(os.path.join(base, p))]
        if missing:
            raise PathNotFoundError(
                f"{len(missing)} of the {len(paths)} images listed in {source!r} do not exist, e.g. "
                f"{os.path.join(base, missing[0])!r} (paths are relative to the list's folder, or absolute)."
            )
        odd = [p for p in paths if not is_image_name(p)]
        if odd:
            log.warning("%d listed file(s) of %r have no image extension, e.g. %r.", len(odd), source, odd[0])
        return FileIndex.of_paths(base, paths)
    return open_storage(source, storage_options).list_images()
