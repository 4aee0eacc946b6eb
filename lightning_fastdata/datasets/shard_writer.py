"""Tar shards written from an image folder, as WebDataset reads them: ``<key>.<ext>`` and ``<key>.cls`` members.

:func:`write_tar_shards` packs a folder's files, in its listing's order, into uncompressed tars of about
``shard_bytes`` each (``shard-000000.tar``, ...), each written under a temporary name and renamed when whole, and the
class names beside them (``classes.json``). The files' bytes are copied as they are (no decode).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_path, atomic_write_text
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.storage.local import LocalStorage

__all__ = ["write_tar_shards"]


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # the same shards from the same files, whenever written
    tf.addfile(info, io.BytesIO(data))


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
    if shard_bytes <= 0:
        raise InvalidValueError(f"shard_bytes should be a positive size in bytes, got {shard_bytes!r}.")
    index = src if isinstance(src, FileIndex) else LocalStorage(os.fspath(src)).list_files()
    root, out = os.path.realpath(index.root), os.path.realpath(os.fspath(dst))
    if out == root or out.startswith(root + os.sep):
        raise InvalidValueError(f"dst {os.fspath(dst)!r} is inside the data folder {index.root!r}; write it elsewhere.")
    folder = Path(dst)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    i, n = 0, len(index)
    while i < n:
        path = folder / f"{prefix}-{len(written):06d}.tar"
        with atomic_path(path) as tmp, tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tf:
            size = 0
            while i < n and (size == 0 or size < shard_bytes):
                data = Path(index.path(i)).read_bytes()
                ext = os.path.splitext(index.relpath(i))[1].lower().lstrip(".") or "jpg"
                _add(tf, f"{i:08d}.{ext}", data)
                _add(tf, f"{i:08d}.cls", str(int(index.labels[i])).encode())
                size += len(data) + 1024
                i += 1
        written.append(path)
    atomic_write_text(folder / "classes.json", json.dumps(list(index.classes)))
    return written
