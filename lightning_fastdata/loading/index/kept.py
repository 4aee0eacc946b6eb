"""Shard indexes kept in ``index_dir``: named by the shard and its version, built once, written atomically.

A tar shard's index (:mod:`~lightning_fastdata.loading.index.tar_index`) and a Parquet file's
(:mod:`~lightning_fastdata.loading.index.parquet_index`) are kept the same way: one ``.npz`` per shard, named by a
digest of the index format, the shard's path (or URL), its size and version (modification time, or a bucket object's
size and ETag) and the settings the index depends on, so a changed shard is indexed again, never read by an old
index. A reader also refuses a local shard that changed since (:func:`refuse_changed`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.atomic import atomic_path

__all__ = ["kept_index", "refuse_changed", "string_array"]

T = TypeVar("T")


def kept_index(
    path: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    kind: str,
    settings: str,
    remote: tuple[int, int, Callable[[], T]] | None,
    build: Callable[[str], T],
    load: Callable[[Any, str, int, int], T],
    save: Callable[[T], dict[str, Any]],
) -> T:
    """The index of the shard ``path``, kept in ``index_dir/<kind>`` (module docstring), else built and kept.

    ``settings``: what else the index depends on (the format version first); ``remote``: a shard in a bucket
    (``path`` its URL), its size, version and what builds its index; ``build(path)`` builds a local one;
    ``load(npz, path, size, version)`` reads a kept file, ``save(index)`` gives the arrays to keep. An ``index_dir``
    that cannot be written is skipped (the index is then built each time).
    """
    if remote is None:
        path = os.path.abspath(os.fspath(path))
        st = os.stat(path)
        size, version = st.st_size, st.st_mtime_ns
    else:
        path, (size, version, _) = os.fspath(path), remote
    fmt, _, rest = settings.partition("|")
    name = hashlib.sha256(f"{fmt}|{path}|{size}|{version}|{rest}".encode()).hexdigest()[:24]
    kept = Path(index_dir) / kind / f"{name}.npz"
    try:
        with np.load(kept, allow_pickle=False) as f:
            return load(f, path, size, version)
    except (OSError, KeyError, ValueError):
        pass
    index = build(path) if remote is None else remote[2]()
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(kept) as tmp, open(tmp, "wb") as f:
            np.savez(f, **save(index))
    except OSError:
        pass
    return index


def string_array(values: Sequence[str]) -> np.ndarray:
    """``values`` as a numpy string array that ``np.load`` reads without pickle (an empty one too)."""
    return np.asarray(values, dtype=str) if values else np.zeros(0, dtype="<U1")


def refuse_changed(what: str, path: str, size: int, mtime_ns: int, st: os.stat_result) -> None:
    """Refuse to read a shard that is not the one indexed (another size or modification time than then).

    Raises:
        DataError: Naming it (``what``: "shard", "Parquet file") and what differs.
    """
    if st.st_size != size or st.st_mtime_ns != mtime_ns:
        raise DataError(
            f"The {what} {path!r} changed after it was indexed ({size} -> {st.st_size} bytes, modified since): its "
            f"samples would be read at the wrong places. Restart to index it again, and do not rewrite "
            f"{what}s while they are read."
        )
