"""Has the source folder of a tensor cache changed? The per-file fingerprint and the O(folders) record.

``verify_source="files"`` compares :func:`fingerprint` (every file's path, size and mtime); ``"folders"``
compares :func:`source_record` (the file list's digest and the mtimes of the folders holding the files, taken
before the build decoded anything) with :func:`~lightning_fastdata.cache.source.folders_unchanged`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.index.store import changed_folder, folder_record
from lightning_fastdata.loading.storage.base import Storage
from lightning_fastdata.loading.storage.local import fingerprint

__all__ = [
    "fingerprint",
    "folder_mtimes",
    "folders_unchanged",
    "listing_digest",
    "listing_fingerprint",
    "source_record",
]


def listing_fingerprint(indexes: Sequence[FileIndex | None], storages: Mapping[str, Storage]) -> str:
    """The fingerprint of a source with a remote root: the file lists plus each storage's content fingerprint.

    A bucket's root is listed again once (class prefixes concurrently: ``objects / 1000`` requests); its per-class
    digests of every object's key, size and ETag change when an object is added, removed or rewritten. A local
    root in the mix contributes :func:`~lightning_fastdata.loading.storage.local.fingerprint`'s per-file records.
    """
    digest = hashlib.sha256(listing_digest(indexes).encode())
    listed: dict[str, str] = {}  # a remote root's listing covers both splits of it: listed once
    for index in indexes:
        digest.update(b"|split|")
        if index is None:
            continue
        storage = storages[index.root]
        if not storage.remote:
            digest.update(storage.content_fingerprint(index).encode())
            continue
        if index.root not in listed:
            listed[index.root] = storage.content_fingerprint(index)
        digest.update(listed[index.root].encode())
    return digest.hexdigest()


def listing_digest(indexes: Sequence[FileIndex | None]) -> str:
    """sha256 of the indexes' relative paths, labels and classes: no file system access, one pass over the arrays."""
    digest = hashlib.sha256()
    for index in indexes:
        digest.update(b"|split|")
        if index is None:
            continue
        digest.update(json.dumps(list(index.classes)).encode(errors="surrogateescape"))
        digest.update(np.ascontiguousarray(index.offsets, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(index.labels, dtype=np.int64).tobytes())
        digest.update(index.path_bytes.tobytes())
    return digest.hexdigest()


def _link_target_folders(folder: str) -> set[str]:
    """The real folders of the files that symlinks in ``folder`` point to (one ``scandir``; the entry types are free).

    A tree of links (a subset of a data set, say) changes when a target is replaced, which changes the target's
    folder, not the link's.
    """
    targets = set()
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_symlink() and entry.is_file():  # a linked folder is stat'ed as itself
                targets.add(os.path.dirname(os.path.realpath(entry.path)))
    return targets


def folder_mtimes(indexes: Sequence[FileIndex | None], started: float) -> list[list[list[Any]]]:
    """Per index, ``[folder, mtime_ns]`` of its root, its class folders and every folder holding its files.

    Folders are relative to the index's root, except the real (absolute) folders of the targets of file symlinks.
    A folder modified within :data:`~lightning_fastdata.loading.index.store.RACY_SECONDS` of ``started`` is
    recorded with mtime ``-1`` ("unknown"): a file replaced in the same clock tick would not change it.
    """
    out: list[list[list[Any]]] = []
    for index in indexes:
        if index is None:
            out.append([])
            continue
        blob, offsets = index.path_bytes.tobytes(), index.offsets.tolist()
        sep = os.fsencode(os.sep)
        folders = {blob[offsets[i] : offsets[i + 1]].rpartition(sep)[0] for i in range(len(offsets) - 1)}
        classes = [c for c in index.classes if os.path.isdir(os.path.join(index.root, c))]  # not a table's classes
        names = {".", *classes, *(os.fsdecode(f) for f in folders)}
        for rel in list(names):
            names |= _link_target_folders(os.path.join(index.root, rel))
        mtimes = [(rel, os.stat(os.path.join(index.root, rel)).st_mtime_ns) for rel in sorted(names)]
        out.append(folder_record(mtimes, started))
    return out


def source_record(indexes: Sequence[FileIndex | None]) -> dict[str, Any]:
    """What ``verify_source="folders"`` compares: the listing's digest and the folders' mtimes, taken now."""
    return {"listing": listing_digest(indexes), "folders": folder_mtimes(indexes, time.time())}


def folders_unchanged(manifest: dict[str, Any] | None, indexes: Sequence[FileIndex | None]) -> tuple[bool, str]:
    """Whether the source is unchanged since ``manifest``'s folder record, in ``O(folders)`` ``stat`` calls.

    Same file list (paths, labels, classes) and every recorded folder's mtime unchanged: no file was added,
    removed, renamed or replaced by a rename (which changes its folder's mtime). A file rewritten in place under
    the same name is *not* seen: that needs the full check (``verify_source="files"``).
    """
    record = None if manifest is None else manifest.get("source")
    if not isinstance(record, dict) or "listing" not in record or "folders" not in record:
        return False, "no folder record in the manifest"
    if record["listing"] != listing_digest(indexes):
        return False, "the file list changed"
    for index, rows in zip(indexes, record["folders"], strict=False):
        if index is None:
            continue
        changed = changed_folder(index.root, rows)
        if changed is not None:
            path, racy = changed
            return False, f"{path!r} {'was modified during the build' if racy else 'changed'}"
    return True, "up to date (folders unchanged)"
