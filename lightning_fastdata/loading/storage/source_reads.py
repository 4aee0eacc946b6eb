"""Read every file of an index through its :class:`~lightning_fastdata.loading.storage.base.Storage` in a process pool.

What the cache build and the HDF5 converter share: the files of a :class:`~lightning_fastdata.FileIndex` are handed
to the pool in chunks; each process reads its chunk with one ``read_many`` (from a bucket:
the chunk's objects fetched concurrently) and applies a function to each file's bytes; the results come back in
index order. A local folder and a bucket take the same path.

A bucket is read in the pool's processes, never in the process that forks them (obstore's runtime does not
survive a fork): the pool's initializer, :func:`init_source_process`, allows those processes to call obstore.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.storage.base import Storage
from lightning_fastdata.loading.storage.object_store import allow_direct_calls
from lightning_fastdata.loading.workers import init_build_process

__all__ = ["CHUNK", "init_source_process", "map_sources"]

T = TypeVar("T")

CHUNK = 32
"""How many files one pool job reads with one ``read_many`` (that many requests in flight from a bucket)."""


def init_source_process() -> None:
    """A build pool's initializer: one intra-op thread, and obstore allowed in this process (it forks nothing)."""
    init_build_process()
    allow_direct_calls()


def _chunk_job(job: tuple[Storage, list[str], Callable[..., Any], tuple[Any, ...], int | None]) -> list[Any]:
    storage, relpaths, fn, args, first = job
    out = []
    for k, (rel, data) in enumerate(zip(relpaths, storage.read_many(relpaths), strict=True)):
        if isinstance(data, OSError):
            raise DataError(f"Cannot read {storage.url(rel)!r}: {data}. Check that it exists and is readable.")
        where = () if first is None else (first + k,)
        out.append(fn(data, storage.url(rel), *where, *args))
    return out


def map_sources(
    pool: Any,
    storage: Storage,
    index: FileIndex,
    fn: Callable[..., T],
    args: tuple[Any, ...] = (),
    start: int = 0,
    chunk: int = CHUNK,
    positions: bool = False,
) -> Iterator[T]:
    """``fn(bytes, url, *args)`` for the files ``start..`` of ``index``, in order, computed in ``pool``.

    ``fn`` must be picklable (a module-level function); it raises on a bad file, naming the ``url`` it is given.
    With ``positions``, ``fn(bytes, url, i, *args)`` also gets the file's position ``i`` in ``index`` (so that it
    can write its result in place rather than send it back).

    Raises:
        DataError: If a file cannot be read (named), or whatever ``fn`` raises.
    """
    relpaths = [index.relpath(i) for i in range(start, len(index))]
    jobs = [
        (storage, relpaths[k : k + chunk], fn, args, start + k if positions else None)
        for k in range(0, len(relpaths), chunk)
    ]
    for results in pool.imap(_chunk_job, jobs):
        yield from results
