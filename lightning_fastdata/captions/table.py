"""Captions from a table beside a folder of images: ``file,caption`` rows (CSV or Parquet), a file's rows its captions.

The layout of hand-made and benchmark sets (COCO Captions' five captions an image, Flickr30k's, a folder of photos and
a spreadsheet): ``CaptionTable(table)`` is a :data:`~lightning_fastdata.sources.folder.FolderLayout` that pairs each
image the table names (its path under the root) with its captions, read once (a local file or one in the bucket), so
:class:`~lightning_fastdata.sources.folder.PairedFolderDataset` reads the images and hands each its captions inline.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_fastdata.errors import DataError, PathNotFoundError
from lightning_fastdata.loading.storage.base import join_url
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.sources.folder import FolderPairs

__all__ = ["CaptionTable"]


@dataclass(frozen=True)
class CaptionTable:
    """A table of ``file`` and ``caption`` columns beside a folder (module docstring).

    Attributes:
        table: The table's path under the root (``captions.csv``, ``train.parquet``).
        file_column: The column of each image's path under the root.
        caption_column: The column of its caption.
    """

    table: str
    file_column: str = "file"
    caption_column: str = "caption"

    def rows(self, data: bytes, name: str) -> list[tuple[str, str]]:
        """The table's ``(file, caption)`` rows, in order."""
        if name.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            table = pq.read_table(io.BytesIO(data))
            missing = [c for c in (self.file_column, self.caption_column) if c not in table.column_names]
            if missing:
                raise DataError(f"{name} has no column {missing[0]!r} (its columns: {table.column_names}).")
            files, captions = (table.column(c).to_pylist() for c in (self.file_column, self.caption_column))
            return [(str(f), str(c)) for f, c in zip(files, captions) if c is not None]
        reader = csv.DictReader(io.StringIO(data.decode("utf-8-sig")))
        missing = [c for c in (self.file_column, self.caption_column) if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{name} has no column {missing[0]!r} (its header: {reader.fieldnames}).")
        return [(row[self.file_column], row[self.caption_column]) for row in reader if row[self.caption_column]]

    def __call__(self, root: str, split: str, options: Mapping[str, Any] | None) -> FolderPairs:
        """The images the table names, each with its captions (``split`` unused: a table is one split).

        Raises:
            FileNotFoundError: If the table, or an image it names, is missing (named).
            DataError: If the table lacks a column (named).
        """
        storage = open_storage(root, None if options is None else dict(options))
        where = join_url(root, self.table)
        read = next(iter(storage.read_many([self.table])))
        if isinstance(read, OSError):
            raise PathNotFoundError(f"The captions table {where} cannot be read ({read}).")
        captions: dict[str, list[str]] = {}
        for file, caption in self.rows(read, where):
            file = file.strip()
            captions.setdefault(file[2:] if file.startswith("./") else file, []).append(caption)
        index = storage.list_images()
        listed = {index.relpath(i) for i in range(len(index))}
        absent = [f for f in captions if f not in listed]
        if absent:
            raise PathNotFoundError(f"{where} names {len(absent)} image(s) {root} does not hold, e.g. {absent[0]!r}.")
        files = list(captions)
        return FolderPairs("table", tuple(files), tuple(f"{where}#{f}" for f in files),
                           tuple(captions[f] for f in files), (self.table,))  # fmt: skip
