"""What the doctor learns before it times anything: the data (listing, a sample's statistics) and the storage."""

from __future__ import annotations

import errno
import io
import os
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.datasets.hdf5_file import HDF5Layout, inspect_hdf5, open_hdf5
from lightning_fastdata.errors import AccessError, DataError
from lightning_fastdata.loading.index.files import FileIndex, scan_image_folder
from lightning_fastdata.measure import decode_ceiling

__all__ = [
    "PERCENTILES",
    "DataProbe",
    "FolderSample",
    "one_core_decode_ceiling",
    "permission_error",
    "probe_folder",
    "probe_hdf5",
    "sample_stats",
    "too_few_error",
]

PERCENTILES = (5, 25, 50, 75, 95)


@dataclass
class DataProbe:
    """The data as the doctor found it: counts, a sample's distributions, storage rates, one-core ceilings.

    Distributions are percentiles of the sample (``{"p5": ..., "p50": ..., "p95": ...}``).

    Attributes:
        kind: ``"folder"``, ``"bucket"`` or ``"hdf5"``.
        files: Images in the data.
        classes: Classes in the data.
        sampled: Images decoded for the figures below.
        formats: Sampled files per image format.
        mean_kb: Mean encoded size of a sampled image.
        median_resolution: Median ``(width, height)`` of the sample.
        size_kb: Distribution of the encoded sizes.
        shorter_side: Distribution of the images' shorter sides, in pixels.
        smaller_than_crop: Sampled images whose shorter side is below the output size.
        corrupt: Sampled files that do not decode.
        unreadable: Sampled files that cannot be read (permissions).
        data_gb: The whole data's size.
        read_mb_s_warm: Read rate from the page cache (or, from a bucket, with requests in flight).
        read_mb_s_cold: Read rate of data not cached (or one request at a time from a bucket).
        scan_s: Time the listing took.
        decode_ceiling_1core: One core's read + full decode rate, images/s.
        memcpy_ceiling_1core: One core copying cached samples, images/s (once a raw cache of the sample exists).
        request_ms: From a bucket, the time of one request at a time.
    """

    kind: str
    files: int
    classes: int
    sampled: int
    formats: dict[str, int]
    mean_kb: float
    median_resolution: tuple[int, int]
    size_kb: dict[str, float]
    shorter_side: dict[str, float]
    smaller_than_crop: int
    corrupt: list[str]
    unreadable: list[str]
    data_gb: float
    read_mb_s_warm: float
    read_mb_s_cold: float
    scan_s: float
    decode_ceiling_1core: float = float("nan")
    memcpy_ceiling_1core: float = float("nan")  # set once a raw cache of the sample exists (see options)
    request_ms: float = float("nan")  # a bucket: one request at a time, per request


@dataclass
class FolderSample:
    """The sampled files of a folder that decode: their rows in the index, and their paths."""

    index: FileIndex
    rows: np.ndarray
    paths: list[str] = field(default_factory=list)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """``{"p5": ..., "p95": ...}`` of ``values`` (NaN when empty)."""
    if not values:
        return {f"p{q}": float("nan") for q in PERCENTILES}
    return {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}


def read_rate(paths: list[str], evict: bool, limit: int | None = None) -> float:
    """MB/s reading ``paths``, at most ``limit`` bytes of each.

    With ``evict``, the kernel is first asked to drop the files from the page cache. ``POSIX_FADV_DONTNEED`` is a
    hint about our own reads: it changes no file (and drops no dirty page).
    """
    if evict:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    start, total = time.perf_counter(), 0
    for p in paths:
        with open(p, "rb") as fh:
            total += len(fh.read(-1 if limit is None else limit))
    return total / 1e6 / max(time.perf_counter() - start, 1e-9)


def permission_error(path: str, err: OSError) -> OSError:
    """Name the file and the fix for a permission error met while listing or reading the data."""
    if isinstance(err, PermissionError):
        return AccessError(
            f"No permission to read {err.filename or path!r} (under {path!r}). Run the doctor as the user that trains, "
            "or make the data readable (e.g. chmod -R a+rX on it)."
        )
    return err


def sample_stats(blobs: Iterator[tuple[str, bytes | None]], image_size: int) -> tuple[dict[str, Any], list, list]:
    """Formats, size and resolution distributions of the sampled images; corrupt and unreadable ones by name."""
    formats: Counter[str] = Counter()
    sizes, resolutions, corrupt, unreadable = [], [], [], []
    for name, data in blobs:
        if data is None:
            unreadable.append(name)
            continue
        sizes.append(len(data) / 1e3)
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.convert("RGB")  # a full decode: a truncated or corrupt file fails here
                formats[(img.format or "?").lower()] += 1
                resolutions.append(img.size)
        except Exception:  # PIL raises several types for broken files
            corrupt.append(name)
    res = sorted(resolutions)
    shorter = [min(r) for r in resolutions]
    stats = {
        "formats": dict(formats),
        "mean_kb": statistics.mean(sizes) if sizes else float("nan"),
        "median_resolution": res[len(res) // 2] if res else (0, 0),
        "size_kb": percentiles(sizes),
        "shorter_side": percentiles(shorter),
        "smaller_than_crop": sum(s < image_size for s in shorter),
    }
    return stats, corrupt, unreadable


def _read_files(paths: list[str]) -> Iterator[tuple[str, bytes | None]]:
    for p in paths:
        try:
            with open(p, "rb") as fh:
                yield p, fh.read()
        except PermissionError:
            yield p, None


def one_core_decode_ceiling(paths: Sequence[str]) -> float:
    """Images/s of one core reading and fully decoding (up to 64 of) ``paths``; torch's threads are restored."""
    threads = torch.get_num_threads()
    try:
        return max(decode_ceiling(list(paths[:64])).values())  # it sets torch's threads to 1 meanwhile
    finally:
        torch.set_num_threads(threads)


def too_few_error(path: str, sampled: int, corrupt: list[str], unreadable: list[str]) -> OSError:
    """The error when too few sampled images could be read and decoded (their names, and what to do)."""
    if unreadable and len(unreadable) >= len(corrupt):
        return permission_error(path, PermissionError(errno.EACCES, "Permission denied", unreadable[0]))
    return DataError(
        f"{len(corrupt)} of the {sampled} sampled images in {path!r} are corrupt (e.g. {corrupt[0]!r}); "
        "too few decode to measure anything. Check the files."
    )


def probe_folder(root: str, image_size: int, sample: int) -> tuple[DataProbe, FolderSample]:
    """List ``root``, read and decode a sample, time the storage (warm and cold) and one core's full decode.

    Raises:
        OSError: If fewer than 4 sampled images decode (``PermissionError`` if most could not be read).
    """
    start = time.perf_counter()
    index = scan_image_folder(root)
    scan_s = time.perf_counter() - start
    n = len(index)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(sample, n), replace=False))
    paths = [index.path(int(i)) for i in rows]
    stats, corrupt, unreadable = sample_stats(_read_files(paths), image_size)
    bad = set(corrupt) | set(unreadable)
    good_rows = np.array([i for i, p in zip(rows, paths) if p not in bad], dtype=np.int64)
    good = [p for p in paths if p not in bad]
    if len(good) < 4:
        raise too_few_error(root, len(paths), corrupt, unreadable)
    ceiling = one_core_decode_ceiling(good)
    probe = DataProbe(
        kind="folder",
        files=n,
        classes=len(index.classes),
        sampled=len(paths),
        corrupt=corrupt,
        unreadable=unreadable,
        data_gb=stats["mean_kb"] * n / 1e6,
        read_mb_s_warm=read_rate(good, evict=False),
        read_mb_s_cold=read_rate(good, evict=True),
        scan_s=scan_s,
        decode_ceiling_1core=ceiling,
        **stats,
    )
    return probe, FolderSample(index, good_rows, good)


def _hdf5_blobs(layout: HDF5Layout, rows: np.ndarray) -> Iterator[tuple[str, bytes | None]]:
    with open_hdf5(layout.path) as f:
        images = f[layout.images_key]
        for i in rows:
            if layout.offsets is not None:
                data = images[int(layout.offsets[i]) : int(layout.offsets[i + 1])]
            else:
                data = images[int(i)]
            yield f"{layout.path}[{int(i)}]", np.asarray(data, dtype=np.uint8).tobytes()


def probe_hdf5(path: str, image_size: int, sample: int) -> tuple[DataProbe, HDF5Layout]:
    """Inspect the HDF5 file, decode a sample of encoded images (or read the array's shape), time the storage.

    Raises:
        ValueError: If ``path`` is not an HDF5 file of images (named).
        OSError: If fewer than 4 sampled images decode.
    """
    start = time.perf_counter()
    layout = inspect_hdf5(path)  # raises naming the file if it is not an HDF5 file of images
    scan_s = time.perf_counter() - start
    n = len(layout.labels)
    size = os.path.getsize(path)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(sample, n), replace=False))
    corrupt: list[str] = []
    unreadable: list[str] = []
    if layout.kind == "encoded":
        stats, corrupt, unreadable = sample_stats(_hdf5_blobs(layout, rows), image_size)
        if len(corrupt) > len(rows) - 4:
            raise too_few_error(path, len(rows), corrupt, unreadable)
    else:
        h, w = layout.shape[1:3] if layout.kind == "hwc" else layout.shape[2:4]
        side = float(min(h, w))
        stats = {
            "formats": {f"{layout.kind} {layout.dtype}": n},
            "mean_kb": size / n / 1e3,
            "median_resolution": (w, h),
            "size_kb": {f"p{q}": size / n / 1e3 for q in PERCENTILES},
            "shorter_side": {f"p{q}": side for q in PERCENTILES},
            "smaller_than_crop": len(rows) if side < image_size else 0,
        }
    limit = min(size, 256 << 20)  # a bounded read: the file may be far bigger than RAM
    probe = DataProbe(
        kind="hdf5",
        files=n,
        classes=len(layout.classes),
        sampled=len(rows),
        corrupt=corrupt,
        unreadable=unreadable,
        data_gb=size / 1e9,
        read_mb_s_warm=read_rate([path], evict=False, limit=limit),
        read_mb_s_cold=read_rate([path], evict=True, limit=limit),
        scan_s=scan_s,
        **stats,
    )
    return probe, layout
