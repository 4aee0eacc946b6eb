"""The tensor cache: images decoded and resized once into uint8 ``.npy`` arrays, read by memory map.

Layout of ``cache_dir`` (format version 1; any tool that reads ``.npy`` can open it):

- ``train_images.npy``: uint8 ``N x S x S x 3``, the central square of each training image resized to
  ``S = cache_size`` (random resized crops are taken from it at training time);
- ``val_images.npy``: uint8 ``M x I x I x 3``, validation images already resized and center-cropped to
  ``I = image_size`` (``Resize(I / crop_fraction) + CenterCrop(I)``);
- ``train_labels.npy``, ``val_labels.npy``: int64;
- ``manifest.json``: ``format_version``, the build parameters, ``classes``, counts, a ``fingerprint`` of
  the source (sha256 of every file's relative path, size and mtime), and ``source``: the file list's sha256 and
  the mtimes of the folders holding the files, taken before the build decoded anything (what
  ``verify_source="folders"`` compares in ``O(folders)``; see :func:`folders_unchanged`).

With ``storage="jpeg"`` (the compact cache, for data bigger than RAM) the arrays are replaced by ``train.h5`` and
``val.h5``: each image re-encoded once with its shorter side ``cache_size`` at JPEG ``quality``, in the
converter's encoded HDF5 layout (see :func:`~lightning_fastdata.convert_folder_to_hdf5`), decoded by the
region-of-interest path at training time; validation is resized and center-cropped when read.

A build writes ``<cache_dir>.partial/`` (with ``progress.json``) under an exclusive lock file
``<cache_dir>.lock`` and renames it to ``cache_dir`` only when complete, so a killed build never leaves a
cache that looks valid, a rerun resumes it (same parameters and source) or rebuilds it (and says which), and
on a shared file system the first builder builds while the others wait and then reuse it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm import tqdm

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.datasets.convert import convert_folder_to_hdf5
from lightning_fastdata.loading.arrays import MappedFile, gather_hwc
from lightning_fastdata.loading.collate import empty_image_batch
from lightning_fastdata.loading.decode import decode_center_crop, random_resized_crop_box
from lightning_fastdata.loading.index import FileIndex
from lightning_fastdata.loading.index_store import RACY_SECONDS
from lightning_fastdata.loading.sampler import SampleKey

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CacheParams",
    "TensorCacheDataset",
    "build_tensor_cache",
    "open_jpeg_cache",
    "open_tensor_cache",
    "write_manifest",
]

log = logging.getLogger("lightning_fastdata")

CACHE_FORMAT_VERSION = 1
_SPLITS = ("train", "val")


@dataclass(frozen=True)
class CacheParams:
    """Everything a cache's content depends on; a cache whose parameters differ is stale.

    Args:
        cache_size: Side of the stored training squares.
        image_size: Side of the stored validation crops.
        crop_fraction: Validation crop as a fraction of the shorter side.
        fingerprint: sha256 of the source files' relative paths, sizes and mtimes (train and val lists).
        classes: Class names.
        storage: ``"raw"`` (uint8 arrays) or ``"jpeg"`` (each image re-encoded once, compact).
        quality: JPEG quality (``"jpeg"`` storage).
    """

    cache_size: int
    image_size: int
    crop_fraction: float
    fingerprint: str
    classes: tuple[str, ...]
    storage: str = "raw"
    quality: int = 90


#: What a manifest written before a parameter existed meant by it.
_PARAM_DEFAULTS = {"storage": "raw", "quality": 90}


def fingerprint(indexes: Sequence[FileIndex | None]) -> str:
    """sha256 of each file's relative path, size and mtime, over the given indexes in order.

    One ``stat`` per file (1.28M files: ~4 s of system calls on a local disk, minutes on a network file system);
    the records are built from the index's path bytes, with no per-file decode (12.6 s -> 6.5 s on the 1.28M-file
    tree before this change; the digest is the same, so existing caches stay current).
    """
    digest = hashlib.sha256()
    stat = os.stat
    for index in indexes:
        digest.update(b"|split|")
        if index is None:
            continue
        root = os.path.join(os.fsencode(index.root), b"")
        blob, offsets, labels = index.path_bytes.tobytes(), index.offsets.tolist(), index.labels.tolist()
        for lo in range(0, len(labels), 65536):  # a chunk of records at a time: bounded memory, few updates
            records = []
            for i in range(lo, min(lo + 65536, len(labels))):
                rel = blob[offsets[i] : offsets[i + 1]]  # os.fsencode of the relative path: any name, also non-UTF-8
                st = stat(root + rel)
                records.append(b"%s\0%d\0%d\0%d\n" % (rel, st.st_size, st.st_mtime_ns, labels[i]))
            digest.update(b"".join(records))
    return digest.hexdigest()


def listing_digest(indexes: Sequence[FileIndex | None]) -> str:
    """sha256 of the indexes' relative paths, labels and classes: no file system access (~50 ms for 1.28M files)."""
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
    A folder modified within :data:`~lightning_fastdata.loading.index_store.RACY_SECONDS` of ``started`` is
    recorded with mtime ``-1`` ("unknown"): a file replaced in the same clock tick would not change it.
    """
    racy_after = int((started - RACY_SECONDS) * 1e9)
    out: list[list[list[Any]]] = []
    for index in indexes:
        if index is None:
            out.append([])
            continue
        blob, offsets = index.path_bytes.tobytes(), index.offsets.tolist()
        sep = os.fsencode(os.sep)
        folders = {blob[offsets[i] : offsets[i + 1]].rpartition(sep)[0] for i in range(len(offsets) - 1)}
        names = {".", *index.classes, *(os.fsdecode(f) for f in folders)}
        for rel in list(names):
            names |= _link_target_folders(os.path.join(index.root, rel))
        rows = []
        for rel in sorted(names):
            mtime = os.stat(os.path.join(index.root, rel)).st_mtime_ns
            rows.append([rel, -1 if mtime >= racy_after else mtime])
        out.append(rows)
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
        for rel, mtime in rows:
            path = os.path.join(index.root, rel)
            try:
                now = os.stat(path).st_mtime_ns
            except OSError:
                now = None
            if mtime == -1 or now != mtime:
                return False, f"{path!r} {'was modified during the build' if mtime == -1 else 'changed'}"
    return True, "up to date (folders unchanged)"


def _read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((cache_dir / "manifest.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise OSError(
            f"Cache manifest {str(cache_dir / 'manifest.json')!r} is unreadable ({err}); delete "
            f"{str(cache_dir)!r} to rebuild the cache."
        ) from err
    version = int(manifest.get("format_version", 0))
    if version > CACHE_FORMAT_VERSION:
        raise ValueError(
            f"Cache {str(cache_dir)!r} has format_version={version}, newer than this package reads "
            f"({CACHE_FORMAT_VERSION}); upgrade lightning-fastdata or delete the cache to rebuild it."
        )
    return manifest


def _changed_param(built: dict[str, Any], params: CacheParams) -> str | None:
    """Which of ``params`` (other than the fingerprint) differs from the manifest's ``built`` ones, if any."""
    for key, value in asdict(params).items():
        was = built.get(key, _PARAM_DEFAULTS.get(key))
        if key != "fingerprint" and was != (list(value) if isinstance(value, tuple) else value):
            return f"{key} changed from {was!r} to {value!r}"
    return None


def cache_is_current(cache_dir: str | os.PathLike[str], params: CacheParams) -> tuple[bool, str]:
    """Whether ``cache_dir`` holds a complete cache built with ``params``, and why not."""
    manifest = _read_manifest(Path(cache_dir))
    if manifest is None:
        return False, "no cache yet"
    built = manifest.get("params", {})
    if built.get("fingerprint") != params.fingerprint:
        return False, "the source images changed (file list, sizes or mtimes)"
    changed = _changed_param(built, params)
    return (False, changed) if changed else (True, "up to date")


def _record_source(cache_dir: Path, params: CacheParams, record: dict[str, Any]) -> None:
    """Add the folder record to a current cache built without one (or with racy folders), under the build lock.

    Under the lock and checked again, so a builder that is replacing the cache meanwhile is never given this
    record. A cache that cannot be written (a read-only shared copy) keeps the full check: logged, not raised.
    """
    try:
        with _locked(cache_dir.parent / f"{cache_dir.name}.lock"):
            manifest = _read_manifest(cache_dir)
            if manifest is None or not cache_is_current(cache_dir, params)[0]:
                return
            manifest["source"] = record
            _write_json(cache_dir / "manifest.json", manifest, unique=True)
    except OSError as err:
        log.info("Could not record the source folders in %s (%s); every file is checked at each use.", cache_dir, err)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (other builders, on this node or a shared FS, wait).

    ``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows (imported here: neither exists on the other).
    """
    with open(lock_path, "a+") as handle:
        if os.name == "nt":  # pragma: no cover - Windows
            import msvcrt

            handle.seek(0)
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)  # type: ignore[attr-defined]
                    break
                except OSError:  # LK_LOCK gives up after ~10 s: keep waiting for the other builder
                    continue
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
            return
        import fcntl

        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
            raise OSError(
                f"Cannot reserve {os.path.getsize(path) / 1e9:.2f} GB for the tensor cache file {str(path)!r}: "
                f"{err.strerror}. Free space on that disk, lower cache_size, or choose another cache_dir."
            ) from err
        finally:
            os.close(fd)
    return images


def write_manifest(cache_dir: Path, params: CacheParams, counts: dict[str, int], source: dict[str, Any] | None) -> None:
    """Write ``cache_dir/manifest.json`` (atomically): what makes the arrays beside it a current cache."""
    manifest = {
        "format_version": CACHE_FORMAT_VERSION,
        "params": {**asdict(params), "classes": list(params.classes)},
        "counts": counts,
        "source": source,
    }
    _write_json(cache_dir / "manifest.json", manifest)


def _decode_job(args: tuple[str, int, float]) -> np.ndarray:
    return decode_center_crop(*args)


def _write_json(path: Path, obj: dict[str, Any], unique: bool = False) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp" if unique else ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
) -> Path:
    """Build (or resume, or reuse) the cache of ``train_index`` / ``val_index`` in ``cache_dir``.

    Returns at once when a current cache is there. Otherwise takes ``<cache_dir>.lock``, resumes a matching
    ``<cache_dir>.partial`` or starts a new one, decodes in ``processes`` processes with a progress bar, and
    renames the finished directory to ``cache_dir``.

    ``verify_source`` is how a built cache is checked against the source: ``"files"`` stats every file (path,
    size, mtime: O(files), ~6 s for 1.28M local files); ``"folders"`` compares the file list and the mtimes of
    the folders recorded at build time (O(folders), ~0.1 s), which sees files added, removed, renamed or replaced
    by a rename, but not a file rewritten in place under the same name. When the folder check fails (or the
    manifest has no record, or a folder was modified during the build) the full check decides, and a cache it
    finds current gets a fresh record.

    Raises:
        PermissionError: If ``cache_dir``'s parent is not writable.
        OSError: If there is not enough disk space (the message gives the size needed), or a source image is
            corrupt (named).
        ValueError: If the cache is stale and ``read_only`` is set, or its format is newer than this package.
    """
    from lightning_fastdata.loading.workers import CpuBudget, init_build_process

    if verify_source not in ("files", "folders"):
        raise ValueError(f"verify_source should be 'files' or 'folders', got {verify_source!r}.")
    cache_dir = Path(cache_dir)
    indexes = (train_index, val_index)
    params = CacheParams(
        cache_size=cache_size,
        image_size=image_size,
        crop_fraction=crop_fraction,
        fingerprint="",  # computed below, unless the folder check is enough
        classes=tuple(train_index.classes),
        storage=storage,
        quality=quality,
    )
    record = None
    if verify_source == "folders":
        manifest = _read_manifest(cache_dir)
        unchanged, _ = folders_unchanged(manifest, indexes)
        if unchanged and manifest is not None and _changed_param(manifest.get("params", {}), params) is None:
            return cache_dir
        record = source_record(indexes)  # before the files' stat: a change after it shows in the next check
    params = replace(params, fingerprint=fingerprint(indexes))
    current, why = cache_is_current(cache_dir, params)
    if current:
        if record is not None and not read_only:
            _record_source(cache_dir, params, record)
        return cache_dir
    if read_only:
        raise ValueError(
            f"Tensor cache {str(cache_dir)!r} is not usable ({why}) and read_only=True; run once with "
            "read_only=False to (re)build it, or point cache_dir at a current cache."
        )
    parent = cache_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    if not os.access(parent, os.W_OK):
        raise PermissionError(
            f"Cannot write the tensor cache: {str(parent)!r} is not writable. Choose another cache_dir."
        )
    with _locked(parent / f"{cache_dir.name}.lock"):
        current, why = cache_is_current(cache_dir, params)  # another builder may have finished meanwhile
        if current:
            return cache_dir
        partial = parent / f"{cache_dir.name}.partial"
        sizes = {
            "train": (len(train_index), cache_size),
            "val": (0 if val_index is None else len(val_index), image_size),
        }
        state = {"params": {**asdict(params), "classes": list(params.classes)}, "done": {"train": 0, "val": 0}}
        try:
            previous = json.loads((partial / "progress.json").read_text())
        except (OSError, ValueError):
            previous = None
        if previous is not None and previous.get("params") == state["params"]:
            state["done"] = previous["done"]
            log.warning(
                "Resuming the interrupted tensor cache build in %s at train %d/%d, val %d/%d.",
                partial,
                state["done"]["train"],
                sizes["train"][0],
                state["done"]["val"],
                sizes["val"][0],
            )
            print(f"lightning_fastdata: resuming the interrupted cache build in {partial}")
        else:
            if partial.exists():
                print(f"lightning_fastdata: rebuilding the tensor cache from scratch in {partial} ({why})")
                shutil.rmtree(partial)
            else:
                print(f"lightning_fastdata: building the tensor cache in {cache_dir} ({why})")
            raw_bytes = sum(n * s * s * 3 + n * 8 for n, s in sizes.values())
            needed = raw_bytes // (5 if storage == "jpeg" else 1) + (1 << 20)  # JPEG q90: ~1/6 to 1/10 of raw
            free = shutil.disk_usage(parent).free
            if free < needed:
                raise OSError(
                    f"Not enough disk space for the tensor cache in {str(parent)!r}: it needs {needed / 1e9:.2f} GB, "
                    f"{free / 1e9:.2f} GB are free. Free space, lower cache_size, or choose another cache_dir."
                )
            partial.mkdir()
            _write_json(partial / "progress.json", state)
        if record is None:  # taken before any image is decoded: a change after it shows in the next check
            record = source_record(indexes)
        processes = processes or CpuBudget.detect().usable
        context = get_context("fork" if os.name == "posix" else "spawn")
        if storage == "jpeg":
            _build_jpeg(partial, train_index, val_index, cache_size, quality, processes, progress)
        else:
            with context.Pool(processes, initializer=init_build_process) as pool:
                for split, index in (("train", train_index), ("val", val_index)):
                    n, side = sizes[split]
                    labels = np.zeros(0, np.int64) if index is None else index.labels.astype(np.int64)
                    np.save(partial / f"{split}_labels.npy", labels)
                    path = partial / f"{split}_images.npy"
                    start = state["done"][split]
                    images = _open_array_for_writing(path, (n, side, side, 3), resume=start > 0 and path.exists())
                    fraction = 1.0 if split == "train" else crop_fraction
                    jobs = [(index.path(i), side, fraction) for i in range(start, n)] if index is not None else []
                    bar = tqdm(
                        total=n, initial=start, desc=f"cache {split}", unit="img", disable=not progress or n == 0
                    )
                    for i, arr in enumerate(pool.imap(_decode_job, jobs, chunksize=8), start=start):
                        images[i] = arr
                        bar.update()
                        if (i + 1) % 256 == 0 or i + 1 == n:  # checkpoint the progress for a resume
                            images.flush()
                            state["done"][split] = i + 1
                            _write_json(partial / "progress.json", state)
                    bar.close()
                    del images
        write_manifest(partial, params, {split: sizes[split][0] for split in _SPLITS}, record)
        (partial / "progress.json").unlink()
        if cache_dir.exists():  # a stale cache: move it aside, swap in the new one, then delete the old
            stale = parent / f"{cache_dir.name}.stale-{os.getpid()}"
            os.replace(cache_dir, stale)
            os.replace(partial, cache_dir)
            shutil.rmtree(stale)
        else:
            os.replace(partial, cache_dir)
    return cache_dir


def _build_jpeg(
    partial: Path,
    train_index: FileIndex,
    val_index: FileIndex | None,
    cache_size: int,
    quality: int,
    processes: int,
    progress: bool,
) -> None:
    """Re-encode each split once into ``partial/<split>.h5`` (shorter side ``cache_size``, JPEG ``quality``).

    Each file is written atomically by the converter, so a rerun keeps a split that is already there.
    """
    for split, index in (("train", train_index), ("val", val_index)):
        dst = partial / f"{split}.h5"
        if index is not None and not dst.exists():
            convert_folder_to_hdf5(
                index, dst, max_side=cache_size, quality=quality, processes=processes, progress=progress
            )


def open_jpeg_cache(cache_dir: str | os.PathLike[str], split: Literal["train", "val"]) -> str | None:
    """Validate a ``storage="jpeg"`` cache and return the HDF5 file of ``split`` (``None``: the split is empty).

    Raises:
        FileNotFoundError: If there is no complete cache, or it is not a JPEG cache.
        OSError: If the split's file is missing.
    """
    cache_dir = Path(cache_dir)
    manifest = _read_manifest(cache_dir)
    if manifest is None or manifest["params"].get("storage") != "jpeg":
        raise FileNotFoundError(
            f"No complete JPEG tensor cache in {str(cache_dir)!r}; build it with TensorCacheDataModule("
            "storage='jpeg').prepare_data() (the Trainer calls it)."
        )
    if manifest["counts"][split] == 0:
        return None
    path = cache_dir / f"{split}.h5"
    if not path.exists():
        raise OSError(f"{str(path)!r} is missing from the cache; delete {str(cache_dir)!r} to rebuild it.")
    return str(path)


def open_tensor_cache(cache_dir: str | os.PathLike[str], split: Literal["train", "val"]) -> tuple[str, np.ndarray]:
    """Validate ``cache_dir`` and return ``(images_path, labels)`` of ``split``.

    Raises:
        FileNotFoundError: If there is no complete cache.
        OSError: If an array file is missing, truncated or does not match the manifest.
        ValueError: If the cache format is newer than this package.
    """
    cache_dir = Path(cache_dir)
    manifest = _read_manifest(cache_dir)
    if manifest is None:
        raise FileNotFoundError(
            f"No complete tensor cache in {str(cache_dir)!r}; build it with TensorCacheDataModule.prepare_data() "
            "(the Trainer calls it)."
        )
    path = cache_dir / f"{split}_images.npy"
    try:
        images = np.load(path, mmap_mode="r")
        labels = np.load(cache_dir / f"{split}_labels.npy")
    except (OSError, ValueError) as err:
        raise OSError(
            f"Tensor cache file in {str(cache_dir)!r} is missing, truncated or corrupt ({err}); delete "
            f"{str(cache_dir)!r} to rebuild the cache."
        ) from err
    count = manifest["counts"][split]
    if images.dtype != np.uint8 or images.ndim != 4 or len(images) != count or len(labels) != count:
        raise OSError(
            f"{str(path)!r} does not match the manifest ({count} images expected, found shape {images.shape}); "
            f"delete {str(cache_dir)!r} to rebuild the cache."
        )
    return str(path), labels


class TensorCacheDataset(AugmentedImageDataset):
    """Samples of one split of a tensor cache, read by memory map, augmented without any decode.

    Training crops (``RandomResizedCrop`` + flip, per-sample randomness from ``(seed, epoch, index)``) are
    taken from the cached squares either here, in the workers (``augment_on="workers"``, uint8 resize), or on
    the training device after transfer (``augment_on="device"``: the batch is the whole cached squares plus
    the crop boxes and flips, cropped by the DataModule's ``on_after_batch_transfer`` in one batched op).

    Args:
        images_path: The split's ``*_images.npy``.
        labels: The split's labels.
        classes: Class names.
        train: Random crops if ``True``; stored validation crops (already at ``image_size``) if ``False``.
        image_size: Side of the output.
        augment_on: ``"workers"`` or ``"device"``.
        scale: Area range of the random crop.
        ratio: Aspect-ratio range of the random crop.
        seed: Seed of the per-sample augmentation.
    """

    def __init__(
        self,
        images_path: str,
        labels: np.ndarray,
        classes: Sequence[str],
        train: bool = True,
        image_size: int = 224,
        augment_on: Literal["workers", "device"] = "workers",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        seed: int = 0,
    ) -> None:
        # Validation crops were made at build time, so here they are only copied (crop_fraction 1, same size).
        super().__init__(train, image_size, scale, ratio, crop_fraction=1.0, seed=seed)
        if augment_on not in ("workers", "device"):
            raise ValueError(f"augment_on should be 'workers' or 'device', got {augment_on!r}.")
        self.images_path = images_path
        self._labels = np.asarray(labels, dtype=np.int64)
        self.classes = tuple(classes)
        self.augment_on = augment_on
        self._signature = MappedFile.signature(images_path)
        self._images: np.ndarray | None = None
        self._mapped: MappedFile | None = None

    per_process_attrs = ("_images", "_mapped")

    @property
    def targets(self) -> np.ndarray:
        """Labels of the split."""
        return self._labels

    def describe(self, index: int) -> str:
        """``file[index]``."""
        return f"{self.images_path}[{index}]"

    def _array(self) -> np.ndarray:
        """This process's memory map, after checking that the file was not changed under it (one ``fstat``)."""
        if not self._handles_open():
            self._mapped = MappedFile(self.images_path, self._signature, "Tensor cache file")
            self._images = np.load(self.images_path, mmap_mode="r")
            self._mark_handles_open()
        else:
            assert self._mapped is not None
            self._mapped.check()
        return self._images  # type: ignore[return-value]

    def read_sources(self, indices: np.ndarray) -> list[Source]:
        """One sorted gather from the memory map."""
        return list(gather_hwc(self._array().__getitem__, indices))

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """Batches; with ``augment_on="device"`` in training: ``(squares, labels, boxes, flips)``."""
        if not (self.train and self.augment_on == "device"):
            return super().__getitems__(keys)
        plans = [self._plan(key) for key in keys]
        indices = np.fromiter((index for index, _ in plans), dtype=np.int64, count=len(plans))
        sources = gather_hwc(self._array().__getitem__, indices)
        side = int(sources[0].shape[-1])
        images = empty_image_batch(len(keys), side, side)
        boxes = torch.empty((len(keys), 4), dtype=torch.int64)
        flips = torch.empty(len(keys), dtype=torch.bool)
        for slot, ((_, rng), source) in enumerate(zip(plans, sources)):
            assert rng is not None
            # Same draws, in the same order, as the workers path (AugmentedImageDataset._render).
            flips[slot] = bool(rng.random() < 0.5)
            boxes[slot] = torch.tensor(random_resized_crop_box(rng, side, side, self.scale, self.ratio))
            images[slot].copy_(source)
        return images, torch.from_numpy(self._labels[indices]), boxes, flips
