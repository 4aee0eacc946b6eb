"""Shards in a bucket, read in place by byte ranges: their listing, their indexes, and Parquet row groups.

A tar shard's sample is one ranged request of its image member
(:meth:`~lightning_fastdata.loading.storage.object_store.ObjectStorage.read_many` with ``ranges``, several in flight
per worker), or a run of members one request; indexing a shard and reading a Parquet file go through
:class:`RangedFile`, a seekable file over ranged requests (read ahead in blocks) that ``tarfile`` and ``pyarrow`` read
as a local file: ``pyarrow`` asks for the footer, then for the column chunks of the row group it reads, each one
request. Every answer carries the object's size and ETag; one that differs from the indexed version is refused
(:class:`~lightning_fastdata.errors.DataError` naming the URL): an object rewritten after it was indexed is never read
at the old offsets.

The functions that take an obstore store first run where obstore may run (a loader worker, or the helper process:
:meth:`~lightning_fastdata.loading.storage.object_store.ObjectStorage.run_direct`,
:meth:`~lightning_fastdata.loading.storage.object_store.ObjectStorage.run_many`).
"""

from __future__ import annotations

import fnmatch
import functools
import io
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.index.parquet_index import (
    ParquetIndex,
    image_values,
    index_parquet_file,
)
from lightning_fastdata.loading.index.tar_index import TarIndex, index_tar_file
from lightning_fastdata.loading.storage.base import expand_braces, is_url, local_files
from lightning_fastdata.loading.storage.bucket_index import object_version
from lightning_fastdata.loading.storage.obstore_calls import get_object_range

T = TypeVar("T")

__all__ = [
    "RangedFile",
    "bucket_storage",
    "RemoteShard",
    "index_remote_parquet",
    "index_remote_tar",
    "list_remote_shards",
    "read_remote_range",
    "read_remote_row_group",
    "remote_parquet_file",
    "shard_indexes",
    "split_url",
]

#: Bytes a :class:`RangedFile` asks for at least, per request (it reads ahead that far).
BLOCK = 8 << 20


def split_url(url: str) -> tuple[str, str]:
    """``(bucket root, key)`` of an object URL: ``s3://b/x/y.tar`` -> ``("s3://b", "x/y.tar")``."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", key


@dataclass(frozen=True)
class RemoteShard:
    """One shard object: its URL, size and version (of its size and ETag, as listed).

    Attributes:
        url: The object's URL.
        size: Its size in bytes.
        version: :func:`~lightning_fastdata.loading.storage.bucket_index.object_version` of its size and ETag.
    """

    url: str
    size: int
    version: int

    @classmethod
    def listed(cls, url: str, size: int, etag: str) -> RemoteShard:
        """The shard as a listing shows it (size and ETag)."""
        return cls(url, int(size), object_version(int(size), etag))

    @property
    def root(self) -> str:
        """Its bucket's URL (``s3://bucket``)."""
        return split_url(self.url)[0]

    @property
    def key(self) -> str:
        """Its key in the bucket."""
        return split_url(self.url)[1]


def _changed(url: str, size: int, version: int, got: int) -> DataError:
    return DataError(
        f"The shard {url!r} changed after it was indexed ({size} bytes then; another size or ETag now): its samples "
        f"would be read at the wrong places (version {version} -> {got}). Restart to index it again, and do not "
        "rewrite shards while they are read."
    )


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over an object's byte ranges, each answer checked against its version.

    Args:
        store: An obstore store (in a process where obstore may run).
        shard: The object.
        block: Bytes asked for at least per request (read ahead).
    """

    def __init__(self, store: Any, shard: RemoteShard, block: int = BLOCK) -> None:
        super().__init__()
        self.store, self.shard, self.block = store, shard, block
        self.pos = 0
        self._buffer, self._start = b"", 0

    def readable(self) -> bool:  # noqa: D102 - io.RawIOBase
        return True

    def seekable(self) -> bool:  # noqa: D102
        return True

    def tell(self) -> int:  # noqa: D102
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:  # noqa: D102
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.shard.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, b: Any) -> int:  # noqa: D102
        view = memoryview(b).cast("B")
        n = min(len(view), self.shard.size - self.pos)
        if n <= 0:
            return 0
        begin = self.pos - self._start
        if not (0 <= begin and begin + n <= len(self._buffer)):
            end = min(self.shard.size, self.pos + max(n, self.block))
            self._start, self._buffer = read_remote_range(self.store, self.shard, self.pos, end)
            begin = 0
        view[:n] = self._buffer[begin : begin + n]
        self.pos += n
        return n


def index_remote_tar(store: Any, shard: RemoteShard, json_label: str | None, keep_intact: bool = False) -> TarIndex:
    """:func:`~lightning_fastdata.loading.index.tar_index.index_tar` of a shard in a bucket (read once, in blocks)."""
    with io.BufferedReader(RangedFile(store, shard), buffer_size=1 << 16) as f:
        return index_tar_file(f, shard.url, shard.size, shard.version, json_label, keep_intact)


def index_remote_parquet(store: Any, shard: RemoteShard, image_column: str, label_column: str | None) -> ParquetIndex:
    """:func:`~lightning_fastdata.loading.index.parquet_index.index_parquet` of a file in a bucket (footer, labels)."""
    with RangedFile(store, shard, block=1 << 20) as f:
        return index_parquet_file(f, shard.url, shard.size, shard.version, image_column, label_column)


def bucket_storage(paths: Sequence[str], storage_options: Mapping[str, Any] | None, what: str) -> Any:
    """The object store that holds ``paths`` (all in one bucket), or ``None`` where they are local files.

    An :class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage` of the bucket's root.

    Raises:
        ValueError: If they mix local files and URLs, or span several buckets (``what`` names them: "shards").
    """
    remote = [is_url(p) for p in paths]
    if not any(remote):
        return None
    if not all(remote):
        raise InvalidValueError(f"Give {what} all local or all in one bucket, not both.")
    roots = {split_url(p)[0] for p in paths}
    if len(roots) > 1:
        raise InvalidValueError(f"Give {what} of one bucket, not of {sorted(roots)}.")
    from lightning_fastdata.loading.storage.object_store import ObjectStorage

    return ObjectStorage(roots.pop(), storage_options)


def read_remote_range(store: Any, shard: RemoteShard, start: int, end: int) -> tuple[int, bytes]:
    """Bytes ``[start, end)`` of a shard in a bucket (one ranged request, its version checked), with ``start``."""
    data, version = get_object_range(store, shard.key, start, end)
    if version != shard.version:
        raise _changed(shard.url, shard.size, shard.version, version)
    return start, data


#: This process's open remote Parquet files (their footers read), by URL and version.
_OPEN: OrderedDict[tuple[str, int], Any] = OrderedDict()
_OPEN_MAX = 64


def remote_parquet_file(store: Any, shard: RemoteShard) -> Any:
    """This process's open ``ParquetFile`` of a file in a bucket (its footer read once), the last 64 used kept."""
    import pyarrow.parquet as pq

    key = (shard.url, shard.version)
    pf = _OPEN.get(key)
    if pf is None:
        pf = _OPEN[key] = pq.ParquetFile(RangedFile(store, shard, block=1 << 16))
        while len(_OPEN) > _OPEN_MAX:
            _OPEN.popitem(last=False)
    _OPEN.move_to_end(key)
    return pf


def read_remote_row_group(store: Any, shard: RemoteShard, group: int, column: str) -> Any:
    """The image bytes of one row group of a Parquet file in a bucket (its column chunk: one ranged request)."""
    table = remote_parquet_file(store, shard).read_row_group(group, columns=[column])
    return image_values(table.column(0), shard.url, column)


def _list_objects(store: Any, prefix: str) -> list[tuple[str, int, str]]:
    from lightning_fastdata.loading.storage.obstore_calls import list_prefix

    return [(e.key, e.size, e.version) for e in list_prefix(store, prefix)]


def list_remote_shards(patterns: list[str], storage_options: Mapping[str, Any] | None = None) -> list[RemoteShard]:
    """The shard objects ``patterns`` name (URLs: a prefix, a glob, or exact keys after brace expansion), in order.

    A prefix (no ``.tar``/``.parquet`` ending, no glob) names its ``*.tar`` objects directly under it, else its
    ``*.parquet``; each folder of the patterns is listed once (sizes and ETags come with the listing).

    Raises:
        FileNotFoundError: If a named object does not exist or a pattern matches nothing (naming it).
    """
    from lightning_fastdata.loading.storage.object_store import ObjectStorage

    listed: dict[tuple[str, str], list[tuple[str, int, str]]] = {}
    out: list[RemoteShard] = []
    for url in patterns:
        root, key = split_url(url)
        is_file = key.lower().endswith((".tar", ".parquet"))
        has_glob = any(c in key for c in "*?[")
        folder = os.path.dirname(key) if (is_file or has_glob) else key.rstrip("/")
        if (root, folder) not in listed:
            storage = ObjectStorage(root, storage_options)
            entries = storage.run_direct(_list_objects, folder + "/" if folder else "")
            listed[(root, folder)] = sorted(e for e in entries if os.path.dirname(e[0]) == folder)
        entries = listed[(root, folder)]
        if has_glob:
            found = [e for e in entries if fnmatch.fnmatchcase(e[0], key)]
        elif is_file:
            found = [e for e in entries if e[0] == key]
            if not found:
                raise PathNotFoundError(f"The shard {url!r} does not exist (listed {root}/{folder}/).")
        else:
            found = [e for e in entries if e[0].endswith(".tar")] or [e for e in entries if e[0].endswith(".parquet")]
        if not found:
            raise PathNotFoundError(f"{url!r} names no .tar or .parquet shard (a prefix of them, a glob or names).")
        out += [RemoteShard.listed(f"{root}/{k}", size, etag) for k, size, etag in found]
    return out


def shard_indexes(
    spec: str,
    suffix: str,
    storage_options: Mapping[str, Any] | None,
    load: Callable[[str, tuple[int, int, Callable[[], T]] | None], T],
    remote_index: Callable[..., T],
    *args: Any,
) -> list[T]:
    """The index of each shard ``spec`` names, in order.

    ``spec``: a local folder of ``*suffix`` files, a glob or a brace pattern; a bucket prefix, glob or brace
    pattern. ``load(path, remote)`` loads or builds one index (``remote``: ``None`` for a local file, else the
    object's size, version and what builds its index: ``remote_index(store, shard, *args)``, reading it by ranges).

    Raises:
        FileNotFoundError: If nothing matches (named).
    """
    if is_url(spec):
        from lightning_fastdata.loading.storage.object_store import ObjectStorage

        out = []
        for shard in list_remote_shards(expand_braces(spec), storage_options):
            build = functools.partial(ObjectStorage(shard.root, storage_options).run_direct, remote_index, shard, *args)
            out.append(load(shard.url, (shard.size, shard.version, build)))
        return out
    paths = local_files(spec, [suffix])
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise PathNotFoundError(f"The shard {missing[0]!r} (of {spec!r}) does not exist.")
    if not paths:
        raise PathNotFoundError(f"{spec!r} names no {suffix} file (a folder of them, a glob or a brace pattern).")
    return [load(os.path.abspath(p), None) for p in paths]
