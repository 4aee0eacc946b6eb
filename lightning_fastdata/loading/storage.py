"""Where the data live: a local folder or a bucket, behind one small interface.

Every reader of images (the folder index, the datasets, the cache builders, the doctor) goes through a
:class:`Storage`: list the files under a root, read a batch of them, stat one. :class:`LocalStorage` is the
plain file system (the code paths of a local root are the ones they always were); an object-store URL
(``s3://``, ``gs://``, ``az://``) gets an :class:`~lightning_fastdata.loading.object_store.ObjectStorage`.
:func:`~lightning_fastdata.loading.storage_factory.open_storage` picks one from the root.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["OBJECT_STORE_SCHEMES", "LocalStorage", "ObjectStat", "Storage", "is_url", "join_url"]

#: URL schemes read through an object store (S3 and S3-compatible servers, Google Cloud Storage, Azure).
OBJECT_STORE_SCHEMES: tuple[str, ...] = ("s3", "s3a", "gs", "az", "abfs", "abfss", "azure")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an object-store URL (``s3://bucket/prefix``) rather than a local path."""
    match = _URL.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    return bool(match) and match.group(1).lower() in OBJECT_STORE_SCHEMES  # type: ignore[union-attr]


def join_url(root: str, relpath: str) -> str:
    """``root`` and a relative key or path joined with one ``/`` (URLs) or ``os.path.join`` (local)."""
    if is_url(root):
        return root.rstrip("/") + "/" + relpath.lstrip("/")
    return os.path.join(root, relpath)


@dataclass(frozen=True)
class ObjectStat:
    """What :meth:`Storage.stat` tells of one file or object.

    Attributes:
        size: Bytes.
        version: What changes when the content changes: the ETag of an object, ``"<mtime_ns>"`` of a file.
    """

    size: int
    version: str


@runtime_checkable
class Storage(Protocol):
    """A root (folder or bucket prefix) that files are read from; paths are relative to it, ``/``-separated.

    Implementations are picklable and safe to use after ``fork`` in every process that reads (each opens its
    own connections or handles).
    """

    root: str

    def read_many(self, relpaths: Sequence[str], versions: Sequence[int] | None = None) -> Iterator[bytes | OSError]:
        """Yield each file's bytes (or the ``OSError`` met reading it, after the retries allowed) in the order given.

        An object store fetches them concurrently and yields each one as soon as it and those before it
        arrived, so the caller decodes while the rest are in flight. ``versions``: each file's version as its
        listing gave it (``versions`` of a :class:`~lightning_fastdata.FileIndex`), to warn about a file changed since.
        """
        ...

    def stat(self, relpath: str) -> ObjectStat:
        """Size and version of one file.

        Raises:
            FileNotFoundError: If it does not exist (the message names it).
        """
        ...

    def url(self, relpath: str) -> str:
        """The full path or URL of ``relpath``, as the user would write it (for messages)."""
        ...


class LocalStorage:
    """Files under a local folder; reads are plain ``open``/``read``, one file after the other.

    Args:
        root: The folder.
    """

    def __init__(self, root: str) -> None:
        self.root = os.fspath(root)

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def read_many(self, relpaths: Sequence[str], versions: Sequence[int] | None = None) -> Iterator[bytes | OSError]:
        """Yield each file's bytes, or the ``OSError`` met opening or reading it (a local listing has no versions)."""
        for rel in relpaths:
            try:
                with open(os.path.join(self.root, rel), "rb") as f:
                    yield f.read()
            except OSError as err:
                yield err

    def stat(self, relpath: str) -> ObjectStat:
        """Size and ``mtime_ns`` of one file."""
        st = os.stat(os.path.join(self.root, relpath))
        return ObjectStat(st.st_size, str(st.st_mtime_ns))

    def url(self, relpath: str) -> str:
        """``os.path.join(root, relpath)``."""
        return os.path.join(self.root, relpath)
