"""``fastdata doctor``: measure a user's own data and machine, and say (and write) the fastest setup.

Read-only on the data: it lists the folder (or inspects the HDF5 file), samples files, and builds everything it
times (a folder of symlinks to the sample, HDF5 files and caches of it) in a temporary directory it removes. The
options are measured on the sample with the same harness as ``fastdata bench``, pinned to one rank's share of the
CPUs, at the worker count each rank would get; the recommended one again at other worker counts. Only sizes and
build times are scaled to the whole data set, and an option whose data do not fit in RAM is capped at the rate the
storage reads them cold.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.datamodules.cache import TensorCacheDataModule
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.datamodules.hdf5 import HDF5DataModule
from lightning_fastdata.datasets.convert import convert_folder_to_hdf5
from lightning_fastdata.datasets.hdf5 import HDF5Layout, inspect_hdf5, open_hdf5
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.loading.decode import pillow_simd_installed, roi_decode_available
from lightning_fastdata.loading.index import contains_path, scan_image_folder
from lightning_fastdata.loading.workers import CpuBudget, resolve_num_workers
from lightning_fastdata.measure import baseline_loader, count_images, decode_ceiling, memcpy_ceiling, time_loader

__all__ = ["DoctorReport", "Option", "as_dict", "doctor", "main", "write_config"]

PERCENTILES = (5, 25, 50, 75, 95)
INDEX_DIR_FILES = 100_000  # from here on the written config keeps the file list (index_dir): 1.28M files take ~2 s


@dataclass
class Option:
    """One way to load the data, measured on the sample.

    ``images_per_s`` is the warm rate measured per rank; ``expected_per_s`` is what a rank can expect on the whole
    data set (the same, unless the option's data do not fit in RAM: then at most what the storage reads cold,
    shared by the node's ranks). ``prepare`` is the command to run once before training ("" if none).
    """

    name: str
    images_per_s: float
    vs_baseline: float
    kb_per_image: float
    dataset_gb: float
    build_s: float
    config: dict[str, Any] = field(default_factory=dict)
    expected_per_s: float = 0.0
    prepare: str = ""


@dataclass
class DoctorReport:
    """What ``fastdata doctor`` found and recommends (``lightning_fastdata.doctor(...)`` returns it).

    The distributions are percentiles of the sample (``{"p5": ..., "p50": ..., "p95": ...}``); ``worker_sweep``
    maps a worker count to the recommended option's images/s per rank.
    """

    path: str
    kind: str
    files: int
    classes: int
    formats: dict[str, int]
    sampled: int
    mean_kb: float
    median_resolution: tuple[int, int]
    size_kb: dict[str, float]
    shorter_side: dict[str, float]
    smaller_than_crop: int
    corrupt: list[str]
    unreadable: list[str]
    usable_cpus: int
    gpus: int
    devices: int
    workers_per_rank: int
    ram_gb: float
    data_gb: float
    scratch_free_gb: float
    shm_gb: float
    roi_decoder: bool
    pillow_simd: bool
    read_mb_s_warm: float
    read_mb_s_cold: float
    decode_ceiling_1core: float
    memcpy_ceiling_1core: float
    options: list[Option]
    worker_sweep: dict[int, float]
    recommendation: str
    reason: str
    expected_wait_fraction: float | None
    scan_s: float
    seconds: float

    def table(self) -> str:
        """The options as a Markdown table."""
        lines = [
            "| option | images/s per rank | vs baseline | whole data set, per rank | KB per image | size | build |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for o in self.options:
            build = _duration(o.build_s) if o.build_s else "-"
            lines.append(
                f"| {o.name} | {o.images_per_s:.0f} | {o.vs_baseline:.2f}x | {o.expected_per_s:.0f} | "
                f"{o.kb_per_image:.0f} | {o.dataset_gb:.1f} GB | {build} |"
            )
        return "\n".join(lines)


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.0f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def _ram_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {f"p{q}": float("nan") for q in PERCENTILES}
    return {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}


def _read_rate(paths: list[str], evict: bool, limit: int | None = None) -> float:
    """MB/s reading ``paths``, at most ``limit`` bytes of each.

    With ``evict``, the kernel is first asked to drop the files from the page cache.

    ``POSIX_FADV_DONTNEED`` is a hint about our own reads: it changes no file (and drops no dirty page).
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


class _Budget:
    """Shares what is left of ``seconds`` among the timed runs still to come (builds and ceilings use it up too).

    A run takes longer than the time it is given: a warm-up batch, worker start-up and the end of the pass under
    way (a pass over 256 photos at 200 images/s is 1.3 s). The largest such overrun so far is kept back from each
    later run's share, so the whole stays near the budget.
    """

    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds
        self.overrun = 0.0

    def time(self, make: Callable[[], Any], runs_left: int) -> float:
        """Images/s of ``make()``'s loader, given its share of the time left."""
        given = max(0.3, (self.deadline - time.perf_counter()) / max(1, runs_left) - self.overrun)
        start = time.perf_counter()
        rate = time_loader(make, count_images, warmup=1, min_seconds=given)
        self.overrun = max(self.overrun, time.perf_counter() - start - given)
        return rate


@contextlib.contextmanager
def _rank_share(cpus: int) -> Iterator[None]:
    """Pin this process (and so the loader workers it starts) to one rank's share of the CPUs while timing.

    With ``--devices 8`` on 16 CPUs a rank's loader gets 2 CPUs in training; timing it alone on all 16 would
    overstate it.
    """
    if not hasattr(os, "sched_getaffinity"):
        yield
        return
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    if cpus >= len(before):
        yield
        return
    os.sched_setaffinity(0, sorted(before)[:cpus])
    # more intra-op threads than CPUs spin against each other (0 workers ran 10x slower on 1 CPU with 2 threads)
    torch.set_num_threads(min(threads, cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def _sweep_counts(share: int, workers: int) -> list[int]:
    """Worker counts to try for one rank with ``share`` CPUs: none, a few, the per-rank count, one per CPU."""
    counts = {1, max(1, share // 2), workers, share}
    if share <= 2:
        counts.add(0)
    return sorted(counts)


def _sample_folder(index: Any, rows: np.ndarray, scratch: Path) -> Path:
    """A folder of symlinks to the sampled files in the scratch directory (never in the data).

    Only the sampled classes get a folder: 256 files of 1,000 classes make a folder of 256 images, not of 1,000.
    """
    root = scratch / "sample"
    for k, i in enumerate(rows):
        folder = root / index.classes[int(index.labels[i])]
        folder.mkdir(parents=True, exist_ok=True)
        src = index.path(int(i))
        (folder / f"{k:06d}{os.path.splitext(src)[1]}").symlink_to(os.path.abspath(src))
    return root


@contextlib.contextmanager
def _scratch(scratch_dir: str | None) -> Iterator[Path]:
    """A temporary directory for the sample's caches; a clear error if it cannot be made (read-only, no room)."""
    where = scratch_dir if scratch_dir is not None else tempfile.gettempdir()
    try:
        tmp = tempfile.TemporaryDirectory(prefix="fastdata-doctor-", dir=scratch_dir)
    except OSError as err:
        reason = "read-only file system" if err.errno == errno.EROFS else (err.strerror or str(err))
        raise OSError(
            f"Cannot create a scratch directory in {where!r} ({reason}): the doctor builds the sample's caches there "
            "and removes them. Pass --scratch-dir DIR (scratch_dir=) or set TMPDIR to a writable local directory."
        ) from err
    with tmp as name:
        yield Path(name)


def _probe(path: str, err: OSError) -> OSError:
    """Name the file and the fix for a permission error met while listing or reading the data."""
    if isinstance(err, PermissionError):
        return PermissionError(
            f"No permission to read {err.filename or path!r} (under {path!r}). Run the doctor as the user that trains, "
            "or make the data readable (e.g. chmod -R a+rX on it)."
        )
    return err


@dataclass
class _Candidate:
    """An option to time: its train loader for a worker count, and what building it for the sample cost."""

    name: str
    make: Callable[[int], Any]
    kb_per_image: float
    build_s_per_image: float
    config: dict[str, Any]
    prepare: str = ""


class _Held:
    """A DataModule's train loader that keeps the DataModule alive while it is timed."""

    def __init__(self, dm: Any, prepare: bool = False) -> None:
        if prepare:
            dm.prepare_data()
        dm.setup("fit")
        self.dm, self.loader = dm, dm.train_dataloader()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def _held(cls: type, path: str, kwargs: dict[str, Any], num_workers: int) -> _Held:
    """``cls(path, num_workers=..., **kwargs)``'s train loader; a cache is built (or found current) first."""
    return _Held(cls(path, num_workers=num_workers, **kwargs), prepare=cls is TensorCacheDataModule)


def doctor(
    path: str,
    devices: int = 1,
    batch_size: int = 64,
    image_size: int = 224,
    seconds: float = 60.0,
    step_ms: float | None = None,
    sample: int = 256,
    scratch_dir: str | None = None,
) -> DoctorReport:
    """Measure ``path`` (an image folder or an HDF5 file) on this machine and recommend a DataModule.

    Not for use from several threads at once: while it times, it pins this whole process (CPU affinity and
    torch's intra-op threads) to one rank's share of the CPUs, and restores both afterwards.

    Args:
        path: Image folder (``root/<class>/<image>``) or HDF5 file.
        devices: Training processes per node (each rank gets ``usable CPUs / devices`` CPUs, and the timed runs
            are pinned to that many).
        batch_size: Batch size per rank.
        image_size: Training crop side.
        seconds: Time budget of the measurements, builds of the sample's caches included (the listing comes on
            top).
        step_ms: Your model's step time without data wait, if known: gives the expected wait fraction.
        sample: Files sampled for statistics and timed runs.
        scratch_dir: Where to build the sample's caches (a temporary directory in it, removed afterwards);
            default: the system's temporary directory (``TMPDIR``).

    Raises:
        FileNotFoundError: If ``path`` does not exist, is an empty folder or holds no class folder.
        PermissionError: If the data cannot be listed or read (the message names the file).
        OSError: If the scratch directory cannot be created, or too many sampled files are corrupt.
        ValueError: If a file is not an HDF5 file, or an argument is impossible.
    """
    start_all = time.perf_counter()
    if devices < 1 or batch_size < 1 or image_size < 8 or seconds <= 0 or sample < 8:
        raise ValueError(
            f"Impossible arguments: devices={devices}, batch_size={batch_size}, image_size={image_size}, "
            f"seconds={seconds}, sample={sample} (need devices, batch_size >= 1, image_size >= 8, seconds > 0, "
            "sample >= 8)."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path!r} does not exist. Pass an image folder (root/<class>/<image>) or an HDF5 file."
        )
    cpus = CpuBudget.detect()
    usable = cpus.usable
    share = max(1, usable // devices)
    workers = resolve_num_workers("auto", devices, cpus)  # what each rank gets in training
    ram = _ram_gb()
    budget = _Budget(seconds)
    with _scratch(scratch_dir) as scratch:
        try:
            if os.path.isdir(path):
                data, candidates = _folder(path, scratch, usable, batch_size, image_size, sample)
            else:
                data, candidates = _hdf5(path, batch_size, image_size, sample)
        except PermissionError as err:
            raise _probe(path, err) from err
        budget.deadline += data["scan_s"]  # the listing comes on top of the budget
        n = data["files"]
        sweep = _sweep_counts(share, workers)
        options: list[Option] = []
        with _rank_share(share):
            for k, cand in enumerate(candidates):
                runs_left = len(candidates) - k + len(sweep) - 1
                rate = budget.time(functools.partial(cand.make, workers), runs_left)
                options.append(
                    Option(
                        name=cand.name,
                        images_per_s=rate,
                        vs_baseline=float("nan"),
                        kb_per_image=cand.kb_per_image,
                        dataset_gb=cand.kb_per_image * n / 1e6,
                        build_s=cand.build_s_per_image * n,
                        config=cand.config,
                        prepare=cand.prepare,
                    )
                )
            base = options[0].images_per_s if options[0].name.endswith("(baseline)") else float("nan")
            cold_mb_s = data["read_mb_s_cold"]
            for o in options:
                o.vs_baseline = o.images_per_s / base
                o.expected_per_s = _expected(o.images_per_s, o.dataset_gb, o.kb_per_image, ram, cold_mb_s, devices)
            free = shutil.disk_usage(scratch).free / 1e9
            recommendation, reason = _verdict(options, data["data_gb"], ram, free, batch_size, step_ms, workers > 0)
            chosen = next(o for o in options if o.name == recommendation)
            make = next(c.make for c in candidates if c.name == recommendation)
            rates = {workers: chosen.images_per_s}
            for k, w in enumerate(c for c in sweep if c != workers):
                rates[w] = budget.time(functools.partial(make, w), len(sweep) - 1 - k)
    # chosen from 1 .. share - 1: 0 loads in the training process, serial with the step, and a worker on every
    # CPU leaves none for the training step (the timed loader alone does not show that cost)
    eligible = [w for w in rates if 1 <= w <= max(1, share - 1)]
    # the storage's cap, if the data exceed RAM, holds at any worker count
    cap = chosen.expected_per_s if chosen.expected_per_s < chosen.images_per_s else float("inf")

    def wait_at(w: int) -> float:
        return _wait(min(rates[w], cap), batch_size, step_ms, overlapped=w > 0) or 0.0

    best_w = max(eligible, key=lambda w: rates[w], default=workers)
    if step_ms is not None and eligible:  # the least wait; the faster on a tie
        best_w = min(eligible, key=lambda w: (round(wait_at(w), 2), -rates[w]))
        better = wait_at(best_w) < wait_at(workers) - 0.02
    else:
        better = rates[best_w] > 1.1 * rates[workers]  # beyond the noise of a short run
    num_workers = workers
    if best_w != workers and better:
        num_workers = best_w
        chosen.config["init_args"]["num_workers"] = best_w
        reason += (
            f"; {best_w} worker{'s' if best_w > 1 else ''} per rank measured {rates[best_w]:.0f} images/s against "
            f"{rates[workers]:.0f} with num_workers='auto' ({workers}), so the config sets num_workers={best_w}"
        )
    shm = shutil.disk_usage("/dev/shm").total / 1e9 if os.path.isdir("/dev/shm") else 0.0
    return DoctorReport(
        path=os.path.abspath(path),
        usable_cpus=usable,
        gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        devices=devices,
        workers_per_rank=workers,
        ram_gb=ram,
        scratch_free_gb=free,
        shm_gb=shm,
        roi_decoder=roi_decode_available(),
        pillow_simd=pillow_simd_installed(),
        options=options,
        worker_sweep=dict(sorted(rates.items())),
        recommendation=recommendation,
        reason=reason,
        expected_wait_fraction=_wait(min(rates[num_workers], cap), batch_size, step_ms, num_workers > 0),
        seconds=time.perf_counter() - start_all,
        **data,
    )


def _expected(rate: float, dataset_gb: float, kb: float, ram_gb: float, cold_mb_s: float, devices: int) -> float:
    """A rank's rate on the whole data set: the measured (warm) rate, unless the data cannot stay in the page cache.

    Then every epoch reads them from storage, shared by the node's ``devices`` ranks, at most at the cold rate.
    """
    if dataset_gb <= 0.8 * ram_gb or not np.isfinite(cold_mb_s):
        return rate
    return min(rate, cold_mb_s * 1e3 / kb / devices)


def _sample_stats(
    blobs: Iterator[tuple[str, bytes | None]], image_size: int
) -> tuple[dict[str, Any], list[str], list[str]]:
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
        "size_kb": _percentiles(sizes),
        "shorter_side": _percentiles(shorter),
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


def _too_few(path: str, sampled: int, corrupt: list[str], unreadable: list[str]) -> OSError:
    if unreadable and len(unreadable) >= len(corrupt):
        return _probe(path, PermissionError(errno.EACCES, "Permission denied", unreadable[0]))
    return OSError(
        f"{len(corrupt)} of the {sampled} sampled images in {path!r} are corrupt (e.g. {corrupt[0]!r}); "
        "too few decode to measure anything. Check the files."
    )


def _folder(
    root: str, scratch: Path, processes: int, batch_size: int, image_size: int, sample: int
) -> tuple[dict[str, Any], list[_Candidate]]:
    start = time.perf_counter()
    index = scan_image_folder(root)
    scan_s = time.perf_counter() - start
    n = len(index)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    paths = [index.path(int(i)) for i in rows]
    stats, corrupt, unreadable = _sample_stats(_read_files(paths), image_size)
    bad = set(corrupt) | set(unreadable)
    good_rows = np.array([i for i, p in zip(rows, paths) if p not in bad], dtype=np.int64)
    good = [p for p in paths if p not in bad]
    if len(good) < 4:
        raise _too_few(root, len(paths), corrupt, unreadable)
    warm = _read_rate(good, evict=False)
    cold = _read_rate(good, evict=True)
    threads = torch.get_num_threads()
    try:
        ceiling = max(decode_ceiling(good[:64]).values())  # one core: it sets torch's threads to 1 meanwhile
    finally:
        torch.set_num_threads(threads)
    sample_root = str(_sample_folder(index, good_rows, scratch))
    batch = max(1, min(batch_size, len(good) // 4))
    kw: dict[str, Any] = dict(image_size=image_size, batch_size=batch, val_fraction=0.0)
    side = max(image_size, round(image_size * 256 / 224))  # what a 224 crop of a 256 resize keeps
    name = os.path.basename(os.path.abspath(root))
    mean_kb = stats["mean_kb"]
    src = os.path.abspath(root)
    candidates = [
        _Candidate(
            "torchvision ImageFolder (baseline)",
            lambda w: baseline_loader(sample_root, image_size, batch, w),
            mean_kb,
            0.0,
            {},
        ),
        _Candidate(
            "ImageFolderDataModule",
            functools.partial(_held, ImageFolderDataModule, sample_root, kw),
            mean_kb,
            0.0,
            {"class_path": "lightning_fastdata.ImageFolderDataModule", "init_args": {"root": src}},
        ),
    ]
    hdf5s: list[tuple[str, str, dict[str, Any]]] = [
        ("HDF5DataModule (original JPEG bytes)", f"{name}.h5", {"mode": "encoded"}),
        (f"HDF5DataModule (JPEG, shorter side {side})", f"{name}-{side}.h5", {"mode": "encoded", "max_side": side}),
        (f"HDF5DataModule (raw {side} px)", f"{name}-raw{side}.h5", {"mode": "raw", "size": side}),
    ]
    for label, file, args in hdf5s:
        h5 = scratch / file
        start = time.perf_counter()
        convert_folder_to_hdf5(sample_root, h5, processes=processes, progress=False, **args)
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in args.items())
        candidates.append(
            _Candidate(
                label,
                functools.partial(_held, HDF5DataModule, str(h5), kw),
                h5.stat().st_size / len(good) / 1e3,
                (time.perf_counter() - start) / len(good),
                {"class_path": "lightning_fastdata.HDF5DataModule", "init_args": {"path": f"cache/{file}"}},
                prepare=f"fastdata convert hdf5 --src {src} --dst cache/{file} {flags}",
            )
        )
    memcpy = float("nan")
    storages: tuple[Literal["jpeg", "raw"], ...] = ("jpeg", "raw")
    for storage in storages:
        cache_dir = scratch / f"cache-{storage}"
        args = dict(cache_size=side, storage=storage, build_processes=processes)
        start = time.perf_counter()
        TensorCacheDataModule(sample_root, str(cache_dir), num_workers=0, **kw, **args).prepare_data()
        candidates.append(
            _Candidate(
                f"TensorCacheDataModule(storage='{storage}')",
                functools.partial(
                    _held, TensorCacheDataModule, sample_root, {"cache_dir": str(cache_dir), **kw, **args}
                ),
                # per image: the images and labels, not the manifest (its folder record grows with the folders)
                sum(f.stat().st_size for f in cache_dir.iterdir() if f.name != "manifest.json") / len(good) / 1e3,
                (time.perf_counter() - start) / len(good),
                {
                    "class_path": "lightning_fastdata.TensorCacheDataModule",
                    "init_args": {
                        "root": src,
                        # a local disk with room for it (see the report): never inside the data folder
                        "cache_dir": f"cache/{name}-{storage}{side}",
                        "cache_size": side,
                        **({"storage": "jpeg"} if storage == "jpeg" else {}),
                    },
                },
            )
        )
        if storage == "raw":
            images = np.load(cache_dir / "train_images.npy", mmap_mode="r")
            memcpy = memcpy_ceiling(np.asarray(images), min(batch, len(images)), image_size, 1)
    # simplest first, as the verdict prefers them; the baseline first of all
    order = [0, 1, 2, 3, 5, 4, 6]
    candidates = [candidates[i] for i in order]
    for cand in candidates:
        if cand.config:
            cand.config["init_args"].update(image_size=image_size, batch_size=batch_size, num_workers="auto")
        if n >= INDEX_DIR_FILES and "root" in cand.config.get("init_args", {}):
            # every rank lists the folder in setup(), every run: with index_dir, once per node, then reused
            cand.config["init_args"]["index_dir"] = "cache/index"
            if cand.config["class_path"].endswith("TensorCacheDataModule"):
                # each run checks the cache against its folders, not every file (1.28M files: 0.09 s, not 6.1 s)
                cand.config["init_args"]["verify_source"] = "folders"
    data = {
        "kind": "folder",
        "files": n,
        "classes": len(index.classes),
        "sampled": len(paths),
        **stats,
        "corrupt": corrupt,
        "unreadable": unreadable,
        "data_gb": mean_kb * n / 1e6,
        "read_mb_s_warm": warm,
        "read_mb_s_cold": cold,
        "decode_ceiling_1core": ceiling,
        "memcpy_ceiling_1core": memcpy,
        "scan_s": scan_s,
    }
    return data, candidates


def _hdf5_blobs(layout: HDF5Layout, rows: np.ndarray) -> Iterator[tuple[str, bytes | None]]:
    with open_hdf5(layout.path) as f:
        images = f[layout.images_key]
        offsets = f[layout.offsets_key][()] if layout.offsets_key else None
        for i in rows:
            if offsets is not None:
                data = images[int(offsets[i]) : int(offsets[i + 1])]
            else:
                data = images[int(i)]
            yield f"{layout.path}[{int(i)}]", np.asarray(data, dtype=np.uint8).tobytes()


def _hdf5(path: str, batch_size: int, image_size: int, sample: int) -> tuple[dict[str, Any], list[_Candidate]]:
    start = time.perf_counter()
    layout = inspect_hdf5(path)  # raises naming the file if it is not an HDF5 file of images
    scan_s = time.perf_counter() - start
    n = len(layout.labels)
    size = os.path.getsize(path)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(sample, n), replace=False))
    if layout.kind == "encoded":
        stats, corrupt, unreadable = _sample_stats(_hdf5_blobs(layout, rows), image_size)
        if len(corrupt) > len(rows) - 4:
            raise _too_few(path, len(rows), corrupt, unreadable)
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
        corrupt, unreadable = [], []
    limit = min(size, 256 << 20)  # a bounded read: the file may be far bigger than RAM
    warm = _read_rate([path], evict=False, limit=limit)
    cold = _read_rate([path], evict=True, limit=limit)
    batch = min(batch_size, max(1, n // 4))
    candidate = _Candidate(
        f"HDF5DataModule ({layout.kind})",
        functools.partial(_held, HDF5DataModule, path, {"image_size": image_size, "batch_size": batch}),
        size / n / 1e3,
        0.0,
        {
            "class_path": "lightning_fastdata.HDF5DataModule",
            "init_args": {
                "path": os.path.abspath(path),
                "image_size": image_size,
                "batch_size": batch_size,
                "num_workers": "auto",
            },
        },
    )
    data = {
        "kind": "hdf5",
        "files": n,
        "classes": len(layout.classes),
        "sampled": len(rows),
        **stats,
        "corrupt": corrupt,
        "unreadable": unreadable,
        "data_gb": size / 1e9,
        "read_mb_s_warm": warm,
        "read_mb_s_cold": cold,
        "decode_ceiling_1core": float("nan"),
        "memcpy_ceiling_1core": float("nan"),
        "scan_s": scan_s,
    }
    return data, [candidate]


def _wait(rate: float, batch_size: int, step_ms: float | None, overlapped: bool = True) -> float | None:
    """The fraction of a step spent waiting for data when loading runs at ``rate`` beside a ``step_ms`` step.

    With workers loading overlaps the step and only the excess is waited for; with ``num_workers=0`` (not
    ``overlapped``) every batch is loaded in the training process between steps.
    """
    if step_ms is None:
        return None
    load_ms = 1000 * batch_size / rate
    if not overlapped:
        return load_ms / (load_ms + step_ms)
    return max(0.0, (load_ms - step_ms) / load_ms)


def _verdict(
    options: list[Option],
    data_gb: float,
    ram_gb: float,
    free_gb: float,
    batch_size: int,
    step_ms: float | None,
    overlapped: bool = True,
) -> tuple[str, str]:
    """The one option to use and why: the simplest that keeps up at ``step_ms``, else the fastest that fits."""
    usable = [o for o in options if o.config]
    fits = [o for o in usable if not o.build_s or o.dataset_gb < 0.9 * free_gb] or usable[:1]
    ram_note = f"RAM {ram_gb:.0f} GB, free disk {free_gb:.0f} GB, whole data set {data_gb:.1f} GB"
    if step_ms is not None:
        enough = [o for o in fits if _wait(o.expected_per_s, batch_size, step_ms, overlapped) == 0.0]
        if enough:  # the simplest (least to build and store) that keeps the model busy
            best = min(enough, key=lambda o: (o.build_s, o.dataset_gb))
            need = 1000 * batch_size / step_ms
            built = f"{best.dataset_gb:.1f} GB to build once" if best.build_s else "nothing to build"
            return (
                best.name,
                f"the simplest option that keeps up ({built}): {best.expected_per_s:.0f} images/s per rank, the model "
                f"needs {need:.0f} at {step_ms:g} ms per step of {batch_size} ({ram_note})",
            )
    best = max(fits, key=lambda o: o.expected_per_s)
    why = f"the fastest option that fits this machine ({ram_note})"
    if best.expected_per_s < 0.9 * best.images_per_s:
        why += "; the data do not stay in RAM, so the storage's cold read rate limits it"
    if best.build_s:
        why += f"; it is built once ({best.dataset_gb:.1f} GB, ~{_duration(best.build_s)})"
    return best.name, why


def _check_config_path(data: str, config: str) -> None:
    """Refuse a config path inside the data folder, or on the HDF5 file itself: the doctor never writes there."""
    real, out = os.path.realpath(data), os.path.realpath(config)
    if (os.path.isdir(real) and contains_path(real, out)) or out == real:
        raise ValueError(
            f"Refusing to write the config {config!r} into the data {data!r}: the doctor never writes into your "
            "data. Pass --write-config a path outside it."
        )


def write_config(report: DoctorReport, path: str) -> Path:
    """A LightningCLI YAML with the recommended DataModule, runnable with ``fastdata fit --config PATH``."""
    import yaml

    option = next(o for o in report.options if o.name == report.recommendation)
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "auto",
            "devices": report.devices,
            "max_epochs": 90,
            "callbacks": [{"class_path": "lightning_fastdata.FastDataCallback"}],
        },
        "model": {"arch": "resnet50", "channels_last": True},
        "data": option.config,
    }
    header = (
        f"# Written by `fastdata doctor {report.path}`: {report.recommendation}, "
        f"{option.images_per_s:.0f} images/s per rank measured on a sample of {report.sampled}.\n"
        f"# Why: {report.reason}.\n"
    )
    if option.prepare:
        header += f"# First, once: {option.prepare}\n"
    if option.config["init_args"].get("verify_source") == "folders":
        header += (
            "# verify_source: folders checks the cache against the file list and its folders' mtimes at each run, "
            "not every file;\n# after rewriting images in place (same names), run once with verify_source: files.\n"
        )
    out = Path(path)
    _check_config_path(report.path, path)
    atomic_write_text(out, header + yaml.safe_dump(config, sort_keys=False))  # a reader never sees half a config
    return out


def _dist(d: dict[str, float], unit: str) -> str:
    return "/".join(f"{v:.0f}" for v in d.values()) + f" {unit} (p{'/p'.join(str(q) for q in PERCENTILES)})"


def main(argv: list[str] | None = None) -> DoctorReport:
    """``fastdata doctor``: print the report; ``--write-config`` writes the recommended config."""
    parser = argparse.ArgumentParser(
        prog="fastdata doctor",
        description="Measure your data and this machine (read-only), and recommend the fastest DataModule.",
        epilog="example: fastdata doctor data/train --devices 8 --step-ms 120 --write-config fast.yaml",
    )
    parser.add_argument("path", help="image folder (root/<class>/<image>) or HDF5 file")
    parser.add_argument("--devices", type=int, default=1, help="training processes per node")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget of the measurements")
    parser.add_argument("--step-ms", type=float, default=None, help="your model's step time without data wait")
    parser.add_argument("--sample", type=int, default=256, help="files sampled")
    parser.add_argument("--scratch-dir", default=None, help="where to build the sample's caches (default: TMPDIR)")
    parser.add_argument("--write-config", default=None, help="write a LightningCLI YAML with the recommendation")
    args = parser.parse_args(argv)
    try:
        if args.write_config:
            _check_config_path(args.path, args.write_config)  # before a minute of measuring, not after
        if os.path.exists(args.path):
            print(
                f"fastdata doctor: measuring {args.path} for about {args.seconds:g} s after listing it (a sample's "
                "HDF5 files and caches are built in a temporary directory and removed) ...",
                file=sys.stderr,
                flush=True,
            )
        report = doctor(
            args.path,
            args.devices,
            args.batch_size,
            args.image_size,
            args.seconds,
            args.step_ms,
            args.sample,
            args.scratch_dir,
        )
    except (FileNotFoundError, ValueError, PermissionError, OSError) as err:
        sys.exit(f"fastdata doctor: {err}")
    share = max(1, report.usable_cpus // report.devices)
    print(f"\nfastdata doctor: {report.path} ({report.kind})")
    print(
        f"  data: {report.files:,} images, {report.classes} classes, formats {report.formats} (sample of "
        f"{report.sampled}), ~{report.data_gb:.1f} GB; listed in {report.scan_s:.1f} s"
        + (
            " (per rank and run: the written config keeps the list in index_dir, once per node)"
            if report.kind == "folder" and report.files >= INDEX_DIR_FILES
            else ""
        )
        + "\n"
        f"    file size {_dist(report.size_kb, 'KB')}, mean {report.mean_kb:.0f} KB\n"
        f"    shorter side {_dist(report.shorter_side, 'px')}, median {report.median_resolution[0]}x"
        f"{report.median_resolution[1]}"
        + (
            f"; {report.smaller_than_crop} sampled images are smaller than the {args.image_size} px crop "
            "(upscaled in training)"
            if report.smaller_than_crop
            else ""
        )
        + f"\n    corrupt in the sample: {len(report.corrupt)}"
        + "".join(f"\n    corrupt: {p}" for p in report.corrupt[:10])
        + (
            f"\n    unreadable (permission denied) in the sample: {len(report.unreadable)}; training would fail on "
            "them: make the data readable by the user that trains"
            + "".join(f"\n    unreadable: {p}" for p in report.unreadable[:10])
            if report.unreadable
            else ""
        )
    )
    print(
        f"  machine: {report.usable_cpus} usable CPUs, {report.gpus} GPU(s); {report.devices} device(s): "
        f"{share} CPU(s) per rank, num_workers='auto' = {report.workers_per_rank} (timed on the rank's share)\n    RAM "
        f"{report.ram_gb:.0f} GB; free disk for a cache {report.scratch_free_gb:.0f} GB; "
        f"/dev/shm {report.shm_gb:.1f} GB; ROI JPEG decoder {'yes' if report.roi_decoder else 'no'}; "
        f"pillow-simd {'yes' if report.pillow_simd else 'no'}"
    )
    print(
        f"  storage: {report.read_mb_s_warm:.0f} MB/s warm, {report.read_mb_s_cold:.0f} MB/s after eviction; "
        f"ceilings (1 core): decode {report.decode_ceiling_1core:.0f} img/s, memcpy "
        f"{report.memcpy_ceiling_1core:.0f} img/s\n"
    )
    print(report.table())
    print(
        f"\nWorkers per rank, {report.recommendation}: "
        + ", ".join(f"{w}: {r:.0f} img/s" for w, r in report.worker_sweep.items())
        + (" (0: loads in the training process, not overlapped with the step)" if 0 in report.worker_sweep else "")
        + (
            f" ({share}: every CPU of the rank, none left for the training step)"
            if share > 1 and share in report.worker_sweep
            else ""
        )
    )
    wait = report.expected_wait_fraction
    print(
        f"\nRecommendation: {report.recommendation}: {report.reason}."
        + (f" Expected data wait at {args.step_ms:g} ms per step: {100 * wait:.0f}%." if wait is not None else "")
    )
    option = next(o for o in report.options if o.name == report.recommendation)
    if option.prepare:
        print(f"First, once: {option.prepare}")
    print(f"(measured in {report.seconds:.0f} s; nothing was written to {report.path})")
    if args.write_config:
        try:
            out = write_config(report, args.write_config)
        except (ValueError, OSError) as err:
            sys.exit(f"fastdata doctor: {err}")
        print(f"Wrote {out}: fastdata fit --config {out}")
    return report


def as_dict(report: DoctorReport) -> dict[str, Any]:
    """The report as plain data (JSON-serialisable)."""
    return asdict(report)
