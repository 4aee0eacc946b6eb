"""``PairedParquetDataset``: images and their targets' payloads from Parquet files (the hubs' layout).

The dataset hubs ship such sets as Parquet files with an image column (``image``) and the target's column beside it (a
segmentation mask: ``annotation``, ``label``, ...), each a ``{bytes, path}`` struct or plain bytes. A row is read with
its row group (Parquet compresses a column chunk as a whole;
:class:`~lightning_fastdata.datasets.group_reads.GroupReads`: each process keeps the last row groups it read, and the
training order shuffles windows of row groups, ``windows``), then rendered through its window as the folder source's
samples are. Files may be local or in a bucket (ranged requests, each answer checked against the file's version).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_fastdata.datasets.group_reads import GroupReads
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.parquet_index import ParquetIndex, image_values, load_parquet_index, open_parquet
from lightning_fastdata.loading.storage.base import is_url, local_files
from lightning_fastdata.loading.storage.ranged import (
    RemoteShard,
    bucket_storage,
    index_remote_parquet,
    remote_parquet_file,
    shard_indexes,
)
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["PairedParquetDataset", "has_parquet_files", "load_parquet_files"]


def has_parquet_files(spec: str) -> bool:
    """Whether the local ``spec`` (a folder, glob or brace pattern) names ``.parquet`` files (Parquet to "auto")."""
    return not is_url(spec) and any(
        p.endswith(".parquet") and os.path.isfile(p) for p in local_files(spec, [".parquet"])
    )


def load_parquet_files(
    spec: str, index_dir: str, image_column: str = "image", storage_options: Mapping[str, Any] | None = None
) -> list[ParquetIndex]:
    """The indexes (row groups) of the Parquet files ``spec`` names: a folder, a glob, or a bucket prefix or glob.

    Raises:
        FileNotFoundError: If nothing matches (named).
    """
    return shard_indexes(
        spec, ".parquet", storage_options,
        lambda path, remote: load_parquet_index(path, index_dir, image_column, None, remote),
        index_remote_parquet, image_column, None,
    )  # fmt: skip


def payload_values(column: Any) -> Any:
    """A payload column's values: binary ones (or a ``{bytes, path}`` struct's ``bytes``) as bytes, others as they are.

    Any other column (the hubs' ``objects`` struct of lists) reaches the target as each row's Python value.
    """
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_struct(arr.type) and arr.type.get_field_index("bytes") >= 0:
        return arr.field("bytes")
    return arr


def read_remote_pair(store: Any, shard: RemoteShard, group: int, image_column: str, column: str) -> Any:
    """A row group's image and payload bytes of a Parquet file in a bucket (the two column chunks, by ranges)."""
    table = remote_parquet_file(store, shard).read_row_group(group, columns=[image_column, column])
    return image_values(table.column(0), shard.url, image_column), payload_values(table.column(1))


class PairedParquetDataset(GroupReads, WindowedDataset):
    """The rows of Parquet files (an image column and the target's column), as whole batches.

    Args:
        files: Each file's :class:`~lightning_fastdata.loading.index.parquet_index.ParquetIndex` (its row groups).
        target: What rides with each image (:class:`~lightning_fastdata.sources.target.TargetKind`), bound to the
            first file's metadata (a local file's).
        column: The column of the target's payloads (bytes, or ``{bytes, path}`` structs).
        shuffle_buffer: The training order in windows of row groups holding about this many rows (``None``: a full
            shuffle, or the files' order where ``train`` is false).
        storage_options: Object-store settings for files in a bucket.
        cache_bytes: The row groups each process keeps beyond a window's, in bytes (a full shuffle's:
            :func:`~lightning_fastdata.datasets.group_reads.keep_for_random_reads`).
        **kwargs: The window settings of :class:`~lightning_fastdata.sources.windowed.WindowedDataset`.

    Raises:
        ValueError: If the files hold no row.
    """

    def __init__(
        self,
        files: Sequence[ParquetIndex],
        target: TargetKind,
        column: str,
        shuffle_buffer: int | None = 1000,
        storage_options: Mapping[str, Any] | None = None,
        cache_bytes: int = 0,
        **kwargs: Any,
    ) -> None:
        self.files, self.column, self.cache_bytes = list(files), column, int(cache_bytes)
        counts = [len(f) for f in self.files]
        if not sum(counts):
            raise InvalidValueError(f"The Parquet files {[f.path for f in self.files][:3]} hold no row.")
        WindowedDataset.__init__(self, target.bound("", self._metadata(), self.files[0].path), **kwargs)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._file_of = np.repeat(np.arange(len(self.files), dtype=np.int32), counts)
        in_file = np.arange(starts[-1]) - starts[self._file_of]
        first_group = np.concatenate([[0], np.cumsum([len(f.group_rows) for f in self.files])]).astype(np.int64)
        self._group_local = np.empty(len(in_file), dtype=np.int64)
        self._row_in_group = np.empty(len(in_file), dtype=np.int64)
        for k, f in enumerate(self.files):
            mine = self._file_of == k
            group_starts = np.concatenate([[0], np.cumsum(f.group_rows)])
            self._group_local[mine] = np.searchsorted(group_starts, in_file[mine], side="right") - 1
            self._row_in_group[mine] = in_file[mine] - group_starts[self._group_local[mine]]
        self._in_file = in_file
        self._group_of = first_group[self._file_of] + self._group_local
        self.windows = None if shuffle_buffer is None else self.group_windows(shuffle_buffer)
        self._storage: Any = bucket_storage([f.path for f in self.files], storage_options, "Parquet files")
        self._files: dict[int, Any] = {}
        self._pid = -1

    def _metadata(self) -> dict[str, Any]:
        """The first file's key-value metadata, as its index keeps it (a bucket's file as a local one's)."""
        return dict(self.files[0].metadata)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}, "_groups": None, "_pending": None, "_kept_bytes": None, "_pid": -1}

    # -- per-process handles (GroupReads keeps its row groups per process) ---------------------------------
    def _handles_open(self) -> bool:
        return self._pid == os.getpid()

    def _mark_handles_open(self) -> None:
        self._pid = os.getpid()

    def reset_groups(self) -> None:
        """Forget the kept row groups and the open files (a process of its own)."""
        super().reset_groups()
        self._files = {}

    def __len__(self) -> int:
        return len(self._file_of)

    def name(self, index: int, what: int = 0) -> str:
        """``file.parquet:row N`` of sample ``index`` (its payload: ``... (mask)``, the target's name)."""
        f = self.files[int(self._file_of[index])]
        return f"{f.path}:row {int(self._in_file[index])}{f' ({self.target.what})' if what else ''}"

    describe = name

    def group_calls(self, firsts: Sequence[int]) -> tuple[Any, list[tuple[Any, ...]]]:
        """``read_remote_pair`` of each sample's row group."""
        calls = []
        for i in firsts:
            f = self.files[int(self._file_of[i])]
            shard = RemoteShard(f.path, f.size, f.mtime_ns)
            calls.append((shard, int(self._group_local[i]), f.image_column, self.column))
        return read_remote_pair, calls

    def read_group(self, index: int) -> Any:
        """Sample ``index``'s row group's image and payload bytes, from its local file (an ``OSError`` if it fails)."""
        import pyarrow as pa

        k = int(self._file_of[index])
        f = self.files[k]
        pf = self._files.get(k)
        if pf is None:
            pf = self._files[k] = open_parquet(f)
            if pf.schema_arrow.get_field_index(self.column) < 0:
                raise DataError(
                    f"{f.path} has no {self.target.what} column {self.column!r}; its columns are "
                    f"{pf.schema_arrow.names}. Name it with {self.target.what}_column=."
                )
        try:
            table = pf.read_row_group(int(self._group_local[index]), columns=[f.image_column, self.column])
        except (pa.ArrowException, OSError) as err:
            return OSError(f"{f.path}: row group {int(self._group_local[index])} cannot be read ({err})")
        return image_values(table.column(0), f.path, f.image_column), payload_values(table.column(1))

    def sample_bytes(self, group: Any, index: int) -> Any:
        """The row's image and payload bytes (a null one is an error naming the row)."""
        row = int(self._row_in_group[index])
        image, payload = group[0][row], group[1][row]
        if not image.is_valid or not payload.is_valid:
            raise DataError(f"{self.describe(index)} has no {'image' if not image.is_valid else self.target.what}.")
        return image.as_py(), payload.as_py()

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each row's image and payload bytes, read with their row groups."""
        out: list[tuple[bytes | torch.Tensor, Any]] = []
        for i, value in zip(indices, self.read_grouped(np.asarray(indices, dtype=np.int64))):
            if isinstance(value, OSError):
                raise DataError(f"Cannot read {self.describe(i)}: {value}.") from value
            out.append(value)  # type: ignore[arg-type]  # read_grouped's sample_bytes: the pair
        return out

    def fingerprint(self) -> str:
        """Each file's path, size and version as indexed, and the columns read."""
        files = "|".join(f"{f.path}:{f.size}:{f.mtime_ns}:{f.image_column}" for f in self.files)
        return f"{files}|masks:{self.column}"
