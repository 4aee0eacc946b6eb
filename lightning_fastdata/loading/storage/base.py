"""The storage contract: what every place the data can live in (a local folder, a bucket) does, and nothing else.

Every reader of images (the folder DataModule and dataset, the converter, the cache and entropy-index builders,
the doctor) goes through a :class:`Storage` and never asks which kind it has: it lists the class folders and the
files (with a version per file where the place has one), keeps a listing between runs, fingerprints the files'
content, reads a batch of files, starts reading the next batch early, stats a file and names one in messages. A
new backend (a local mirror, HTTP, another cloud) is one class of these methods and one
:func:`~lightning_fastdata.loading.storage.registry.register_storage` call for its URL schemes.

Backends: :class:`~lightning_fastdata.loading.storage.local.LocalStorage` (the file system) and
:class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage` (``s3://``, ``gs://``, ``az://``);
:func:`~lightning_fastdata.loading.storage.registry.open_storage` picks one from the root.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.index.store import IndexLookup

__all__ = [
    "OBJECT_STORE_SCHEMES",
    "ObjectStat",
    "Storage",
    "add_url_scheme",
    "expand_braces",
    "is_url",
    "join_url",
    "local_files",
    "url_scheme",
]

#: URL schemes read through an object store (S3 and S3-compatible servers, Google Cloud Storage, Azure).
OBJECT_STORE_SCHEMES: tuple[str, ...] = ("s3", "s3a", "gs", "az", "abfs", "abfss", "azure")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_SCHEMES: set[str] = set(OBJECT_STORE_SCHEMES)  # every scheme a backend is registered for
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace notation: ``{000..009}`` (zero-padded ranges) and ``{a,b}`` (lists), each expanded."""
    found = _RANGE.search(pattern)
    if found:
        lo, hi = found.groups()
        width = len(lo) if lo.startswith("0") else 0
        head, tail = pattern[: found.start()], pattern[found.end() :]
        return [x for k in range(int(lo), int(hi) + 1) for x in expand_braces(f"{head}{k:0{width}d}{tail}")]
    found = _CHOICE.search(pattern)
    if found:
        head, tail = pattern[: found.start()], pattern[found.end() :]
        return [x for option in found.group(1).split(",") for x in expand_braces(head + option + tail)]
    return [pattern]


def local_files(spec: str, suffixes: Sequence[str]) -> list[str]:
    """The local files ``spec`` names, in order (every module that reads shards reads its paths so).

    A folder: its ``*suffix`` files, sorted (of the first suffix it holds any of); else a pattern: its brace parts
    expanded (:func:`expand_braces`), each glob's matches sorted, and a name without a wildcard kept as it is (the
    caller says whether it exists).
    """
    if os.path.isdir(spec):
        for suffix in suffixes:
            found = sorted(glob.glob(os.path.join(glob.escape(spec), f"*{suffix}")))
            if found:
                return found
        return []
    out: list[str] = []
    for path in expand_braces(spec):
        out += sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
    return out


def add_url_scheme(scheme: str) -> None:
    """Make ``scheme://...`` a URL for :func:`is_url` (``register_storage`` calls it for a new backend)."""
    _SCHEMES.add(scheme.lower())


def url_scheme(path: str | os.PathLike[str]) -> str | None:
    """The registered scheme of a URL (``"s3"``), or ``None`` for a local path."""
    match = _URL.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    scheme = match.group(1).lower() if match else None
    return scheme if scheme in _SCHEMES else None


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a URL of a registered storage backend (``s3://bucket/prefix``) rather than a local path."""
    return url_scheme(path) is not None


def join_url(root: str, relpath: str) -> str:
    """``root`` and a relative key or path joined with one ``/`` (URLs) or ``os.path.join`` (local)."""
    if is_url(root):
        return root.rstrip("/") + "/" + relpath.lstrip("/")
    return os.path.join(root, relpath)


@dataclass(frozen=True)
class ObjectStat:
    """One file or object as a listing or :meth:`Storage.stat` tells of it.

    Attributes:
        size: Bytes.
        version: What changes when the content changes: the ETag of an object, ``"<mtime_ns>"`` of a file.
        key: Its path relative to the root (a listing's entries carry it; ``stat`` leaves it empty).
    """

    size: int
    version: str
    key: str = ""


@runtime_checkable
class Storage(Protocol):
    """A root (folder or bucket prefix) that files are listed and read from; paths are relative to it, ``/``-separated.

    Implementations are picklable and safe to use after ``fork`` in every process that reads (each opens its
    own connections or handles).

    Attributes:
        root: The folder or URL, as the user gave it.
        remote: Whether reads wait on a network: loaders then fetch the next batch ahead, builders read in
            processes that fork nothing, and a listing cannot be checked by folder mtimes (it is listed again).
    """

    root: str
    remote: bool

    def list_classes(self) -> tuple[str, ...]:
        """The class folders (or prefixes) directly under the root, sorted.

        Raises:
            FileNotFoundError: If the root is missing or holds none (named).
        """
        ...

    def list_files(self, classes: Sequence[str] | None = None) -> FileIndex:
        """Every image under ``root/<class>/`` in torchvision's order (``classes``: default all), with versions if any.

        Raises:
            FileNotFoundError: If a class holds no image (named).
        """
        ...

    def list_images(self) -> FileIndex:
        """Every image under the root at any depth (flat or nested), sorted by path, unlabelled (labels: positions).

        What a prediction set is read from.

        Raises:
            FileNotFoundError: If there is none (named).
        """
        ...

    def indexed(
        self, classes: Sequence[str], index_dir: str | os.PathLike[str] | None, index_ttl: float
    ) -> tuple[FileIndex, IndexLookup]:
        """:meth:`list_files`, kept in ``index_dir`` and reused while it still describes the root.

        A local folder is checked by its folders' mtimes; a bucket's listing is reused for ``index_ttl`` seconds.
        The lookup says whether it was reused, how it was checked, or why it was made again.
        """
        ...

    def content_fingerprint(self, index: FileIndex) -> str:
        """A digest that changes when any file of ``index`` is added, removed, replaced or rewritten.

        One ``stat`` per local file; a fresh listing of a bucket (sizes and ETags).
        """
        ...

    def read_many(
        self,
        relpaths: Sequence[str],
        versions: Sequence[int] | None = None,
        on_changed: Callable[[int], None] | None = None,
    ) -> Iterator[bytes | OSError]:
        """Yield each file's bytes (or the ``OSError`` met reading it, after the retries allowed) in the order given.

        An object store fetches them concurrently and yields each one as soon as it and those before it
        arrived, so the caller decodes while the rest are in flight. ``versions``: each file's version as its
        listing gave it (``versions`` of a :class:`~lightning_fastdata.FileIndex`); ``on_changed(k)`` is called for
        each file ``k`` read with another version (it changed since the listing).
        """
        ...

    def read_ahead(self, relpaths: Sequence[str]) -> None:
        """Start reading ``relpaths`` (the next batch) now, where that helps (a remote store); else nothing."""
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

    def location(self) -> str:
        """The root as a file made from it records its source: an absolute path, or the URL."""
        ...
