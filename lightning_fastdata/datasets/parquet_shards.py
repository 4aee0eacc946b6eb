"""``ParquetShardDataset``: the rows of Parquet files of encoded images, read by row group and decoded as files are.

A row's image is read with its row group (the image column alone, ``pyarrow``), which each process keeps in a small
cache of whole row groups (``cache_groups``): the training order reads a window of row groups
at a time (:attr:`ParquetShardDataset.windows`), so each row group is read once per window by a process, not
once per row. The bytes then go through the folder module's path: the decode of the crop alone, the batch built in
shared memory, corrupt images by ``on_corrupt`` (a null image is a corrupt one). Rows are numbered file after file,
in file order. Each process opens the files itself and checks that each is the file indexed. Files in a bucket are
read in place: a row group's image column chunk is one ranged request, the row groups a batch lacks requested
together (:mod:`~lightning_fastdata.loading.storage.ranged`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.datasets.group_reads import GroupReads
from lightning_fastdata.datasets.shard_sources import UNLABELLED, ShardEntropy, shard_targets
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix, string_hash
from lightning_fastdata.loading.index.parquet_index import ParquetIndex, image_values, open_parquet
from lightning_fastdata.loading.storage.ranged import RemoteShard, bucket_storage, read_remote_row_group

__all__ = ["ParquetShardDataset", "common_classes"]


def common_classes(files: Sequence[ParquetIndex]) -> tuple[str, ...] | None:
    """The class names of files whose labels are names (a ``ClassLabel``'s, or strings); ``None`` for numbers.

    The files' own list where they all have the same (a ``ClassLabel``), else the sorted union of their names.
    """
    lists = {f.label_names for f in files if f.label_names}
    if not lists:
        return None
    if len(lists) == 1:
        return next(iter(lists))
    return tuple(sorted({n for names in lists for n in names}))


class ParquetShardDataset(ShardEntropy, GroupReads, AugmentedImageDataset):
    """The rows of Parquet files (in the order given, each in file order), as whole uint8 batches.

    Args:
        files: Each file's :class:`~lightning_fastdata.loading.index.parquet_index.ParquetIndex`.
        classes: The class names, in label order. A file with named labels is mapped onto them by name.
        indices: The rows (numbered file after file) this dataset holds, in order; ``None``: all (a split).
        shuffle_buffer: The training order's window, in rows (:attr:`windows`); ``None``: no window (a full shuffle,
            or the files' order for evaluation).
        cache_groups: How many row groups each process keeps (at least what one window reads, plus two).
        cache_bytes: The row groups each process keeps beyond ``cache_groups``, in bytes (a full shuffle's:
            :func:`~lightning_fastdata.datasets.group_reads.keep_for_random_reads`; beyond it, a row group is read
            for each of its rows drawn).
        entropy_indexes: The entropy indexes of every sample of these shards
            (:func:`~lightning_fastdata.datasets.shard_sources.shard_file_index`'s list), or ``None``.
        labelled: Whether every sample has a label in ``classes`` (``False``: samples to predict on, whose batches
            carry each sample's position, as a prediction folder's do).
        storage_options: Object-store settings for files in a bucket (their paths are URLs).
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`.

    Raises:
        ValueError: If there is no row, or a label is outside ``classes`` (naming the file and row).
    """

    per_process_attrs = ("_files", "_groups", "_pending", "_kept_bytes")

    def __init__(
        self,
        files: Sequence[ParquetIndex],
        classes: Sequence[str],
        indices: np.ndarray | None = None,
        shuffle_buffer: int | None = 1000,
        cache_groups: int = 4,
        cache_bytes: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        labelled: bool = True,
        entropy_indexes: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.entropy_indexes = entropy_indexes
        self.files = list(files)
        self._classes = tuple(str(c) for c in classes)
        counts = [len(f) for f in self.files]
        if not sum(counts):
            raise InvalidValueError(f"The Parquet files {[f.path for f in self.files][:3]} hold no row.")
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows = np.arange(starts[-1]) if indices is None else np.asarray(indices, dtype=np.int64)
        self._rows = rows
        self._file_of = np.repeat(np.arange(len(self.files), dtype=np.int32), counts)[rows]
        in_file = rows - starts[self._file_of]
        # each row's row group (numbered over all files) and its row within it
        group_starts = [np.concatenate([[0], np.cumsum(f.group_rows)]) for f in self.files]
        first_group = np.concatenate([[0], np.cumsum([len(f.group_rows) for f in self.files])]).astype(np.int64)
        local = np.empty(len(rows), dtype=np.int64)
        self._row_in_group = np.empty(len(rows), dtype=np.int64)
        for k, gs in enumerate(group_starts):
            mine = self._file_of == k
            local[mine] = np.searchsorted(gs, in_file[mine], side="right") - 1
            self._row_in_group[mine] = in_file[mine] - gs[local[mine]]
        self._group_of = first_group[self._file_of] + local
        self._group_local = local
        position = {name: k for k, name in enumerate(self._classes)}
        labels = []
        for f in self.files:
            raw = np.asarray(f.labels, dtype=np.int64)
            mapped = np.where(raw < 0, UNLABELLED, raw)  # the hubs' ClassLabel -1: no label, never an index
            if f.label_names:
                lookup = np.array([position.get(n, -1) for n in f.label_names], dtype=np.int64)
                mapped[raw >= 0] = lookup[raw[raw >= 0]]
            labels.append(mapped)
        self._targets = shard_targets(np.concatenate(labels)[rows], self._classes, labelled, self.describe)
        if cache_groups < 1:
            raise InvalidValueError(f"cache_groups should be a positive number of row groups, got {cache_groups!r}.")
        self.cache_groups, self.cache_bytes = int(cache_groups), int(cache_bytes)
        #: The training order that reads whole row groups (the loader's sampler takes it), or ``None``.
        self.windows = None if shuffle_buffer is None else self.group_windows(shuffle_buffer)
        self._files: dict[int, Any] | None = None
        self._storage: Any = bucket_storage([f.path for f in self.files], storage_options, "Parquet files")

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, in label order."""
        return self._classes

    @property
    def targets(self) -> np.ndarray:
        """Every row's label (int64), file after file."""
        return self._targets

    def describe(self, index: int) -> str:
        """``file.parquet:row N (row group G)`` of sample ``index``."""
        f = self.files[int(self._file_of[index])]
        row = int(self._rows[index]) - int(sum(len(x) for x in self.files[: int(self._file_of[index])]))
        return f"{f.path}:row {row} (row group {int(self._group_local[index])})"

    def make_identity(self) -> DataIdentity:
        """Each row's file, row and label, and each file's size, in this order."""
        names = np.concatenate(
            [
                mix(np.arange(len(f), dtype=np.uint64)) ^ np.uint64(string_hash(os.path.basename(f.path)))
                for f in self.files
            ]
        )
        samples = label_hashes(self._targets) ^ mix(names[self._rows])
        sizes = "|".join(str(f.size) for f in self.files)
        return DataIdentity.of(self.files[0].path, samples, "parquet|" + "/".join(self._classes) + "|" + sizes)

    def _file(self, k: int) -> Any:

        self._kept()
        assert self._files is not None
        pf = self._files.get(k)
        if pf is None:
            pf = self._files[k] = open_parquet(self.files[k])
        return pf

    def reset_groups(self) -> None:
        """Forget the kept row groups and the open files (a process of its own)."""
        super().reset_groups()
        self._files = {}

    @property
    def reads_ahead(self) -> bool:
        """Whether the next batch's row groups are requested while this one decodes (files in a bucket)."""
        return self._storage is not None

    def read_ahead(self, indices: np.ndarray) -> None:
        """Start the requests of the row groups ``indices`` (this worker's next batch) lacks (a bucket)."""
        self.read_groups_ahead(indices)

    def group_calls(self, firsts: Sequence[int]) -> tuple[Any, list[tuple[Any, ...]]]:
        """:func:`~lightning_fastdata.loading.storage.ranged.read_remote_row_group` of each sample's row group."""
        calls = []
        for i in firsts:
            f = self.files[int(self._file_of[i])]
            calls.append((RemoteShard(f.path, f.size, f.mtime_ns), int(self._group_local[i]), f.image_column))
        return read_remote_row_group, calls

    def read_group(self, index: int) -> Any:
        """The image bytes of sample ``index``'s row group, read from its local file (an ``OSError`` if it fails)."""
        import pyarrow as pa

        k = int(self._file_of[index])
        pf, f = self._file(k), self.files[k]
        try:
            table = pf.read_row_group(int(self._group_local[index]), columns=[f.image_column])
        except (pa.ArrowException, OSError) as err:
            return OSError(f"{f.path}: row group {int(self._group_local[index])} cannot be read ({err})")
        return image_values(table.column(0), f.path, f.image_column)

    def sample_bytes(self, group: Any, index: int) -> bytes:
        """The row's image bytes (``b""`` for a null image: a corrupt sample, as ``on_corrupt`` says)."""
        value = group[int(self._row_in_group[index])]
        return value.as_py() if value.is_valid else b""

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """Each sample's image bytes from its row group (an ``OSError`` in its place where a read fails)."""
        return list(self.read_grouped(indices))
