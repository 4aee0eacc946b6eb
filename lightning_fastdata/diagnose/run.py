"""``doctor()``: probe the data and the machine, build and time the options, and decide."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lightning_fastdata.diagnose.bucket import probe_bucket
from lightning_fastdata.diagnose.options import BASELINE, folder_options, hdf5_options
from lightning_fastdata.diagnose.probe import permission_error, probe_folder, probe_hdf5
from lightning_fastdata.diagnose.report import DoctorReport, Option
from lightning_fastdata.diagnose.timing import Budget, rank_share, sweep_counts
from lightning_fastdata.diagnose.verdict import choose_option, choose_workers, expected_rate, wait_fraction
from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.jpeg.decode import pillow_simd_installed, roi_decode_available
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.workers import CpuBudget, resolve_num_workers
from lightning_fastdata.recipe import load_recipe

__all__ = ["doctor"]


def _ram_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


@contextlib.contextmanager
def _scratch(scratch_dir: str | None) -> Iterator[Path]:
    """A temporary directory for the sample's caches; a clear error if it cannot be made (read-only, no room)."""
    where = scratch_dir if scratch_dir is not None else tempfile.gettempdir()
    try:
        tmp = tempfile.TemporaryDirectory(prefix="fastdata-doctor-", dir=scratch_dir)
    except OSError as err:
        reason = "read-only file system" if err.errno == errno.EROFS else (err.strerror or str(err))
        raise DataError(
            f"Cannot create a scratch directory in {where!r} ({reason}): the doctor builds the sample's caches there "
            "and removes them. Pass --scratch-dir DIR (scratch_dir=) or set TMPDIR to a writable local directory."
        ) from err
    with tmp as name:
        yield Path(name)


def doctor(
    path: str,
    devices: int = 1,
    batch_size: int = 64,
    image_size: int = 224,
    seconds: float = 60.0,
    step_ms: float | None = None,
    sample: int = 256,
    scratch_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
    recipe: str | None = None,
) -> DoctorReport:
    """Measure ``path`` (an image folder, a bucket URL of one, or an HDF5 file) and recommend a DataModule.

    Read-only on the data: it lists the folder (or inspects the HDF5 file), samples files, and builds everything
    it times (a folder of symlinks to the sample, HDF5 files and caches of it) in a temporary directory it
    removes. The options are timed with the same harness as ``fastdata bench``, pinned to one rank's share of the
    CPUs, at the worker count each rank would get; the recommended one again at other worker counts. Only sizes
    and build times are scaled to the whole data set, and an option whose data do not fit in RAM is capped at
    the rate the storage reads them cold.

    Not for use from several threads at once: while it times, it pins this whole process (CPU affinity and
    torch's intra-op threads) to one rank's share of the CPUs, and restores both afterwards.

    Args:
        path: Image folder (``root/<class>/<image>``), a bucket URL of one (``s3://bucket/train``: listed, a
            sample fetched into the scratch directory and every option timed from that copy; streaming from the
            bucket is capped at the node's estimated fetch rate, see :mod:`lightning_fastdata.diagnose.bucket`),
            or an HDF5 file.
        recipe: A LightningCLI config (a file, or a shipped config's name such as ``recipe_torchvision``) whose data
            arguments are your training recipe (``train_transforms``, ``device_transforms``, ``batch_transforms``,
            ``repeated_augmentations``, ...): every option is timed with it, the baseline is torchvision's reference
            loader of it, and the written config carries it. ``None``: RandomResizedCrop + flip.
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
        storage_options: Object-store settings for a URL ``path`` (default: the standard environment).

    Raises:
        FileNotFoundError: If ``path`` does not exist, is an empty folder or holds no class folder.
        PermissionError: If the data cannot be listed or read (the message names the file).
        OSError: If the scratch directory cannot be created, or too many sampled files are corrupt.
        ValueError: If a file is not an HDF5 file, or an argument is impossible.
    """
    start_all = time.perf_counter()
    _check_arguments(path, devices, batch_size, image_size, seconds, sample)
    cpus = CpuBudget.detect()
    share = max(1, cpus.usable // devices)
    workers = resolve_num_workers("auto", devices, cpus)  # what each rank gets in training
    ram = _ram_gb()
    budget = Budget(seconds)
    made, written = load_recipe(recipe) if recipe is not None else ({}, {})
    made.pop("image_size", None)  # the crop measured is image_size's
    written.pop("image_size", None)
    recipe_kw = (made, written)
    with _scratch(scratch_dir) as scratch:
        probe, prepared = _probe_and_prepare(
            path, storage_options, image_size, sample, scratch, workers * devices, cpus.usable, batch_size, recipe_kw
        )
        budget.deadline += probe.scan_s  # the listing comes on top of the budget
        sweep = sweep_counts(share, workers)
        with rank_share(share):
            options = _timed_options(prepared, probe, budget, workers, len(sweep) - 1, ram, cpus.usable, devices)
            free = shutil.disk_usage(scratch).free / 1e9
            chosen, reason = choose_option(options, probe.data_gb, ram, free, batch_size, step_ms, workers > 0)
            make = next(p.make for p in prepared if p.key == chosen.key)
            rates = {workers: chosen.images_per_s}
            for k, w in enumerate(c for c in sweep if c != workers):
                rates[w] = budget.time(functools.partial(make, w), len(sweep) - 1 - k)
    cap = chosen.expected_per_s if chosen.expected_per_s < chosen.images_per_s else float("inf")
    num_workers, why_workers = choose_workers(rates, workers, share, cap, batch_size, step_ms)
    if num_workers != workers:
        chosen.config["init_args"]["num_workers"] = num_workers
    return DoctorReport(
        **vars(probe),
        path=path if is_url(path) else os.path.abspath(path),
        usable_cpus=cpus.usable,
        gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        devices=devices,
        workers_per_rank=workers,
        ram_gb=ram,
        scratch_free_gb=free,
        shm_gb=shutil.disk_usage("/dev/shm").total / 1e9 if os.path.isdir("/dev/shm") else 0.0,
        roi_decoder=roi_decode_available(),
        pillow_simd=pillow_simd_installed(),
        options=options,
        worker_sweep=dict(sorted(rates.items())),
        recommendation=chosen.name,
        reason=reason + why_workers,
        expected_wait_fraction=wait_fraction(min(rates[num_workers], cap), batch_size, step_ms, num_workers > 0),
        seconds=time.perf_counter() - start_all,
    )


def _check_arguments(path: str, devices: int, batch_size: int, image_size: int, seconds: float, sample: int) -> None:
    """Refuse impossible arguments and a local path that does not exist, naming them.

    Raises:
        ValueError: On an impossible argument; FileNotFoundError: if a local ``path`` does not exist.
    """
    if devices < 1 or batch_size < 1 or image_size < 8 or seconds <= 0 or sample < 8:
        raise InvalidValueError(
            f"Impossible arguments: devices={devices}, batch_size={batch_size}, image_size={image_size}, "
            f"seconds={seconds}, sample={sample} (need devices, batch_size >= 1, image_size >= 8, seconds > 0, "
            "sample >= 8)."
        )
    if not is_url(path) and not os.path.exists(path):
        raise PathNotFoundError(
            f"{path!r} does not exist. Pass an image folder (root/<class>/<image>) or an HDF5 file."
        )


def _probe_and_prepare(
    path: str,
    storage_options: dict[str, Any] | None,
    image_size: int,
    sample: int,
    scratch: Path,
    readers: int,
    usable: int,
    batch_size: int,
    recipe_kw: tuple[dict[str, Any], dict[str, Any]],
) -> tuple[Any, list[Any]]:
    """The data's statistics from a sample, and each loader option to time on it.

    A folder's, a bucket's or an HDF5 file's options.

    Raises:
        PermissionError: If the data cannot be listed or read (the message names the file).
    """
    try:
        if is_url(path):
            probe, files = probe_bucket(path, storage_options, image_size, sample, scratch, readers)
            return probe, folder_options(path, probe, files, scratch, usable, batch_size, image_size, recipe_kw)
        if os.path.isdir(path):
            probe, files = probe_folder(path, image_size, sample)
            return probe, folder_options(path, probe, files, scratch, usable, batch_size, image_size, recipe_kw)
        probe, layout = probe_hdf5(path, image_size, sample)
        return probe, hdf5_options(path, layout, batch_size, image_size, recipe_kw)
    except PermissionError as err:
        raise permission_error(path, err) from err


def _timed_options(
    prepared: list[Any], probe: Any, budget: Budget, workers: int, after: int, ram: float, usable: int, devices: int
) -> list[Option]:
    """Every prepared option timed within the budget, with its expected rate on the whole data and vs the baseline.

    ``after``: the timings still to come once these are done (the budget is shared with them); the expected rate
    counts RAM and cold reads of the whole data set.
    """
    # a build from a bucket also fetches every object once, in its processes (one process's rate each)
    fetch_s = probe.data_gb * 1e3 / (probe.read_mb_s_warm * usable) if probe.kind == "bucket" else 0.0
    options: list[Option] = []
    for k, prep in enumerate(prepared):
        rate = budget.time(functools.partial(prep.make, workers), len(prepared) - k + after)
        dataset_gb = prep.kb_per_image * probe.files / 1e6
        expected = expected_rate(rate, dataset_gb, prep.kb_per_image, ram, probe.read_mb_s_cold, devices)
        if probe.kind == "bucket" and prep.key == "folder":  # every epoch fetches every object again
            expected = min(rate, probe.read_mb_s_cold * 1e3 / prep.kb_per_image / devices)
        options.append(
            Option(
                name=prep.name,
                images_per_s=rate,
                vs_baseline=float("nan"),
                kb_per_image=prep.kb_per_image,
                dataset_gb=dataset_gb,
                build_s=prep.build_s_per_image * probe.files + fetch_s * (prep.build_s_per_image > 0),
                config=prep.config,
                expected_per_s=expected,
                prepare=prep.prepare,
                key=prep.key,
                steps=prep.steps,
            )
        )
    base = next((o.images_per_s for o in options if o.key == BASELINE), float("nan"))
    for o in options:
        o.vs_baseline = o.images_per_s / base
    return options
