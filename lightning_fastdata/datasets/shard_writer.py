"""Shards written from an image folder: WebDataset tars, or Parquet files as the dataset hubs write them.

:func:`write_tar_shards` packs a folder's files, in its listing's order, into uncompressed tars of about
``shard_bytes`` each (``shard-000000.tar``, ...: ``<key>.<ext>`` and ``<key>.cls`` members), and the class names
beside them (``classes.json``). :func:`write_parquet_shards` writes Parquet files of about ``shard_bytes`` each
(``shard-000000.parquet``, ...) with the hubs' columns: ``image`` (a ``{bytes, path}`` struct) and ``label`` (int64,
a ``ClassLabel`` whose names are in the ``huggingface`` schema metadata), in row groups of ``rows_per_group`` rows.
Each shard is written under a temporary name and renamed when whole; the files' bytes are copied as they are.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_path, atomic_write_text
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.storage.local import LocalStorage

__all__ = ["write_parquet_shards", "write_tar_shards"]


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # the same shards from the same files, whenever written
    tf.addfile(info, io.BytesIO(data))


def _listing(src: str | os.PathLike[str] | FileIndex, dst: str | os.PathLike[str], shard_bytes: int) -> FileIndex:
    """The folder's file index; refuses a bad size, or ``dst`` inside ``src`` (the data are read-only to us)."""
    if shard_bytes <= 0:
        raise InvalidValueError(f"shard_bytes should be a positive size in bytes, got {shard_bytes!r}.")
    index = src if isinstance(src, FileIndex) else LocalStorage(os.fspath(src)).list_files()
    root, out = os.path.realpath(index.root), os.path.realpath(os.fspath(dst))
    if out == root or out.startswith(root + os.sep):
        raise InvalidValueError(f"dst {os.fspath(dst)!r} is inside the data folder {index.root!r}; write it elsewhere.")
    Path(dst).mkdir(parents=True, exist_ok=True)
    return index


def _pack(
    index: FileIndex,
    dst: str | os.PathLike[str],
    name: str,
    shard_bytes: int,
    step: int,
    overhead: int,
    open_writer: Callable[[Path], Any],
    write: Callable[[Any, list[tuple[int, bytes]]], None],
) -> list[Path]:
    """Write ``index``'s files, in order, into shards ``dst/<name % k>`` of about ``shard_bytes`` each.

    Each shard is written under a temporary name (``open_writer(tmp)``, a context manager) and renamed when whole;
    ``write(writer, rows)`` writes ``step`` files at a time (their positions and bytes), each counted at its size
    plus ``overhead``; a shard holds at least one step.
    """
    written: list[Path] = []
    i, n = 0, len(index)
    while i < n:
        path = Path(dst) / (name % len(written))
        with atomic_path(path) as tmp, open_writer(tmp) as writer:
            size = 0
            while i < n and (size == 0 or size < shard_bytes):
                rows = [(j, Path(index.path(j)).read_bytes()) for j in range(i, min(n, i + step))]
                write(writer, rows)
                size += sum(len(data) + overhead for _, data in rows)
                i += len(rows)
        written.append(path)
    return written


def write_tar_shards(
    src: str | os.PathLike[str] | FileIndex,
    dst: str | os.PathLike[str],
    shard_bytes: int = 1 << 30,
    prefix: str = "shard",
) -> list[Path]:
    """Pack ``src/<class>/<image>`` (or a :class:`~lightning_fastdata.loading.index.files.FileIndex`) into tar shards.

    Sample ``i`` (in the listing's order) has the key ``{i:08d}``, its image member keeps the file's extension (lower
    case), its ``.cls`` member holds its label; ``dst/classes.json`` lists the class names.

    Returns:
        The shards written, in order.

    Raises:
        ValueError: If ``shard_bytes`` is not positive, or ``dst`` is inside ``src`` (the data are read-only to us).
    """
    index = _listing(src, dst, shard_bytes)

    def write(tf: tarfile.TarFile, rows: list[tuple[int, bytes]]) -> None:
        for i, data in rows:
            ext = os.path.splitext(index.relpath(i))[1].lower().lstrip(".") or "jpg"
            _add(tf, f"{i:08d}.{ext}", data)
            _add(tf, f"{i:08d}.cls", str(int(index.labels[i])).encode())

    def open_tar(tmp: Path) -> tarfile.TarFile:
        return tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT)

    written = _pack(index, dst, f"{prefix}-%06d.tar", shard_bytes, 1, 1024, open_tar, write)
    atomic_write_text(Path(dst) / "classes.json", json.dumps(list(index.classes)))
    return written


def write_parquet_shards(
    src: str | os.PathLike[str] | FileIndex,
    dst: str | os.PathLike[str],
    shard_bytes: int = 1 << 30,
    prefix: str = "shard",
    rows_per_group: int = 100,
) -> list[Path]:
    """Write ``src/<class>/<image>`` (or a :class:`~lightning_fastdata.loading.index.files.FileIndex`) as Parquet.

    The hubs' layout (module docstring): what ``datasets.load_dataset("parquet", ...)`` and
    :class:`~lightning_fastdata.datamodules.shards.ShardDataModule` read, the class names in the schema metadata.

    Returns:
        The files written, in order.

    Raises:
        ValueError: If ``shard_bytes`` or ``rows_per_group`` is not positive, or ``dst`` is inside ``src``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if rows_per_group <= 0:
        raise InvalidValueError(f"rows_per_group should be a positive number of rows, got {rows_per_group!r}.")
    index = _listing(src, dst, shard_bytes)
    features = {"image": {"_type": "Image"}, "label": {"names": list(index.classes), "_type": "ClassLabel"}}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image_type), ("label", pa.int64())]).with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}
    )

    def write(writer: Any, rows: list[tuple[int, bytes]]) -> None:
        images = [{"bytes": data, "path": index.relpath(j)} for j, data in rows]
        labels = [int(index.labels[j]) for j, _ in rows]
        writer.write_table(pa.table({"image": images, "label": labels}, schema=schema))

    def open_parquet(tmp: Path) -> Any:
        return pq.ParquetWriter(tmp, schema)

    return _pack(index, dst, f"{prefix}-%06d.parquet", shard_bytes, rows_per_group, 0, open_parquet, write)
