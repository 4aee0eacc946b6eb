"""A folder of images with a captions table as img2dataset's tar shards or Parquet (``fastdata convert captions``).

The source is what :class:`~lightning_fastdata.captions.table.CaptionTable` reads (a folder, local or in a bucket, and
a ``file,caption`` table under it, a file's rows its captions). Tar: each pair is ``<key>.<ext>`` (the image's bytes as
they are), ``<key>.txt`` (its first caption) and ``<key>.json`` (``{"caption": ..., "file": ...}``: the caption, or
the list of its captions where it has several, and the image's path under the root), img2dataset's layout; Parquet:
an ``image`` column (the hubs' ``{bytes, path}`` structs) and a ``caption`` column (a string, or a list of strings
when an image has several). So :class:`~lightning_fastdata.ImageTextDataModule` reads them (``caption_field="caption"``
for a tar's every caption). Written by :func:`~lightning_fastdata.convert.shards.pack_shards`: each shard under a
temporary name, renamed when whole; nothing written into the source.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

from lightning_fastdata.captions.table import CaptionTable
from lightning_fastdata.captions.target import CaptionTarget, read_captions
from lightning_fastdata.convert.shards import add_member, pack_shards, shard_destination
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.sources.folder import PairedFolderDataset

__all__ = ["write_caption_shards"]

#: A converted pair: its position, the image's bytes, its extension, its captions, its path under the root.
_Row = tuple[int, bytes, str, list[str], str]


def write_caption_shards(
    root: str | os.PathLike[str],
    captions_table: str,
    dst: str | os.PathLike[str],
    fmt: str = "tar",
    shard_bytes: int | None = None,
    rows_per_group: int = 100,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> list[Path]:
    """Write the pairs of ``root`` and its ``captions_table`` into ``dst`` (module docstring); returns the files.

    ``fmt``: ``"tar"`` (shards of about ``shard_bytes``, default 64 MB) or ``"parquet"`` (files of about
    ``shard_bytes``, default 256 MB, in row groups of ``rows_per_group``); the pairs in the table's order.

    Raises:
        FileNotFoundError: If the table, or an image it names, is missing (named).
        FileExistsError: If ``dst`` already holds such files and not ``overwrite``.
        ValueError: On a bad ``fmt``, size or row group, or a ``dst`` inside ``root``; DataError: a table without
            its columns (named).
    """
    size = shard_bytes if shard_bytes is not None else (64 if fmt == "tar" else 256) * 2**20
    if size <= 0 or rows_per_group <= 0 or fmt not in ("tar", "parquet"):
        raise InvalidValueError(
            f"shard_bytes and rows_per_group should be positive and fmt 'tar' or 'parquet', got {shard_bytes!r}, "
            f"{rows_per_group!r}, {fmt!r}."
        )
    root = os.fspath(root)
    data = PairedFolderDataset(root, "", CaptionTarget(), CaptionTable(captions_table), storage_options)
    name = "shard-%06d.tar" if fmt == "tar" else "part-%06d.parquet"
    shard_destination(dst, name, overwrite, None if is_url(root) else root)

    def read(start: int, stop: int) -> list[_Row]:
        rows = []
        for i, (image, payload) in zip(range(start, stop), data.read_fields(list(range(start, stop)))):
            assert isinstance(image, bytes)
            path = data.pairs.images[i]
            ext = path.rsplit(".", 1)[-1].lower()
            rows.append((i, image, ext, read_captions(payload, data.name(i, 1)), path))
        return rows

    def write_tar(tf: tarfile.TarFile, rows: list[_Row]) -> None:
        for i, image, ext, captions, path in rows:
            meta = {"caption": captions[0] if len(captions) == 1 else captions, "file": path}
            add_member(tf, f"{i:09d}.{ext}", image)
            add_member(tf, f"{i:09d}.txt", captions[0].encode())
            add_member(tf, f"{i:09d}.json", json.dumps(meta).encode())

    def open_tar(tmp: Path) -> tarfile.TarFile:
        return tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT)

    if fmt == "tar":
        opener, writer, step = open_tar, write_tar, 4
    else:
        several = any(len(data.pairs.inline[i]) > 1 for i in range(len(data))) if data.pairs.inline else False
        opener, writer = _parquet_writer(several)
        step = rows_per_group
    return pack_shards(
        len(data), read, lambda row: len(row[1]) + sum(len(c) for c in row[3]) + 2048, dst, name, size, step,
        opener, writer, f"{fmt} shards (captions)" if progress else None,
    )  # fmt: skip


def _parquet_writer(several: bool) -> tuple[Any, Any]:
    """The Parquet writer's opener and row writer: ``image`` structs and ``caption`` (a list where ``several``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    text = pa.list_(pa.string()) if several else pa.string()
    schema = pa.schema([("image", kind), ("caption", text)])

    def open_parquet(tmp: Path) -> Any:
        return pq.ParquetWriter(tmp, schema)

    def write(writer: Any, rows: list[_Row]) -> None:
        images = [{"bytes": image, "path": os.path.basename(path)} for _, image, _, _, path in rows]
        captions = [c if several else c[0] for _, _, _, c, _ in rows]
        writer.write_table(pa.Table.from_arrays([pa.array(images, kind), pa.array(captions, text)], schema=schema))

    return open_parquet, write
