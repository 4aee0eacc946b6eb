"""The local file system as a :class:`~lightning_fastdata.loading.storage.base.Storage`: plain ``open``/``read``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence

from lightning_fastdata.loading.index.files import FileIndex, find_classes, scan_image_folder, scan_unlabelled
from lightning_fastdata.loading.index.identity import label_hashes
from lightning_fastdata.loading.index.store import IndexLookup, IndexStore
from lightning_fastdata.loading.storage.base import ObjectStat

__all__ = ["LocalStorage", "fingerprint"]


class LocalStorage:
    """Files under a local folder; reads are plain ``open``/``read``, one file after the other.

    Args:
        root: The folder.
    """

    #: Local reads do not wait on a network; folders have mtimes to check a kept index by.
    remote = False

    def __init__(self, root: str) -> None:
        self.root = os.fspath(root)

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def list_classes(self) -> tuple[str, ...]:
        """The class folders, sorted (torchvision's ``find_classes``, with errors that say more)."""
        return find_classes(self.root)

    def list_files(self, classes: Sequence[str] | None = None) -> FileIndex:
        """The scan of ``root/<class>/**/<image>`` (:func:`~lightning_fastdata.scan_image_folder`); no versions."""
        return scan_image_folder(self.root, None if classes is None else tuple(classes))

    def list_images(self) -> FileIndex:
        """Every image under the folder at any depth, sorted by path (``scan_unlabelled``)."""
        return scan_unlabelled(self.root)

    def indexed(
        self, classes: Sequence[str], index_dir: str | os.PathLike[str] | None, index_ttl: float = 0.0
    ) -> tuple[FileIndex, IndexLookup]:
        """The scan, kept in ``index_dir`` and reused while every folder's mtime is unchanged (``index_ttl`` unused)."""
        return IndexStore(index_dir).folder(self.root, tuple(classes))

    def content_fingerprint(self, index: FileIndex) -> str:
        """:func:`fingerprint` of ``index``: one ``stat`` per file."""
        return fingerprint([index])

    def read_many(
        self,
        relpaths: Sequence[str],
        versions: Sequence[int] | None = None,
        on_changed: Callable[[int], None] | None = None,
    ) -> Iterator[bytes | OSError]:
        """Yield each file's bytes, or the ``OSError`` met opening or reading it (a local listing has no versions)."""
        for rel in relpaths:
            try:
                with open(os.path.join(self.root, rel), "rb") as f:
                    yield f.read()
            except OSError as err:
                yield err

    def read_ahead(self, relpaths: Sequence[str]) -> None:
        """Nothing: a local read needs no head start."""

    def stat(self, relpath: str) -> ObjectStat:
        """Size and ``mtime_ns`` of one file."""
        st = os.stat(os.path.join(self.root, relpath))
        return ObjectStat(st.st_size, str(st.st_mtime_ns))

    def url(self, relpath: str) -> str:
        """``os.path.join(root, relpath)``."""
        return os.path.join(self.root, relpath)

    def location(self) -> str:
        """The absolute path of the root."""
        return os.path.abspath(self.root)


def fingerprint(indexes: Sequence[FileIndex | None]) -> str:
    """sha256 of each file's relative path, size and mtime, over the given indexes in order.

    One ``stat`` per file (``O(files)`` system calls: seconds for ImageNet on a local disk, minutes on a network
    file system); the records are built from the index's path bytes, with no per-file string decode. The digest
    is the per-file record it always was, so existing caches stay current (a multi-hot label is recorded as the
    hash of its class set).
    """
    digest = hashlib.sha256()
    stat = os.stat
    for index in indexes:
        digest.update(b"|split|")
        if index is None:
            continue
        root = os.path.join(os.fsencode(index.root), b"")
        blob, offsets = index.path_bytes.tobytes(), index.offsets.tolist()
        # a multi-hot row (several labels per file) as one number: the hash of its class set
        labels = (label_hashes(index.labels) if index.labels.ndim == 2 else index.labels).tolist()
        for lo in range(0, len(labels), 65536):  # a chunk of records at a time: bounded memory, few updates
            records = []
            for i in range(lo, min(lo + 65536, len(labels))):
                rel = blob[offsets[i] : offsets[i + 1]]  # os.fsencode of the relative path: any name, also non-UTF-8
                st = stat(root + rel)
                records.append(b"%s\0%d\0%d\0%d\n" % (rel, st.st_size, st.st_mtime_ns, labels[i]))
            digest.update(b"".join(records))
    return digest.hexdigest()
