"""A persisted :class:`~lightning_fastdata.FileIndex`: one scan per node (or in total), reused while no folder changed.

Listing 1.28M files costs seconds on a local disk and minutes on NFS/Lustre, and every DDP rank of every run
did it again. :meth:`IndexStore.folder` writes the scan to ``index_dir`` (a cache folder you name: never beside the
data, which is read-only to us) as one ``.npz`` file, written under a temporary name and renamed, so a rank that
dies while writing leaves no half-written index. Before reuse it checks, in ``O(folders)`` ``stat`` calls and no
per-file work, that the file is whole, of a format this version reads, of this very folder (real path), with the
same class folders and every folder's ``mtime_ns`` unchanged (adding, removing or renaming a file changes its
folder's mtime). Anything else is named in a warning and the folder is scanned again. Every rank and every later
run reuses the index.

Folders modified within :data:`RACY_SECONDS` of the scan are recorded as "unknown" (as git does for racy
index entries): a file added in the same clock tick as the scan would leave the mtime unchanged, so such an
index is rescanned once at its next use instead of trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_fastdata.loading.atomic import atomic_path
from lightning_fastdata.loading.index.files import FileIndex, find_classes, scan_with_mtimes

__all__ = [
    "FORMAT",
    "RACY_SECONDS",
    "IndexLookup",
    "IndexStale",
    "IndexStore",
    "changed_folder",
    "folder_record",
]

#: The index file format this version writes; an index of a newer format is not read.
FORMAT = 1
#: Folders modified this recently before the scan are not trusted by the next run (see the module docstring).
RACY_SECONDS = 2.0


class IndexStale(Exception):  # noqa: N818 - a reason to rescan, not an error of the user's
    """Why a persisted index cannot be used (the message names the file and the reason).

    ``missing`` is true when there is simply no index yet (a first run, not something to warn about); ``quiet``
    when the rescan is routine (folders written just before the last scan), said at info level, not warned.
    """

    def __init__(self, message: str, missing: bool = False, quiet: bool = False) -> None:
        super().__init__(message)
        self.missing = missing
        self.quiet = quiet


def folder_record(mtimes: Iterable[tuple[str, int]], started: float) -> list[list[Any]]:
    """``[folder, mtime_ns]`` rows to store; a folder modified within :data:`RACY_SECONDS` of ``started`` gets -1.

    -1 means "unknown": a file added in the same clock tick as the scan would leave the folder's mtime unchanged.
    The one rule for every record of folder mtimes (the persisted index, the tensor cache's source record).
    """
    racy_after = int((started - RACY_SECONDS) * 1e9)
    return [[folder, -1 if mtime >= racy_after else mtime] for folder, mtime in mtimes]


def changed_folder(root: str, rows: Iterable[Sequence[Any]]) -> tuple[str, bool] | None:
    """The first recorded folder (relative to ``root``, or absolute) whose mtime differs now, and whether it was racy.

    ``None`` when every folder is unchanged: no file was added, removed or renamed in any of them.
    """
    for rel, mtime in rows:
        path = os.path.join(root, rel)
        try:
            now = os.stat(path).st_mtime_ns
        except OSError:
            now = None
        if mtime == -1 or now != mtime:
            return path, mtime == -1
    return None


@dataclass(frozen=True)
class IndexLookup:
    """What a lookup in an :class:`IndexStore` did: ``reused`` the file at ``path``, or scanned because of ``why``.

    ``why`` is ``None`` when nothing was persisted before (no ``index_dir``, or a first run) or nothing is worth a
    warning; ``how`` says how a reused index was validated, or what a new scan found.
    """

    reused: bool
    path: Path | None
    why: str | None
    how: str | None = None


class IndexStore:
    """The indexes kept in one ``index_dir``: one ``.npz`` file per folder or bucket prefix (the module docstring).

    The one place that names, reads, checks and writes them: a folder's (:meth:`folder`, validated by its folders'
    mtimes) and a bucket's (:func:`~lightning_fastdata.loading.storage.bucket_index.indexed_bucket`, validated by
    its age, through :meth:`bucket_path`, :meth:`read`, :meth:`checked` and :meth:`write`). ``index_dir=None``
    keeps nothing: :meth:`folder` scans every time.

    Args:
        index_dir: A cache folder of the user's (never inside the data); created on the first write.
    """

    def __init__(self, index_dir: str | os.PathLike[str] | None) -> None:
        self.index_dir = None if index_dir is None else Path(index_dir)

    def _dir(self) -> Path:
        if self.index_dir is None:
            raise ValueError("this IndexStore keeps nothing (index_dir=None)")
        return self.index_dir

    def folder_path(self, root: str) -> Path:
        """The index file of the folder ``root``: the folder's name plus a hash of its real path."""
        real = os.path.realpath(root)
        digest = hashlib.sha1(os.fsencode(real)).hexdigest()[:16]
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(real.rstrip(os.sep)))
        return self._dir() / f"{name or 'root'}-{digest}.fdindex.npz"

    def bucket_path(self, root: str, fingerprint: str) -> Path:
        """The index file of a bucket prefix: its last path part plus the storage's fingerprint (URL, endpoint)."""
        last = root.rstrip("/").rsplit("/", 1)[-1]
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in last)
        return self._dir() / f"{name or 'bucket'}-{fingerprint}.fdindex.npz"

    def folder(
        self, root: str, classes: tuple[str, ...] | None = None, write: bool = True
    ) -> tuple[FileIndex, IndexLookup]:
        """``root``'s index, reused when it is still valid, else scanned (and kept if ``write``).

        A failed write (a read-only ``index_dir``) is reported in ``why``; the fresh scan is returned all the same.
        """
        classes = find_classes(root) if classes is None else classes
        if self.index_dir is None:
            return scan_with_mtimes(root, classes)[0], IndexLookup(False, None, None)
        path = self.folder_path(root)
        try:
            return self.load_folder(root, classes), IndexLookup(True, path, None, "no folder changed (folder mtimes)")
        except IndexStale as stale:
            why = None if stale.missing or stale.quiet else str(stale)
            how = str(stale) if stale.quiet else None
        started = time.time()
        index, dirs = scan_with_mtimes(root, classes)
        if write:
            try:
                self.save_folder(index, dirs, started)
            except OSError as err:
                why = (why + "; " if why else "") + f"could not write {path} ({err}): is index_dir writable?"
        return index, IndexLookup(False, path, why, how)

    def load_folder(self, root: str, classes: tuple[str, ...]) -> FileIndex:
        """The kept index of ``root`` if it is whole and still describes it; paths stay relative to ``root``.

        Raises:
            IndexStale: Naming the file and why it cannot be used (missing, truncated, newer format, another folder,
                other class folders, a folder changed since the scan).
        """
        path = self.folder_path(root)
        meta, arrays = self.read(path)
        if meta["root"] != os.path.realpath(root):
            raise IndexStale(f"the index {path} is of {meta['root']!r}, not of {os.path.realpath(root)!r}")
        if tuple(meta["classes"]) != tuple(classes):
            raise IndexStale(f"the class folders of {root!r} changed since the index {path} was written")
        changed = changed_folder(root, meta["dirs"])
        if changed is not None:
            folder, racy = changed
            if racy:
                raise IndexStale(
                    f"{folder!r} was modified within {RACY_SECONDS:g} s before the last scan (its mtime cannot show "
                    "a file added in the same instant), so it was scanned again",
                    quiet=True,
                )
            raise IndexStale(f"{folder!r} changed since the index {path} was written")
        return self.checked(path, root, classes, meta, arrays)

    def save_folder(self, index: FileIndex, dirs: list[tuple[str, int]], started: float) -> None:
        """Keep ``index`` and its folders' mtimes (atomically: a temporary name, then a rename)."""
        meta = {
            "format": FORMAT,
            "root": os.path.realpath(index.root),
            "classes": list(index.classes),
            "dirs": folder_record(dirs, started),
            "files": len(index),
        }
        self.write(self.folder_path(index.root), meta, index)

    @staticmethod
    def write(path: str | os.PathLike[str], meta: dict[str, Any], index: FileIndex) -> None:
        """Write ``meta`` (JSON) and ``index``'s arrays to ``path`` as one ``.npz``, atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"path_bytes": index.path_bytes, "offsets": index.offsets, "labels": index.labels}
        if index.versions is not None:
            arrays["versions"] = index.versions
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            meta_bytes = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
            np.savez(fh, meta=meta_bytes, **arrays)  # type: ignore[arg-type]

    @staticmethod
    def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``(meta, arrays)`` of an index file of this format.

        Raises:
            IndexStale: If it is missing, unreadable or of another format.
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as npz:
                meta = json.loads(npz["meta"].tobytes())
                arrays = {k: npz[k] for k in ("path_bytes", "offsets", "labels")}
                if "versions" in npz.files:  # a bucket's listing: each object's size and ETag, hashed
                    arrays["versions"] = npz["versions"]
        except FileNotFoundError:
            raise IndexStale(f"no index at {path}", missing=True) from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise IndexStale(f"the index {path} is unreadable (truncated or not an index file: {err})") from err
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise IndexStale(f"the index {path} has format {found!r}; this version reads format {FORMAT}")
        return meta, arrays

    @staticmethod
    def checked(
        path: str | os.PathLike[str],
        root: str,
        classes: tuple[str, ...],
        meta: dict[str, Any],
        arrays: dict[str, np.ndarray],
    ) -> FileIndex:
        """The :class:`~lightning_fastdata.FileIndex` of ``arrays`` if they agree with ``meta``.

        Raises:
            IndexStale: If they do not (a damaged file).
        """
        n = int(meta["files"])
        path_bytes, offsets, labels = arrays["path_bytes"], arrays["offsets"], arrays["labels"]
        versions = arrays.get("versions")
        if (
            (versions is not None and len(versions) != n)
            or len(labels) != n
            or len(offsets) != n + 1
            or (n and (offsets[-1] != len(path_bytes) or labels.min() < 0 or labels.max() >= len(classes)))
        ):
            raise IndexStale(f"the index {path} is inconsistent (its arrays do not agree); it was damaged")
        return FileIndex(root, tuple(classes), path_bytes, offsets, labels, versions)
