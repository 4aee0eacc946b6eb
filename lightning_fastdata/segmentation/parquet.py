"""``SegmentationParquetDataset``: images and masks from Parquet files (the hubs' segmentation layout).

The dataset hubs ship segmentation sets as Parquet files with two image columns: the picture (``image``) and its
mask (``annotation``, ``label``, ...: ``mask_column=``), each a ``{bytes, path}`` struct or plain bytes, the mask a
PNG whose values are the classes. A row is read with its row group (Parquet compresses a column chunk as a whole;
:class:`~lightning_fastdata.datasets.group_reads.GroupReads`: each process keeps the last row groups it read, and the
training order shuffles windows of row groups, ``windows``), then rendered through
its window as the folder source's samples are. Files may be local or in a bucket (ranged requests, each answer
checked against the file's version).
"""

from __future__ import annotations

import glob
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.datasets.group_reads import GroupReads
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.parquet_index import ParquetIndex, image_values, load_parquet_index
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.ranged import (
    RangedFile,
    RemoteShard,
    bucket_storage,
    index_remote_parquet,
    shard_indexes,
)
from lightning_fastdata.segmentation.dataset import WindowedSegmentation, read_mask, sample_key
from lightning_fastdata.segmentation.layouts import (
    CONVERTED_MASKS,
    map_mask,
    mask_table,
    refuse_named_table_on_classes,
)

__all__ = ["SegmentationParquetDataset", "has_parquet_files", "load_parquet_files"]


def has_parquet_files(folder: str) -> bool:
    """Whether the local ``folder`` holds ``.parquet`` files (what ``layout="auto"`` reads as Parquet)."""
    return os.path.isdir(folder) and bool(glob.glob(os.path.join(glob.escape(folder), "*.parquet")))


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


#: This process's open remote Parquet files (footers read), by URL and version.
_REMOTE: OrderedDict[tuple[str, int], Any] = OrderedDict()


def read_remote_pair(store: Any, shard: RemoteShard, group: int, image_column: str, mask_column: str) -> Any:
    """A row group's image and mask bytes of a Parquet file in a bucket (the two column chunks, by ranges)."""
    import pyarrow.parquet as pq

    key = (shard.url, shard.version)
    pf = _REMOTE.get(key)
    if pf is None:
        pf = _REMOTE[key] = pq.ParquetFile(RangedFile(store, shard, block=1 << 16))
        while len(_REMOTE) > 64:
            _REMOTE.popitem(last=False)
    table = pf.read_row_group(group, columns=[image_column, mask_column])
    return image_values(table.column(0), shard.url, image_column), image_values(table.column(1), shard.url, mask_column)


class SegmentationParquetDataset(GroupReads, WindowedSegmentation):
    """The rows of Parquet files (image and mask columns), as whole batches of images and masks.

    Args:
        files: Each file's :class:`~lightning_fastdata.loading.index.parquet_index.ParquetIndex` (its row groups).
        mask_column: The column of the masks (PNG bytes, or ``{bytes, path}`` structs).
        num_classes: The classes a mask holds.
        label_map: Mask value -> class (or -> ``ignore_index``), or ``"ade20k"``/``"cityscapes"`` (that layout's
            table); ``None``: the values are the classes.
        shuffle_buffer: The training order in windows of row groups holding about this many rows (``None``: a full
            shuffle, a row group's read per row).
        storage_options: Object-store settings for files in a bucket.
        ignore_index: The mask value of borders and padding.
        **kwargs: The window settings of :class:`~lightning_fastdata.segmentation.dataset.WindowedSegmentation`.

    Raises:
        ValueError: If the files hold no row.
    """

    def __init__(
        self,
        files: Sequence[ParquetIndex],
        mask_column: str = "annotation",
        num_classes: int = 21,
        label_map: Mapping[int, int] | str | None = None,
        shuffle_buffer: int | None = 1000,
        storage_options: Mapping[str, Any] | None = None,
        ignore_index: int = 255,
        **kwargs: Any,
    ) -> None:
        WindowedSegmentation.__init__(self, num_classes=num_classes, ignore_index=ignore_index, **kwargs)
        self.files, self.mask_column = list(files), mask_column
        counts = [len(f) for f in self.files]
        if not sum(counts):
            raise InvalidValueError(f"The Parquet files {[f.path for f in self.files][:3]} hold no row.")
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
        if isinstance(label_map, str) and not is_url(self.files[0].path):
            import pyarrow.parquet as pq

            marker = (pq.read_schema(self.files[0].path).metadata or {}).get(CONVERTED_MASKS.encode())
            refuse_named_table_on_classes(label_map, marker, self.files[0].path)
        if label_map is not None:
            self.table = mask_table("", num_classes, ignore_index, label_map)
        self.windows = None if shuffle_buffer is None else self.group_windows(shuffle_buffer)
        self._storage: Any = bucket_storage([f.path for f in self.files], storage_options, "Parquet files")
        self._files: dict[int, Any] = {}
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}, "_groups": None, "_pending": None, "_pid": -1}

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

    def describe(self, index: int, what: int = 0) -> str:
        """``file.parquet:row N`` of sample ``index`` (its mask: ``... (mask)``)."""
        f = self.files[int(self._file_of[index])]
        return f"{f.path}:row {int(self._in_file[index])}{' (mask)' if what else ''}"

    def group_calls(self, firsts: Sequence[int]) -> tuple[Any, list[tuple[Any, ...]]]:
        """``read_remote_pair`` of each sample's row group."""
        calls = []
        for i in firsts:
            f = self.files[int(self._file_of[i])]
            shard = RemoteShard(f.path, f.size, f.mtime_ns)
            calls.append((shard, int(self._group_local[i]), f.image_column, self.mask_column))
        return read_remote_pair, calls

    def read_group(self, index: int) -> Any:
        """Sample ``index``'s row group's image and mask bytes, from its local file (an ``OSError`` if it fails)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        k = int(self._file_of[index])
        f = self.files[k]
        pf = self._files.get(k)
        if pf is None:
            handle = open(f.path, "rb")  # noqa: SIM115 - kept open for the process's reads
            f.check_unchanged(os.fstat(handle.fileno()))
            pf = self._files[k] = pq.ParquetFile(handle)
            if pf.schema_arrow.get_field_index(self.mask_column) < 0:
                raise DataError(
                    f"{f.path} has no mask column {self.mask_column!r}; its columns are {pf.schema_arrow.names}. "
                    "Name it with mask_column=."
                )
        try:
            table = pf.read_row_group(int(self._group_local[index]), columns=[f.image_column, self.mask_column])
        except (pa.ArrowException, OSError) as err:
            return OSError(f"{f.path}: row group {int(self._group_local[index])} cannot be read ({err})")
        return image_values(table.column(0), f.path, f.image_column), image_values(table.column(1), f.path,
                                                                                 self.mask_column)  # fmt: skip

    def sample_bytes(self, group: Any, index: int) -> Any:
        """The row's image and mask bytes (a null one is an error naming the row)."""
        row = int(self._row_in_group[index])
        image, mask = group[0][row], group[1][row]
        if not image.is_valid or not mask.is_valid:
            raise DataError(f"{self.describe(index)} has no {'image' if not image.is_valid else 'mask'}.")
        return image.as_py(), mask.as_py()

    def _pairs(self, indices: Sequence[int]) -> list[Any]:
        out = []
        for i, value in zip(indices, self.read_grouped(np.asarray(indices, dtype=np.int64))):
            if isinstance(value, OSError):
                raise DataError(f"Cannot read {self.describe(i)}: {value}.") from value
            out.append(value)
        return out

    def fingerprint(self) -> str:
        """Each file's path, size and version as indexed, and the columns read."""
        files = "|".join(f"{f.path}:{f.size}:{f.mtime_ns}:{f.image_column}" for f in self.files)
        return f"{files}|masks:{self.mask_column}"

    def masks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every row's mask as the data's classes, a row group at a time."""
        for first in range(0, len(self), 64):
            indices = list(range(first, min(first + 64, len(self))))
            for i, (_, mask) in zip(indices, self._pairs(indices)):
                name = self.describe(i, 1)
                yield i, map_mask(read_mask(mask, name), self.table, name, self.num_classes, self.ignore_index)

    def __getitems__(self, keys: Sequence[Any]) -> Any:
        """A batch: images (uint8 ``N x 3 x H x W``) and masks (uint8 ``N x H x W``), padded to the largest."""
        full = [sample_key(k, len(self)) for k in keys]
        samples = []
        for f, draws, (image, mask) in zip(full, self.draws_of(full), self._pairs([f[1] for f in full])):
            names = (self.describe(f[1]), self.describe(f[1], 1))
            samples.append(self.render(f, image, self.classes_of(read_mask(mask, names[1]), names[1]), names, draws))
        return self.batch(samples, full)
