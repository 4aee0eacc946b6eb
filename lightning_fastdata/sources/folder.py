"""``PairedFolderDataset``: a split of a folder or bucket of files, each image with its target's file.

Where a split's images and their payload files are is a *layout*'s to say (a target room's: VOC, ADE20K, Cityscapes
and paired folders for masks, :func:`~lightning_fastdata.segmentation.layouts.find_pairs`): a callable of the root,
the split and the storage options that returns :class:`FolderPairs`. This source reads each sample's two files
(local, or a bucket's requests in flight together) and hands them to the window and the target
(:class:`~lightning_fastdata.sources.windowed.WindowedDataset`); a training image's crop may be decoded with the
image's entropy index (:meth:`PairedFolderDataset.with_entropy_index`).
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Self, overload

import numpy as np
import torch

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.jpeg.entropy_index import EntropyIndexes, PendingEntropyIndex
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.windowed import WindowedDataset, checked_read

__all__ = ["FolderLayout", "FolderPairs", "PairedFolderDataset", "Serialized"]


class Serialized(Sequence[Any]):
    """Items held pickled in one uint8 array, unpickled on access: a list the loader's workers read without copying.

    A forked worker that reads a Python object writes its reference count, which copies the object's memory page into
    the worker; over an epoch, every page of a split's per-image objects (file names, COCO's annotations). One array
    and its offsets are two objects, whatever the count (detectron2's ``DatasetFromList(serialize=True)``).
    """

    def __init__(self, items: Iterable[Any]) -> None:
        blobs = [pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL) for item in items]
        self._offsets = np.cumsum([0, *(len(b) for b in blobs)], dtype=np.int64)
        self._data = np.frombuffer(b"".join(blobs), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} items.")
        index %= len(self)
        return pickle.loads(self._data[self._offsets[index] : self._offsets[index + 1]].tobytes())

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True)
class FolderPairs:
    """A split's samples: each image's and payload file's path relative to the root, in order, and the layout found.

    Attributes:
        layout: The layout found (``"auto"`` resolved).
        images: Each image's path under the root.
        payloads: Each payload file's path under the root; with ``inline``, what names each payload in messages
            (``annotations/instances_val2017.json#image 139``).
        inline: Payloads already read (one annotation file for the split, as COCO's: each image's part of it), or
            ``None``: each is a file, read with its image.
        annotations: The files ``inline`` was read from (under the root): part of the data's fingerprint.
    """

    layout: str
    images: Sequence[str]
    payloads: Sequence[str]
    inline: Sequence[Any] | None = None
    annotations: tuple[str, ...] = ()


#: How a target room finds a split's pairs, ``(root, split, storage_options) -> FolderPairs`` (``FileNotFoundError``
#: naming what is missing).
FolderLayout = Callable[[str, str, Mapping[str, Any] | None], FolderPairs]


class PairedFolderDataset(WindowedDataset):
    """A split of a folder or bucket as whole batches of images and targets (module docstring).

    Args:
        root: The data's root: a folder or a bucket URL.
        split: The split, as ``layout`` reads it.
        target: What rides with each image (:class:`~lightning_fastdata.sources.target.TargetKind`), bound to the
            layout found (:meth:`~lightning_fastdata.sources.target.TargetKind.bound`).
        layout: Finds the split's pairs (:data:`FolderLayout`).
        storage_options: Object-store settings for a bucket ``root``.
        **kwargs: The window settings of :class:`~lightning_fastdata.sources.windowed.WindowedDataset`.

    Raises:
        FileNotFoundError: If the split, or an image or payload it names, is missing (named).
        ValueError: On a bad argument, or first payloads the target refuses (named).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str,
        target: TargetKind,
        layout: FolderLayout,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.root = os.fspath(root)
        options = None if storage_options is None else dict(storage_options)
        pairs = layout(self.root, split, options)
        # held serialized: the loader's workers read them without copying them (Serialized)
        inline = None if pairs.inline is None else Serialized(pairs.inline)
        self.pairs = replace(pairs, images=Serialized(pairs.images), payloads=Serialized(pairs.payloads), inline=inline)
        if not self.pairs.images:
            raise InvalidValueError(f"The split {split!r} of {self.root} holds no image.")
        self.storage = open_storage(self.root, options)
        super().__init__(target.bound(self.pairs.layout, {}, self.root), **kwargs)
        first = range(min(self.target.first_checked, len(self)))
        if first:
            read = self.read_payloads(list(first))
            self.target.check_first(read, f"{self.root} (e.g. {self.name(0, 1)})")
        #: The images' entropy indexes (:meth:`with_entropy_index`), or ``None``.
        self.entropy_indexes: EntropyIndexes | PendingEntropyIndex | None = None

    @property
    def layout(self) -> str:
        """The layout read (``"auto"`` resolved)."""
        return self.pairs.layout

    def name(self, index: int, what: int = 0) -> str:
        """Sample ``index``'s image (``what=0``) or payload file (``1``): its path or URL."""
        return self.storage.url((self.pairs.images, self.pairs.payloads)[what][index])

    def __len__(self) -> int:
        return len(self.pairs.images)

    def image_files(self) -> FileIndex:
        """The split's images as a file list, in order (what their entropy index is built from)."""
        return FileIndex.of_paths(self.root, list(self.pairs.images))

    def with_entropy_index(self, indexes: EntropyIndexes | PendingEntropyIndex | None) -> Self:
        """A copy whose training crops are decoded with the images' entropy ``indexes`` (of :meth:`image_files`).

        A pending index (one being built in the background) is taken up as it grows: the same pixels either way.

        Raises:
            ValueError: If ``indexes`` holds another number of files.
        """
        if indexes is not None and len(indexes) != len(self):
            raise InvalidValueError(f"The entropy index holds {len(indexes)} files, the split {len(self)}.")
        twin = copy.copy(self)
        twin.entropy_indexes = indexes
        return twin

    def entropy_index_of(self, index: int) -> bytes | None:
        """Sample ``index``'s image's entropy index (:meth:`with_entropy_index`), or ``None``."""
        return None if self.entropy_indexes is None else self.entropy_indexes.get(index)

    def fingerprint(self) -> str:
        """The root, the pairs, and each local file's size and modification time (a bucket's: the names only)."""
        files = (*self.pairs.images, *(self.pairs.payloads if self.pairs.inline is None else self.pairs.annotations))
        parts = [self.root, *self.pairs.images, *self.pairs.payloads]
        if not is_url(self.root):
            for rel in files:
                st = os.stat(os.path.join(self.root, rel))
                parts.append(f"{st.st_size}:{st.st_mtime_ns}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each sample's image and payload files' bytes (or inline payload), a bucket's reads in flight together."""
        if self.pairs.inline is not None:
            images = self.storage.read_many([self.pairs.images[i] for i in indices])
            return [(checked_read(v, self.name(i)), self.pairs.inline[i]) for i, v in zip(indices, images)]
        paths = [p for i in indices for p in (self.pairs.images[i], self.pairs.payloads[i])]
        read = list(self.storage.read_many(paths))
        return [
            (checked_read(read[2 * j], self.name(i)), checked_read(read[2 * j + 1], self.name(i, 1)))
            for j, i in enumerate(indices)
        ]

    def read_payloads(self, indices: Sequence[int]) -> list[Any]:
        """The payload files alone, read together (inline payloads as they are)."""
        if self.pairs.inline is not None:
            return [self.pairs.inline[i] for i in indices]
        read = self.storage.read_many([self.pairs.payloads[i] for i in indices])
        return [checked_read(value, self.name(i, 1)) for i, value in zip(indices, read)]
