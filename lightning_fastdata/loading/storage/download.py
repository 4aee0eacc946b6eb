"""A node-local copy of one object (an HDF5 file in a bucket): downloaded once, atomically, resumably.

:func:`node_local_copy` puts ``s3://bucket/train.h5`` at ``cache_dir/train-<hash>.h5``. The first process to
take the copy's lock (``filelock``) downloads; every other process (the other ranks of the node, later runs)
waits for it and reuses the copy while the object's size and ETag are unchanged. So with a node-local
``cache_dir`` each node downloads once; with a shared one, once in total.

The bytes go to a hidden ``.partial`` file, fetched in ordered ranges (several in flight) and appended in order,
so it is always a prefix of the object: a download killed halfway resumes from its size, if the object's ETag
is still the one recorded beside it (otherwise it starts over). A finished download is checked by size, and by
MD5 when the ETag is one (a single-part upload), then renamed into place: a reader never sees half a file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.loading.storage.object_store import ObjectStorage

__all__ = ["CHUNK_BYTES", "node_local_copy"]

log = logging.getLogger("lightning_fastdata")

#: Bytes per ranged request.
CHUNK_BYTES = 16 << 20
_MD5 = re.compile(r'^"?([0-9a-f]{32})"?$')


def _local_name(url: str) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1]
    stem, dot, ext = name.rpartition(".")
    stem, ext = (stem, "." + ext) if dot else (name, "")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "object"
    return f"{safe}-{hashlib.sha1(url.encode()).hexdigest()[:12]}{ext}"


def node_local_copy(
    url: str,
    cache_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Path:
    """The local copy of the object at ``url`` in ``cache_dir``: reused if current, else downloaded (see module).

    Raises:
        FileNotFoundError: If the object does not exist (its URL named).
        OSError: If the download fails after the retries, or the copy does not match the object's size or MD5.
    """
    parent, _, key = url.rstrip("/").rpartition("/")
    storage = ObjectStorage(parent, storage_options)
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    dest = cache_dir / _local_name(url)
    record = dest.with_name(dest.name + ".source.json")
    partial = dest.with_name(f".{dest.name}.partial")
    partial_record = partial.with_name(partial.name + ".json")
    with FileLock(str(dest) + ".lock"):
        stat = storage.stat(key)
        want = {"url": url, "size": stat.size, "etag": stat.version}
        if dest.exists() and _read_json(record) == want and dest.stat().st_size == stat.size:
            log.info("lightning_fastdata: %s is current in %s (size and ETag unchanged); not downloaded.", url, dest)
            return dest
        offset = 0
        if partial.exists() and _read_json(partial_record) == want and partial.stat().st_size <= stat.size:
            offset = partial.stat().st_size
            log.info("lightning_fastdata: resuming the download of %s at byte %d of %d.", url, offset, stat.size)
        else:
            partial.unlink(missing_ok=True)
            atomic_write_text(partial_record, json.dumps(want))
        storage.run_direct(_download, key, str(partial), offset, stat.size, chunk_bytes, storage.max_inflight)
        size = partial.stat().st_size
        if size != stat.size:
            raise DataError(f"The download of {url} to {partial} has {size} bytes, the object {stat.size}; run again.")
        match = _MD5.match(stat.version)
        if match and _md5(partial) != match.group(1):
            partial.unlink()
            raise DataError(f"The download of {url} does not match its MD5 ETag {stat.version}; deleted, run again.")
        record.unlink(missing_ok=True)  # no record while dest is being replaced: never a stale match
        os.replace(partial, dest)
        atomic_write_text(record, json.dumps(want))
        partial_record.unlink(missing_ok=True)
        log.info("lightning_fastdata: downloaded %s (%d bytes) to %s.", url, stat.size, dest)
        return dest


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def _download(store: Any, key: str, path: str, offset: int, size: int, chunk: int, inflight: int) -> int:
    """Append bytes ``offset:size`` of ``key`` to ``path``, ``inflight`` ranges at a time, written in order."""
    import obstore

    async def run() -> int:
        gate = asyncio.Semaphore(max(1, min(inflight, 8)))

        async def fetch(start: int) -> bytes:
            async with gate:
                return bytes(await obstore.get_range_async(store, key, start=start, end=min(start + chunk, size)))

        tasks = [asyncio.ensure_future(fetch(start)) for start in range(offset, size, chunk)]
        written = 0
        try:
            with open(path, "ab") as f:
                for task in tasks:
                    data = await task
                    f.write(data)
                    written += len(data)
                f.flush()
                os.fsync(f.fileno())
        finally:
            for task in tasks:
                task.cancel()
        return written

    return asyncio.run(run())
