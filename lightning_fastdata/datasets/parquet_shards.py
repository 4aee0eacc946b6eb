"""``ParquetShardDataset``: the rows of Parquet files of encoded images, read by row group and decoded as files are.

A row's image is read with its row group (the image column alone, ``pyarrow``), which each process keeps in a small
cache of whole row groups (:attr:`ParquetShardDataset.cache_groups`): the training order reads a window of row groups
at a time (:attr:`ParquetShardDataset.windows`), so each row group is read once per window by a process, not
once per row. The bytes then go through the folder module's path: the decode of the crop alone, the batch built in
shared memory, corrupt images by ``on_corrupt`` (a null image is a corrupt one). Rows are numbered file after file,
in file order. Each process opens the files itself and checks that each is the file indexed. Files in a bucket are
read in place: a row group's image column chunk is one ranged request, the row groups a batch lacks requested
together (:mod:`~lightning_fastdata.loading.storage.ranged`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix, string_hash
from lightning_fastdata.loading.index.parquet_index import ParquetIndex, image_values
from lightning_fastdata.loading.sampler import ShuffleWindows
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.ranged import RemoteShard, read_remote_row_group, split_url

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


class ParquetShardDataset(AugmentedImageDataset):
    """The rows of Parquet files (in the order given, each in file order), as whole uint8 batches.

    Args:
        files: Each file's :class:`~lightning_fastdata.loading.index.parquet_index.ParquetIndex`.
        classes: The class names, in label order. A file with named labels is mapped onto them by name.
        indices: The rows (numbered file after file) this dataset holds, in order; ``None``: all (a split).
        shuffle_buffer: The training order's window, in rows (:attr:`windows`); ``None``: no window (a full shuffle
            reads a row group per row: slow).
        cache_groups: How many row groups each process keeps (at least what one window reads, plus two).
        labelled: Whether every sample has a label in ``classes`` (``False``: samples to predict on, whose batches
            carry each sample's position, as a prediction folder's do).
        storage_options: Object-store settings for files in a bucket (their paths are URLs).
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`.

    Raises:
        ValueError: If there is no row, or a label is outside ``classes`` (naming the file and row).
    """

    per_process_attrs = ("_files", "_groups", "_pending")

    def __init__(
        self,
        files: Sequence[ParquetIndex],
        classes: Sequence[str],
        indices: np.ndarray | None = None,
        shuffle_buffer: int | None = 1000,
        cache_groups: int = 4,
        storage_options: Mapping[str, Any] | None = None,
        labelled: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
            if f.label_names:
                lookup = np.array([position.get(n, -1) for n in f.label_names], dtype=np.int64)
                labels.append(lookup[f.labels])
            else:
                labels.append(f.labels)
        self._targets = np.concatenate(labels).astype(np.int64)[rows]
        bad = np.flatnonzero((self._targets < 0) | (self._targets >= len(self._classes)))
        if not labelled:  # samples to predict on: a prediction batch carries each sample's position instead
            bad, self._targets = bad[:0], np.arange(len(self._targets), dtype=np.int64)
        if bad.size:
            raise InvalidValueError(
                f"{self.describe(int(bad[0]))} has a label outside the {len(self._classes)} classes "
                f"{list(self._classes)[:5]}; give every class a name (label_classes=)."
            )
        if cache_groups < 1:
            raise InvalidValueError(f"cache_groups should be a positive number of row groups, got {cache_groups!r}.")
        self.cache_groups = int(cache_groups)
        #: The training order that reads whole row groups (the loader's sampler takes it), or ``None``.
        self.windows = None if shuffle_buffer is None else self._shuffle_windows(shuffle_buffer)
        self._files: dict[int, Any] | None = None
        self._groups: OrderedDict[int, Any] | None = None
        self._pending: dict[int, Any] | None = None  # row groups read ahead (a bucket): their futures
        remote = [is_url(f.path) for f in self.files]
        if any(remote) and not all(remote):
            raise InvalidValueError("Give Parquet files all local or all in one bucket, not both.")
        self._storage: Any = None
        if all(remote):
            from lightning_fastdata.loading.storage.object_store import ObjectStorage

            roots = {split_url(f.path)[0] for f in self.files}
            if len(roots) > 1:
                raise InvalidValueError(f"Give Parquet files of one bucket, not of {sorted(roots)}.")
            self._storage = ObjectStorage(roots.pop(), storage_options)

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

    def _shuffle_windows(self, samples: int) -> ShuffleWindows:
        """Windows of row groups holding about ``samples`` rows; each process then keeps a window's (and two more)."""
        if samples < 1:
            raise InvalidValueError(f"shuffle_buffer should be a positive number of rows or None, got {samples!r}.")
        starts = np.flatnonzero(np.concatenate([[True], np.diff(self._group_of) != 0]))
        mean_rows = len(self._group_of) / len(starts)
        window = max(1, round(samples / mean_rows))
        self.cache_groups = max(self.cache_groups, window + 2)
        return ShuffleWindows(starts, window)

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
        import pyarrow.parquet as pq

        self._cache()
        assert self._files is not None
        pf = self._files.get(k)
        if pf is None:
            f = self.files[k]
            handle = open(f.path, "rb")  # noqa: SIM115 - kept open for the process's reads
            try:
                f.check_unchanged(os.fstat(handle.fileno()))
                pf = pq.ParquetFile(handle)
            except Exception:
                handle.close()
                raise
            self._files[k] = pf
        return pf

    def _cache(self) -> OrderedDict[int, Any]:
        if not self._handles_open() or self._groups is None:
            self._files, self._groups, self._pending = {}, OrderedDict(), {}
            self._mark_handles_open()
        return self._groups

    @property
    def reads_ahead(self) -> bool:
        """Files in a bucket: the next batch's row groups are requested while this one decodes."""
        return self._storage is not None

    def _missing(self, indices: np.ndarray) -> dict[int, int]:
        """The row groups of ``indices`` neither kept nor requested, each named by one of its samples."""
        groups, pending = self._cache(), self._pending or {}
        missing: dict[int, int] = {}
        for i in indices.tolist():
            g = int(self._group_of[i])
            if g not in groups and g not in pending and g not in missing:
                missing[g] = i
        return missing

    def _calls(self, firsts: dict[int, int]) -> list[tuple[Any, ...]]:
        calls = []
        for i in firsts.values():
            f = self.files[int(self._file_of[i])]
            calls.append((RemoteShard(f.path, f.size, f.mtime_ns), int(self._group_local[i]), f.image_column))
        return calls

    def read_ahead(self, indices: np.ndarray) -> None:
        """Start the requests of the row groups ``indices`` (this worker's next batch) lacks (a bucket)."""
        if self._storage is None:
            return
        for future in (self._pending or {}).values():
            future.cancel()  # a guess that was not read: the previous batch took what it needed
        if self._pending:
            self._pending.clear()
        missing = self._missing(indices)
        futures = self._storage.start_many(read_remote_row_group, self._calls(missing)) if missing else None
        if futures is not None and self._pending is not None:
            self._pending.update(zip(missing, futures))

    def _keep(self, g: int, values: Any) -> None:
        groups = self._cache()
        groups[g] = values
        while len(groups) > self.cache_groups:
            groups.popitem(last=False)

    def _fetch_remote(self, firsts: dict[int, int]) -> dict[int, Any]:
        """Row groups (each named by one of its samples): read ahead already, or requested together now.

        An ``OSError`` in place of one that failed.
        """
        pending = self._pending if self._pending is not None else {}
        ahead = [g for g in firsts if g in pending]
        results: dict[int, Any] = {}
        for g in ahead:
            try:
                results[g] = pending.pop(g).result()
            except Exception as err:  # noqa: BLE001 - handled below as run_many's are
                results[g] = err
        rest = {g: i for g, i in firsts.items() if g not in results}
        calls = self._calls(firsts)
        if rest:
            results.update(zip(rest, self._storage.run_many(read_remote_row_group, self._calls(rest))))
        out: dict[int, Any] = {}
        for g, call in zip(firsts, calls):
            values = results[g]
            if isinstance(values, DataError):
                raise values  # a file that changed after it was indexed: never read
            if isinstance(values, BaseException) and not isinstance(values, OSError):
                values = OSError(f"{call[0].url}: row group {call[1]} cannot be read ({values})")
            out[g] = values
        return out

    def _read_local(self, index: int) -> Any:
        """The image bytes of sample ``index``'s row group, read from its local file (an ``OSError`` if it fails)."""
        import pyarrow as pa

        k = int(self._file_of[index])
        pf, f = self._file(k), self.files[k]
        try:
            table = pf.read_row_group(int(self._group_local[index]), columns=[f.image_column])
        except (pa.ArrowException, OSError) as err:
            return OSError(f"{f.path}: row group {int(self._group_local[index])} cannot be read ({err})")
        return image_values(table.column(0), f.path, f.image_column)

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """Each sample's image bytes from its row group (an ``OSError`` in its place where a read fails)."""
        groups = self._cache()
        batch: dict[int, Any] = {}  # the batch's row groups: kept ones, then the others read
        missing: dict[int, int] = {}
        for i in indices.tolist():
            g = int(self._group_of[i])
            if g in batch or g in missing:
                continue
            if g in groups:
                groups.move_to_end(g)
                batch[g] = groups[g]
            else:
                missing[g] = i
        if self._storage is not None:
            read = self._fetch_remote(missing) if missing else {}
        else:
            read = {g: self._read_local(i) for g, i in missing.items()}
        for g, values in read.items():
            if not isinstance(values, OSError):
                self._keep(g, values)
        batch.update(read)
        out: list[Source] = []
        for i in indices.tolist():
            values = batch[int(self._group_of[i])]
            if isinstance(values, OSError):
                out.append(values)
                continue
            value = values[int(self._row_in_group[i])]
            out.append(value.as_py() if value.is_valid else b"")  # a null image: corrupt (on_corrupt)
        return out
