"""``HDF5Dataset``: images and labels from one HDF5 file, safe with any number of workers and ranks.

What a file holds and how it is opened: :mod:`~lightning_fastdata.datasets.hdf5_file`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lightning_fastdata.datasets.arrays import MappedFile, gather_hwc
from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.datasets.hdf5_file import HDF5Layout, Layout, inspect_hdf5, open_hdf5
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix

__all__ = ["HDF5Dataset"]


class HDF5Dataset(AugmentedImageDataset):
    """Images + labels from one HDF5 file, opened lazily in each process that reads it.

    The file is never opened in ``__init__`` (only inspected and closed), never pickled, never inherited:
    each process opens its own handle on first read, and reopens after a ``fork`` (the pid changed). So it
    works under ``fork`` and ``spawn``, with any number of workers and DDP ranks, even if the main process
    read a sample before the workers started.

    Read paths, chosen from the layout, fastest first (the docs' HDF5 page has the measured rates):

    - contiguous, uncompressed dataset (what our converter writes): a read-only memory map at the dataset's
      byte offset; a batch is one sorted gather. No HDF5 call per sample at all.
    - chunked or compressed (files users wrote): each chunk a batch touches is read once, as a slice, through
      a chunk cache sized to hold it; never one fancy selection (pathologically slow in h5py).
    - variable-length encoded bytes: one read per sample, in sorted order.

    Encoded images are decoded by the same path as the folder module. Decoded arrays (``hwc``/``chw``) are
    cropped and resized from the stored pixels. Float arrays stay float (assumed already scaled as you
    want them; the DataModule normalises only uint8).

    Args:
        path: The HDF5 file, or the :class:`HDF5Layout` :func:`~lightning_fastdata.datasets.hdf5_file.inspect_hdf5`
            returned for it (not inspected again).
        images_key: Dataset of the images.
        labels_key: Dataset of the labels.
        layout: ``"auto"`` (from the file's attributes, dtype and shape), ``"encoded"``, ``"hwc"`` or ``"chw"``.
        offsets_key: Offsets dataset for encoded images stored as one blob.
        entropy_index: Decode each JPEG crop from its own bits with the entropy index the converter keeps in the
            file (:mod:`~lightning_fastdata.loading.jpeg.entropy_index`; the same pixels, less work), when the file
            has one; ``False``: never.
        indices: Use only these rows (e.g. a train/validation split); default all.
        locking: HDF5 file locking (``None``: the library default; ``False`` for NFS and other network file
            systems where locking fails or hangs).
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`
            (``train``, ``image_size``, ``scale``, ``ratio``, ``crop_fraction``, ``seed``, ``on_corrupt``).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: On a bad file layout (see :func:`~lightning_fastdata.datasets.hdf5_file.inspect_hdf5`) or an
            impossible argument.
    """

    per_process_attrs = ("_file", "_images", "_mapped", "_entropy")

    def __init__(
        self,
        path: str | HDF5Layout,
        images_key: str = "images",
        labels_key: str = "labels",
        layout: Layout = "auto",
        offsets_key: str = "offsets",
        indices: np.ndarray | None = None,
        locking: bool | None = None,
        entropy_index: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if layout not in ("auto", "encoded", "hwc", "chw"):
            raise InvalidValueError(f"layout should be 'auto', 'encoded', 'hwc' or 'chw', got {layout!r}.")
        if isinstance(path, HDF5Layout):
            self.layout = path  # already inspected (the DataModule inspects a file once for both of its splits)
        else:
            self.layout = inspect_hdf5(path, images_key, labels_key, layout, offsets_key, locking)
        self.locking = locking
        rows = np.arange(len(self.layout.labels)) if indices is None else np.asarray(indices, dtype=np.int64)
        self.rows = rows
        self._labels = self.layout.labels[rows]
        self._offsets = self.layout.offsets
        self._file: Any = None
        self._images: Any = None
        self._mapped: MappedFile | None = None
        entropy_offsets = self.layout.entropy_offsets
        self.use_entropy_index = entropy_index and entropy_offsets is not None and int(entropy_offsets[-1]) > 0
        self._entropy: np.memmap | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names (the file's ``classes`` attribute, or the label values as strings)."""
        return self.layout.classes

    @property
    def targets(self) -> np.ndarray:
        """Labels of this dataset's rows."""
        return self._labels

    def describe(self, index: int) -> str:
        """``file[images_key][row]``."""
        return f"{self.layout.path}[{self.layout.images_key!r}][{int(self.rows[index])}]"

    def make_identity(self) -> DataIdentity:
        """Each sample's row, label and (encoded) byte length; the file's size, dataset shape, dtype and classes.

        The pixels themselves are not read: a file rewritten with other images of the same sizes and labels keeps
        its identity.
        """
        lay = self.layout
        samples = mix(self.rows.astype(np.uint64)) ^ label_hashes(self._labels)
        if self._offsets is not None:
            lengths = np.diff(self._offsets)[self.rows].astype(np.uint64)
            samples ^= mix(lengths + np.uint64(0x632BE59BD9B4E019))
        extra = f"hdf5|{lay.images_key}|{lay.shape}|{lay.dtype}|{lay.signature[0]}|{'/'.join(lay.classes)}"
        return DataIdentity.of(lay.path, samples, extra)

    def entropy_index_of(self, index: int) -> bytes | None:
        """Sample ``index``'s entropy index from the file (a memory map of its blob), if the file has one."""
        if not self.use_entropy_index:
            return None
        self._open()  # (re)opened after a fork; checks that the file was not rewritten since it was inspected
        offsets, where = self.layout.entropy_offsets, self.layout.entropy_mmap_offset
        assert offsets is not None and where is not None  # use_entropy_index: the file has a non-empty blob
        if self._entropy is None:
            self._entropy = np.memmap(self.layout.path, np.uint8, "r", where, (int(offsets[-1]),))
        row = int(self.rows[index])
        start, end = int(offsets[row]), int(offsets[row + 1])
        return self._entropy[start:end].tobytes() if end > start else None

    def _open(self) -> Any:
        """The images array of this process: a memory map or an h5py dataset, (re)opened after a fork.

        Every call checks that the file was not truncated or rewritten since it was inspected (one ``fstat``).
        """
        if not self._handles_open():
            lay = self.layout
            self._mapped = MappedFile(lay.path, lay.signature, "HDF5 file")
            if lay.mmap_offset is not None:
                shape = (int(self._offsets[-1]),) if self._offsets is not None else lay.shape
                self._images = np.memmap(lay.path, dtype=lay.dtype, mode="r", offset=lay.mmap_offset, shape=shape)
            else:
                row_bytes = int(np.prod(lay.shape[1:])) * np.dtype(lay.dtype).itemsize if not lay.vlen else 0
                cache = max(1 << 20, 4 * (lay.chunk_rows or 1) * row_bytes)  # hold a few chunks whole
                try:
                    self._file = open_hdf5(lay.path, self.locking, swmr=True, rdcc_nbytes=cache)
                except (OSError, ValueError):  # not written with SWMR support: plain read-only
                    self._file = open_hdf5(lay.path, self.locking, rdcc_nbytes=cache)
                self._images = self._file[lay.images_key]
            self._mark_handles_open()
        else:
            assert self._mapped is not None
            self._mapped.check()
        return self._images

    def _read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Decoded arrays of sorted unique ``rows``: one gather from a memory map, or chunk-wise slices."""
        images = self._open()
        if isinstance(images, np.memmap):
            return images[rows]
        chunk = self.layout.chunk_rows
        if chunk is None:  # contiguous but not mappable (e.g. compressed without chunks cannot happen; safety)
            return np.stack([images[int(r)] for r in rows])
        out = np.empty((len(rows), *self.layout.shape[1:]), dtype=self.layout.dtype)
        chunk_ids = rows // chunk
        for cid in np.unique(chunk_ids):
            sel = np.flatnonzero(chunk_ids == cid)
            start = int(cid) * chunk
            block = images[start : min(start + chunk, self.layout.shape[0])]  # one slice: each chunk read once
            out[sel] = block[rows[sel] - start]
        return out

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """Read a batch in sorted row order; return the sources in ``indices`` order."""
        rows = self.rows[indices]
        uniq, inverse = np.unique(rows, return_inverse=True)
        if self.layout.kind == "encoded":
            images = self._open()
            if self._offsets is not None:
                offs = self._offsets
                blobs = [bytes(images[offs[r] : offs[r + 1]]) for r in uniq]
            else:
                blobs = [images[int(r)].tobytes() for r in uniq]
            return [blobs[i] for i in inverse]
        if self.layout.kind == "hwc":
            return list(gather_hwc(self._read_rows, rows))
        arrays = torch.from_numpy(np.ascontiguousarray(self._read_rows(uniq)))
        return [arrays[i] for i in inverse]
