"""Shards written from an image folder: WebDataset tars, or Parquet files as the dataset hubs write them.

:func:`write_tar_shards` packs a folder's files, in its listing's order, into uncompressed tars of about
``shard_bytes`` each (``shard-000000.tar``, ...: ``<key>.<ext>`` and ``<key>.cls`` members), and the class names
beside them (``classes.json``). :func:`write_parquet_shards` writes Parquet files of about ``shard_bytes`` each
(``shard-000000.parquet``, ...) with the hubs' columns: ``image`` (a ``{bytes, path}`` struct) and ``label`` (int64,
a ``ClassLabel`` whose names are in the ``huggingface`` schema metadata), in row groups of ``rows_per_group`` rows.
Each shard is written under a temporary name and renamed when whole; the files' bytes are copied as they are.
"""

from __future__ import annotations

import functools
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from lightning_fastdata.errors import InvalidValueError, PathExistsError
from lightning_fastdata.loading.atomic import atomic_path, atomic_write_text
from lightning_fastdata.loading.index.files import FileIndex, contains_path
from lightning_fastdata.loading.storage.local import LocalStorage

__all__ = [
    "add_member",
    "pack_shards",
    "refuse_inside_source",
    "shard_destination",
    "write_parquet_shards",
    "write_tar_shards",
]


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add ``data`` to ``tf`` as the member ``name`` (its time 0: the same shards from the same files, always)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tf.addfile(info, io.BytesIO(data))


def shard_destination(dst: str | os.PathLike[str], name: str, overwrite: bool, src_root: str | None = None) -> Path:
    """The folder ``dst``, made ready for shards named as ``name`` (``shard-%06d.tar``).

    Refused: a ``dst`` inside the local data folder ``src_root`` (the data are read-only to us), and a ``dst`` already
    holding such shards unless ``overwrite``.

    Raises:
        FileExistsError: If ``dst`` holds such shards and not ``overwrite`` (they would be mixed with the new ones).
        ValueError: If ``dst`` is ``src_root`` or inside it.
    """
    refuse_inside_source(dst, src_root)
    found = sorted(Path(dst).glob(_glob(name))) if Path(dst).is_dir() else []
    if found and not overwrite:
        raise PathExistsError(
            f"{os.fspath(dst)} already holds {len(found)} shard(s) ({found[0].name}, ...): a reader would take them "
            "with the new ones. Write into an empty folder, or pass overwrite=True (--overwrite) to replace them."
        )
    Path(dst).mkdir(parents=True, exist_ok=True)
    return Path(dst)


def refuse_inside_source(dst: str | os.PathLike[str], src_root: str | None) -> None:
    """Raise if ``dst`` is the local data folder ``src_root`` or inside it (``None``: a bucket, nothing to check).

    Raises:
        ValueError: Naming both.
    """
    if src_root is not None and contains_path(os.path.realpath(src_root), os.path.realpath(os.fspath(dst))):
        raise InvalidValueError(f"dst {os.fspath(dst)!r} is inside the data folder {src_root!r}; write it elsewhere.")


def _glob(name: str) -> str:
    return name.replace("%06d", "[0-9]" * 6)


def _listing(
    src: str | os.PathLike[str] | FileIndex,
    dst: str | os.PathLike[str],
    shard_bytes: int,
    name: str,
    overwrite: bool,
    shuffle: bool = False,
    seed: int = 0,
) -> FileIndex:
    """The folder's file index, ``dst`` made ready (:func:`shard_destination`); refuses a bad size.

    With ``shuffle``, the index in a permutation drawn from ``seed``.
    """
    if shard_bytes <= 0:
        raise InvalidValueError(f"shard_bytes should be a positive size in bytes, got {shard_bytes!r}.")
    index = src if isinstance(src, FileIndex) else LocalStorage(os.fspath(src)).list_files()
    shard_destination(dst, name, overwrite, index.root)
    return index.subset(np.random.default_rng(seed).permutation(len(index))) if shuffle else index


def pack_shards(
    count: int,
    read: Callable[[int, int], list[Any]],
    size_of: Callable[[Any], int],
    dst: str | os.PathLike[str],
    name: str,
    shard_bytes: int,
    step: int,
    open_writer: Callable[[Path], Any],
    write: Callable[[Any, list[Any]], None],
    desc: str | None = None,
) -> list[Path]:
    """Write samples ``0 .. count - 1``, in order, into shards ``dst/<name % k>`` of about ``shard_bytes`` each.

    ``read(start, stop)`` gives samples ``start .. stop - 1`` (``step`` at a time), ``size_of`` a sample's bytes in a
    shard, ``write(writer, samples)`` writes them; a shard holds at least one step. Each shard is written under a
    temporary name (``open_writer(tmp)``, a context manager) and renamed when whole; shards of the same name pattern
    left from an earlier write (replaced with ``overwrite``) are removed after. ``desc``: a progress bar's title.
    """
    written: list[Path] = []
    i = 0
    with tqdm(total=count, desc=desc, unit="img", disable=desc is None) as bar:
        while i < count:
            path = Path(dst) / (name % len(written))
            with atomic_path(path) as tmp, open_writer(tmp) as writer:
                size = 0
                while i < count and (size == 0 or size < shard_bytes):
                    rows = read(i, min(count, i + step))
                    write(writer, rows)
                    size += sum(size_of(row) for row in rows)
                    i += len(rows)
                    bar.update(len(rows))
            written.append(path)
    for stale in set(Path(dst).glob(_glob(name))) - set(written):
        stale.unlink()
    return written


def write_tar_shards(
    src: str | os.PathLike[str] | FileIndex,
    dst: str | os.PathLike[str],
    shard_bytes: int = 1 << 30,
    prefix: str = "shard",
    overwrite: bool = False,
    shuffle: bool = False,
    seed: int = 0,
) -> list[Path]:
    """Pack ``src/<class>/<image>`` (or a :class:`~lightning_fastdata.loading.index.files.FileIndex`) into tar shards.

    Sample ``i`` (in the listing's order, or with ``shuffle`` in a permutation of it drawn from ``seed``) has the key
    ``{i:08d}``, its image member keeps the file's extension (lower case), its ``.cls`` member holds its label;
    ``dst/classes.json`` lists the class names. A listing is class after class: readers that shuffle in windows
    (webdataset's buffer, Mosaic, our Parquet windows) assume shards written shuffled, so write with ``shuffle``.

    Returns:
        The shards written, in order.

    Raises:
        ValueError: If ``shard_bytes`` is not positive, or ``dst`` is inside ``src`` (the data are read-only to us).
        FileExistsError: If ``dst`` already holds shards and not ``overwrite`` (then they are replaced).
    """
    name = f"{prefix}-%06d.tar"
    index = _listing(src, dst, shard_bytes, name, overwrite, shuffle, seed)

    def write(tf: tarfile.TarFile, rows: list[tuple[int, bytes]]) -> None:
        for i, data in rows:
            ext = os.path.splitext(index.relpath(i))[1].lower().lstrip(".") or "jpg"
            add_member(tf, f"{i:08d}.{ext}", data)
            add_member(tf, f"{i:08d}.cls", str(int(index.labels[i])).encode())

    def open_tar(tmp: Path) -> tarfile.TarFile:
        return tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT)

    written = pack_shards(
        len(index), functools.partial(_read_files, index), lambda row: len(row[1]) + 1024, dst, name, shard_bytes, 1,
        open_tar, write,
    )  # fmt: skip
    atomic_write_text(Path(dst) / "classes.json", json.dumps(list(index.classes)))
    return written


def write_parquet_shards(
    src: str | os.PathLike[str] | FileIndex,
    dst: str | os.PathLike[str],
    shard_bytes: int = 1 << 30,
    prefix: str = "shard",
    rows_per_group: int = 100,
    overwrite: bool = False,
    shuffle: bool = False,
    seed: int = 0,
) -> list[Path]:
    """Write ``src/<class>/<image>`` (or a :class:`~lightning_fastdata.loading.index.files.FileIndex`) as Parquet.

    The hubs' layout (module docstring): what ``datasets.load_dataset("parquet", ...)`` and
    :class:`~lightning_fastdata.datamodules.shards.ShardDataModule` read, the class names in the schema metadata.
    Rows in the listing's order, or with ``shuffle`` in a permutation of it drawn from ``seed`` (what training in
    windows of row groups needs: :func:`write_tar_shards`).

    Returns:
        The files written, in order.

    Raises:
        ValueError: If ``shard_bytes`` or ``rows_per_group`` is not positive, or ``dst`` is inside ``src``.
        FileExistsError: If ``dst`` already holds Parquet shards and not ``overwrite`` (then they are replaced).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if rows_per_group <= 0:
        raise InvalidValueError(f"rows_per_group should be a positive number of rows, got {rows_per_group!r}.")
    name = f"{prefix}-%06d.parquet"
    index = _listing(src, dst, shard_bytes, name, overwrite, shuffle, seed)
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

    return pack_shards(
        len(index), functools.partial(_read_files, index), lambda row: len(row[1]), dst, name, shard_bytes,
        rows_per_group, open_parquet, write,
    )  # fmt: skip


def _read_files(index: FileIndex, start: int, stop: int) -> list[tuple[int, bytes]]:
    return [(j, Path(index.path(j)).read_bytes()) for j in range(start, stop)]
