"""Building a tensor cache: locked, resumable, renamed into place only when complete.

A build writes ``<cache_dir>.partial/`` (with ``progress.json``) under an exclusive lock file
``<cache_dir>.lock`` (``filelock``) and renames it to ``cache_dir`` only when complete, so a killed build never
leaves a cache that looks valid, a rerun resumes it (same parameters and source) or rebuilds it (and says which),
and on a shared file system the first builder builds while the others wait and then reuse it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import numpy as np
from filelock import FileLock
from tqdm import tqdm

from lightning_fastdata.cache.manifest import (
    SPLITS,
    CacheParams,
    cache_is_current,
    changed_param,
    read_manifest,
    write_json,
    write_manifest,
)
from lightning_fastdata.cache.source import fingerprint, folders_unchanged, listing_fingerprint, source_record
from lightning_fastdata.convert.hdf5 import convert_folder_to_hdf5
from lightning_fastdata.errors import AccessError, DataError, InvalidValueError
from lightning_fastdata.loading.atomic import replace_folder
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.jpeg.decode import decode_center_crop_bytes
from lightning_fastdata.loading.storage.base import Storage
from lightning_fastdata.loading.storage.local import LocalStorage
from lightning_fastdata.loading.storage.source_reads import init_source_process, map_sources

__all__ = ["build_tensor_cache", "check_verify_source"]

log = logging.getLogger("lightning_fastdata")


def _record_source(cache_dir: Path, params: CacheParams, record: dict[str, Any]) -> None:
    """Add the folder record to a current cache built without one (or with racy folders), under the build lock.

    Under the lock and checked again, so a builder that is replacing the cache meanwhile is never given this
    record. A cache that cannot be written (a read-only shared copy) keeps the full check: logged, not raised.
    """
    try:
        with _locked(cache_dir.parent / f"{cache_dir.name}.lock"):
            manifest = read_manifest(cache_dir)
            if manifest is None or not cache_is_current(cache_dir, params)[0]:
                return
            manifest["source"] = record
            write_json(cache_dir / "manifest.json", manifest)
    except OSError as err:
        log.info("Could not record the source folders in %s (%s); every file is checked at each use.", cache_dir, err)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (other builders, on this node or a shared FS, wait)."""
    with FileLock(lock_path):
        yield


_WRITE_FILES: dict[str, Any] = {}
"""Per build process: the cache files it writes rows into, opened once (the pool's processes end with the build)."""


def _decode_into_file(
    data: bytes, url: str, row: int, path: str, offset: int, side: int, fraction: float, exact: bool
) -> None:
    """Decode ``data``'s centre square into row ``row`` of the ``.npy`` at ``path`` (its data at ``offset``).

    Runs in a build process: the ``side x side x 3`` row is written there, so no image crosses a pipe and the
    process that collects the results does no copying (it was a third of the build's time on 2 cores).
    """
    f = _WRITE_FILES.get(path)
    if f is None:
        f = _WRITE_FILES[path] = open(path, "r+b", buffering=0)  # noqa: SIM115 - kept open for the pool's life
    square = decode_center_crop_bytes(data, url, side, fraction, exact)
    f.seek(offset + row * square.nbytes)
    f.write(np.ascontiguousarray(square).data.cast("B"))


def _open_array_for_writing(path: Path, shape: tuple[int, ...], resume: bool) -> np.memmap:
    """A ``.npy`` memory map to fill, its disk blocks reserved first.

    A memory-mapped write to a sparse file on a disk that fills up kills the process with SIGBUS; reserving
    the blocks up front (``posix_fallocate``) turns that into an ``OSError`` before anything is written.
    """
    images = np.lib.format.open_memmap(path, mode="r+" if resume else "w+", dtype=np.uint8, shape=shape)
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as err:
            del images
            raise DataError(
                f"Cannot reserve {os.path.getsize(path) / 1e9:.2f} GB for the tensor cache file {str(path)!r}: "
                f"{err.strerror}. Free space on that disk, lower cache_size, or choose another cache_dir."
            ) from err
        finally:
            os.close(fd)
    return images


def check_verify_source(verify_source: str) -> None:
    """The one check of ``verify_source`` (the DataModule calls it in ``__init__``, the build in its own).

    Raises:
        ValueError: If it is neither ``"files"`` nor ``"folders"``.
    """
    if verify_source not in ("files", "folders"):
        raise InvalidValueError(
            f"verify_source should be 'files' (stat every source file) or 'folders' (the file list and its "
            f"folders' mtimes), got {verify_source!r}."
        )


def build_tensor_cache(
    cache_dir: str | os.PathLike[str],
    train_index: FileIndex,
    val_index: FileIndex | None,
    cache_size: int = 256,
    image_size: int = 224,
    crop_fraction: float = 0.875,
    processes: int | None = None,
    progress: bool = True,
    read_only: bool = False,
    storage: Literal["raw", "jpeg"] = "raw",
    quality: int = 90,
    verify_source: Literal["files", "folders"] = "files",
    storages: Mapping[str, Storage] | None = None,
    exact_decode: bool = False,
) -> Path:
    """Build (or resume, or reuse) the cache of ``train_index`` / ``val_index`` in ``cache_dir``.

    Returns at once when a current cache is there. Otherwise takes ``<cache_dir>.lock``, resumes a matching
    ``<cache_dir>.partial`` or starts a new one, decodes in ``processes`` processes with a progress bar, and
    renames the finished directory to ``cache_dir``.

    ``verify_source`` is how a built cache is checked against the source: ``"files"`` stats every file (path,
    size, mtime: O(files)); ``"folders"`` compares the file list and the mtimes of
    the folders recorded at build time (O(folders)), which sees files added, removed, renamed or replaced
    by a rename, but not a file rewritten in place under the same name. When the folder check fails (or the
    manifest has no record, or a folder was modified during the build) the full check decides, and a cache it
    finds current gets a fresh record.

    ``storages`` maps an index's root to its :class:`~lightning_fastdata.loading.storage.base.Storage` (default: the
    local folder). From a bucket the files are read by the build processes, a chunk of objects at a time
    fetched concurrently, and the source is checked by listing it again: keys, sizes and ETags
    (:func:`~lightning_fastdata.cache.source.listing_fingerprint`; ``verify_source`` does not apply: a
    bucket has no folder mtimes, and an object rewritten in place gets a new ETag).

    ``exact_decode`` decodes the raw cache's squares with the exact IDCT at full size (see
    :func:`~lightning_fastdata.loading.jpeg.decode.decode_resized_crop`); a cache built the other way is stale. The
    ``"jpeg"`` storage re-encodes every image, so it is never bit-exact and ignores it.

    Args:
        cache_dir: Where the cache is (or is built: ``<cache_dir>.partial`` first, renamed when complete).
        train_index: The training files.
        val_index: The validation files, or ``None``.
        cache_size: Side of the stored training squares.
        image_size: Side of the stored validation crops.
        crop_fraction: Validation crop as a fraction of the shorter side.
        processes: Build processes; ``None``: the usable CPUs.
        progress: Show progress bars.
        read_only: Raise instead of building when the cache is missing or stale.
        storage: ``"raw"`` uint8 arrays, or ``"jpeg"`` (each image re-encoded once, compact).
        quality: JPEG quality of ``"jpeg"`` storage.
        verify_source: How a built cache is checked against the source (above).
        storages: An index root -> its storage (above).
        exact_decode: Decode with the exact IDCT at full size (above).

    Raises:
        PermissionError: If ``cache_dir``'s parent is not writable.
        OSError: If there is not enough disk space (the message gives the size needed), or a source image is
            corrupt (named).
        ValueError: If the cache is stale and ``read_only`` is set, or its format is newer than this package.
    """
    from lightning_fastdata.loading.workers import CpuBudget

    check_verify_source(verify_source)
    cache_dir = Path(cache_dir)
    indexes = (train_index, val_index)
    given = dict(storages or {})
    sources = {i.root: given.get(i.root) or LocalStorage(i.root) for i in indexes if i is not None}
    in_bucket = any(x.remote for x in sources.values())
    params = CacheParams(
        cache_size=cache_size,
        image_size=image_size,
        crop_fraction=crop_fraction,
        fingerprint="",  # computed in _checked, unless the folder check is enough
        classes=tuple(train_index.classes),
        storage=storage,
        quality=quality,
        exact_decode=exact_decode,
    )
    checked = _checked(cache_dir, params, indexes, sources, verify_source, read_only)
    if checked is None:
        return cache_dir
    params, record, why = checked
    parent = cache_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    if not os.access(parent, os.W_OK):
        raise AccessError(f"Cannot write the tensor cache: {str(parent)!r} is not writable. Choose another cache_dir.")
    with _locked(parent / f"{cache_dir.name}.lock"):
        current, why = cache_is_current(cache_dir, params)  # another builder may have finished meanwhile
        if current:
            return cache_dir
        partial = parent / f"{cache_dir.name}.partial"
        sizes = {
            "train": (len(train_index), cache_size),
            "val": (0 if val_index is None else len(val_index), image_size),
        }
        state = _start_or_resume(partial, cache_dir, params, sizes, why)
        if record is None and not in_bucket:  # taken before any decode: a change after it shows in the next check
            record = source_record(indexes)
        processes = processes or CpuBudget.detect().usable
        if storage == "jpeg":
            _build_jpeg(partial, train_index, val_index, cache_size, quality, processes, progress, sources)
        else:
            _build_raw(partial, indexes, sizes, state, params, processes, progress, sources)
        write_manifest(partial, params, {split: sizes[split][0] for split in SPLITS}, record)
        (partial / "progress.json").unlink()
        replace_folder(partial, cache_dir)  # a stale cache is moved aside, the new one swapped in, the old deleted
    return cache_dir


def _checked(
    cache_dir: Path,
    params: CacheParams,
    indexes: tuple[FileIndex, FileIndex | None],
    sources: Mapping[str, Storage],
    verify_source: str,
    read_only: bool,
) -> tuple[CacheParams, Any, str] | None:
    """The cache checked against its source: ``None`` if it is current, else ``(params, record, why not)``.

    ``params`` come back with the source's fingerprint; ``record`` is the folders' record taken before the files'
    stat where ``verify_source="folders"`` (a change after it shows in the next check), else ``None``.

    Raises:
        ValueError: If it is not current and ``read_only`` is set.
    """
    in_bucket = any(x.remote for x in sources.values())
    record = None
    if verify_source == "folders" and not in_bucket:
        manifest = read_manifest(cache_dir)
        unchanged, _ = folders_unchanged(manifest, indexes)
        if unchanged and manifest is not None and changed_param(manifest.get("params", {}), params) is None:
            return None
        record = source_record(indexes)
    params = replace(params, fingerprint=listing_fingerprint(indexes, sources) if in_bucket else fingerprint(indexes))
    current, why = cache_is_current(cache_dir, params)
    if current:
        if record is not None and not read_only:
            _record_source(cache_dir, params, record)
        return None
    if read_only:
        raise InvalidValueError(
            f"Tensor cache {str(cache_dir)!r} is not usable ({why}) and read_only=True; run once with "
            "read_only=False to (re)build it, or point cache_dir at a current cache."
        )
    return params, record, why


def _start_or_resume(
    partial: Path, cache_dir: Path, params: CacheParams, sizes: dict[str, tuple[int, int]], why: str
) -> dict[str, Any]:
    """The build's progress record: a matching interrupted build's in ``partial``, else a new, empty one.

    A new build starts from an empty ``partial`` (one of other parameters is removed), after a check of the disk's
    free space.

    Raises:
        DataError: If there is not enough disk space (the message gives the size needed).
    """
    state = {"params": {**asdict(params), "classes": list(params.classes)}, "done": {"train": 0, "val": 0}}
    try:
        previous = json.loads((partial / "progress.json").read_text())
    except (OSError, ValueError):
        previous = None
    if previous is not None and previous.get("params") == state["params"]:
        state["done"] = previous["done"]
        done = state["done"]
        log.warning(
            "Resuming the interrupted tensor cache build in %s at train %d/%d, val %d/%d.",
            partial,
            done["train"],
            sizes["train"][0],
            done["val"],
            sizes["val"][0],
        )
        print(f"lightning_fastdata: resuming the interrupted cache build in {partial}")
        return state
    if partial.exists():
        print(f"lightning_fastdata: rebuilding the tensor cache from scratch in {partial} ({why})")
        shutil.rmtree(partial)
    else:
        print(f"lightning_fastdata: building the tensor cache in {cache_dir} ({why})")
    raw_bytes = sum(n * s * s * 3 + n * 8 for n, s in sizes.values())
    needed = raw_bytes // (5 if params.storage == "jpeg" else 1) + (1 << 20)  # JPEG q90: ~1/6 to 1/10 of raw
    free = shutil.disk_usage(partial.parent).free
    if free < needed:
        raise DataError(
            f"Not enough disk space for the tensor cache in {str(partial.parent)!r}: it needs {needed / 1e9:.2f} GB, "
            f"{free / 1e9:.2f} GB are free. Free space, lower cache_size, or choose another cache_dir."
        )
    partial.mkdir()
    write_json(partial / "progress.json", state)
    return state


def _build_raw(
    partial: Path,
    indexes: tuple[FileIndex, FileIndex | None],
    sizes: dict[str, tuple[int, int]],
    state: dict[str, Any],
    params: CacheParams,
    processes: int,
    progress: bool,
    sources: Mapping[str, Storage],
) -> None:
    """Decode every split's squares (crops, for validation) into its uint8 array, from where ``state`` says.

    The progress is recorded every 256 rows, after they are on disk, so a killed build resumes there.
    """
    context = get_context("fork" if os.name == "posix" else "spawn")
    with context.Pool(processes, initializer=init_source_process) as pool:
        for split, index in zip(SPLITS, indexes):
            n, side = sizes[split]
            labels = np.zeros(0, np.int64) if index is None else _stored_labels(index.labels)
            np.save(partial / f"{split}_labels.npy", labels)
            path = partial / f"{split}_images.npy"
            start = state["done"][split]
            images = _open_array_for_writing(path, (n, side, side, 3), resume=start > 0 and path.exists())
            offset = int(images.offset)
            del images  # the build processes write the rows (_decode_into_file)
            fraction = 1.0 if split == "train" else params.crop_fraction
            args = (str(path), offset, side, fraction, params.exact_decode)
            results = (
                ()
                if index is None
                else map_sources(pool, sources[index.root], index, _decode_into_file, args, start, positions=True)
            )
            bar = tqdm(total=n, initial=start, desc=f"cache {split}", unit="img", disable=not progress or n == 0)
            with open(path, "rb") as written:
                for i, _ in enumerate(results, start=start):
                    bar.update()
                    if (i + 1) % 256 == 0 or i + 1 == n:  # checkpoint the progress for a resume
                        # results come in order: rows start..i are written; on disk before the record
                        os.fsync(written.fileno())
                        state["done"][split] = i + 1
                        write_json(partial / "progress.json", state)
            bar.close()


def _build_jpeg(
    partial: Path,
    train_index: FileIndex,
    val_index: FileIndex | None,
    cache_size: int,
    quality: int,
    processes: int,
    progress: bool,
    sources: Mapping[str, Storage],
) -> None:
    """Re-encode each split once into ``partial/<split>.h5`` (shorter side ``cache_size``, JPEG ``quality``).

    Each file is written atomically by the converter, so a rerun keeps a split that is already there.
    """
    for split, index in (("train", train_index), ("val", val_index)):
        dst = partial / f"{split}.h5"
        if index is not None and not dst.exists():
            convert_folder_to_hdf5(
                index,
                dst,
                max_side=cache_size,
                quality=quality,
                processes=processes,
                progress=progress,
                storage=sources[index.root],
            )


def _stored_labels(labels: np.ndarray) -> np.ndarray:
    """Labels as the cache keeps them: ``int64`` class positions, or ``uint8`` multi-hot rows (``N x C``)."""
    return labels.astype(np.uint8) if labels.ndim == 2 else labels.astype(np.int64)
