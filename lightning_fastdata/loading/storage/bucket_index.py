"""The file index of an image folder in a bucket: class prefixes listed concurrently, kept per node.

``ListObjectsV2`` returns 1,000 keys a page, so one listing of 1.28M objects is 1,281 pages one after the other.
Here the class prefixes are listed first (one delimiter listing), then every class is listed at once, up to
``max_inflight`` at a time (:meth:`~lightning_fastdata.loading.storage.object_store.ObjectStorage.list_many`).

**Staleness.** A bucket has no folder mtimes to check in ``O(folders)``: knowing whether anything changed
takes a listing. A persisted index (``index_dir``) therefore records when it was listed and one digest per
class (every key, size and ETag). Within ``index_ttl`` seconds of that listing it is reused without a request
(every rank of a run, and runs started soon after: the log says how old it is); after that the bucket is listed
again, the new listing is used and kept, and the log names the classes whose digest changed, or says none did.
``index_ttl=0`` lists at every start. A file deleted from the bucket while a reused index still names it fails
its read with an error naming its URL.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lightning_fastdata.errors import PathNotFoundError
from lightning_fastdata.loading.index.files import IMG_EXTENSIONS, FileIndex, is_image_name
from lightning_fastdata.loading.index.identity import string_hash
from lightning_fastdata.loading.index.store import FORMAT, IndexLookup, IndexStale, IndexStore
from lightning_fastdata.loading.storage.base import ObjectStat

__all__ = [
    "DEFAULT_INDEX_TTL",
    "BucketLister",
    "bucket_classes",
    "bucket_index_file",
    "indexed_bucket",
    "list_bucket_folder",
    "object_version",
]

#: Seconds a persisted bucket listing is reused without listing again.
DEFAULT_INDEX_TTL = 3600.0


def object_version(size: int, etag: str) -> int:
    """What identifies an object's content in a listing and in a read alike: a hash of its size and ETag."""
    return string_hash(f"{size}\0{etag}")


class BucketLister(Protocol):
    """What listing a bucket needs of its storage: the root, its URLs, its identity and two listing calls.

    :class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage` is the one in use.
    """

    root: str

    def url(self, relpath: str) -> str: ...  # noqa: D102 - see ObjectStorage

    def fingerprint(self) -> str: ...  # noqa: D102

    def list_prefixes(self, prefix: str = "") -> list[str]: ...  # noqa: D102

    def list_many(self, prefixes: Sequence[str]) -> list[list[ObjectStat]]: ...  # noqa: D102


def bucket_classes(storage: BucketLister) -> tuple[str, ...]:
    """The class "folders" (common prefixes) directly under the storage's root, sorted.

    Raises:
        FileNotFoundError: If there is none (the URL is wrong, or the objects are not under class prefixes).
    """
    classes = tuple(storage.list_prefixes())
    if not classes:
        raise PathNotFoundError(
            f"Couldn't find any class folder in {storage.root!r}: expected objects under <class>/ prefixes "
            f"({storage.root}/<class>/<image>). Check the URL (and that the credentials can list the bucket)."
        )
    return classes


def _sort_key(entry: ObjectStat) -> tuple[str, str]:
    folder, _, name = entry.key.rpartition("/")
    return folder, name  # torchvision's order: folder by folder, names sorted within each


def list_bucket_folder(storage: BucketLister, classes: Sequence[str] | None = None) -> tuple[FileIndex, dict[str, str]]:
    """List ``root/<class>/**/<image>`` into a file index (torchvision's order) and one digest per class.

    The index is a :class:`~lightning_fastdata.FileIndex` with each object's size and ETag as its version.

    Raises:
        FileNotFoundError: If there is no class prefix, or a class holds no image (named).
    """
    classes = bucket_classes(storage) if classes is None else tuple(classes)
    listings = storage.list_many([c + "/" for c in classes])
    chunks: list[bytes] = []
    versions: list[int] = []
    per_label = np.zeros(len(classes), dtype=np.int64)
    digests: dict[str, str] = {}
    empty = []
    for label, (name, entries) in enumerate(zip(classes, listings)):
        images = sorted((e for e in entries if is_image_name(e.key)), key=_sort_key)
        if not images:
            empty.append(storage.url(name + "/"))
        digest = hashlib.sha256()
        for e in images:
            digest.update(f"{e.key}\0{e.size}\0{e.version}\n".encode())
        digests[name] = digest.hexdigest()
        per_label[label] = len(images)
        chunks.append(b"".join(e.key.encode() + b"\0" for e in images))
        versions.extend(object_version(e.size, e.version) for e in images)
    if empty:
        raise PathNotFoundError(
            f"Found no image under the class prefix(es) {', '.join(map(repr, empty))}. Supported extensions are "
            f"{', '.join(IMG_EXTENSIONS)}."
        )
    blob = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    ends = np.flatnonzero(blob == 0)
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = ends + 1 - np.arange(1, len(ends) + 1)
    labels = np.repeat(np.arange(len(classes), dtype=np.int64), per_label)
    index = FileIndex(storage.root, classes, blob[blob != 0], offsets, labels, np.array(versions, dtype=np.uint64))
    return index, digests


def bucket_index_file(index_dir: str | os.PathLike[str], storage: BucketLister) -> Path:
    """The index file of the storage's root in ``index_dir``.

    (:meth:`~lightning_fastdata.loading.index.store.IndexStore.bucket_path`: its last path part, the fingerprint.)
    """
    return IndexStore(index_dir).bucket_path(storage.root, storage.fingerprint())


def indexed_bucket(
    storage: BucketLister,
    classes: Sequence[str],
    index_dir: str | os.PathLike[str] | None = None,
    index_ttl: float = DEFAULT_INDEX_TTL,
    write: bool = True,
) -> tuple[FileIndex, IndexLookup]:
    """The root's index: reused from ``index_dir`` within ``index_ttl`` of its listing, else listed (and kept).

    The lookup's ``how`` says how a reused index was validated; ``why`` says why the bucket was listed again
    and what changed.
    """
    classes = tuple(classes)
    if index_dir is None:
        return list_bucket_folder(storage, classes)[0], IndexLookup(False, None, None)
    store = IndexStore(index_dir)
    path = store.bucket_path(storage.root, storage.fingerprint())
    old: dict[str, Any] | None = None
    why: str | None = None
    try:
        meta, arrays = store.read(path)
        if meta.get("root") != storage.root or tuple(meta.get("classes", ())) != classes:
            raise IndexStale(f"the index {path} is of another URL or other class prefixes")
        index = store.checked(path, storage.root, classes, meta, arrays)
        age = time.time() - float(meta["listed_at"])
        if 0 <= age <= index_ttl:
            fresh = f"listed {age:.0f} s ago, within index_ttl={index_ttl:g} s; no request made"
            return index, IndexLookup(True, path, None, fresh)
        old = meta
        why = f"the listing was {age:.0f} s old (index_ttl={index_ttl:g} s)"
    except IndexStale as stale:
        why = None if stale.missing else str(stale)
    index, digests = list_bucket_folder(storage, classes)
    how: str | None = None
    if old is not None:
        changed = [c for c in classes if old.get("digests", {}).get(c) != digests[c]]
        if changed:
            shown = ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
            why = f"{why}; listed again: {len(changed)} class(es) changed ({shown})"
        else:
            how = f"{why}; listed again: nothing changed"
            why = None
    if write:
        meta = {
            "format": FORMAT,
            "root": storage.root,
            "classes": list(classes),
            "digests": digests,
            "listed_at": time.time(),
            "files": len(index),
        }
        try:
            store.write(path, meta, index)
        except OSError as err:
            why = (why + "; " if why else "") + f"could not write {path} ({err}): is index_dir writable?"
    return index, IndexLookup(False, path, why, how)
