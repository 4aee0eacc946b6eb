"""``fastdata doctor``: measure a user's own data and machine, and say (and write) the fastest setup.

Read-only on the data: it lists the folder (or inspects the HDF5 file), samples files, and builds everything it
times (a folder of symlinks to the sample, caches of it) in a temporary directory it removes. The options are
measured on the sample with the same harness as ``fastdata bench``, at the worker count each rank would get, and
scaled to the whole data set only where that is arithmetic (sizes, build times).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.bench.cache import memcpy_ceiling
from lightning_fastdata.bench.harness import baseline_loader, count_images, decode_ceiling, time_loader
from lightning_fastdata.datamodules.cache import TensorCacheDataModule
from lightning_fastdata.datamodules.folder import ImageFolderDataModule
from lightning_fastdata.datamodules.hdf5 import HDF5DataModule
from lightning_fastdata.datasets.hdf5 import inspect_hdf5
from lightning_fastdata.loading.decode import pillow_simd_installed, roi_decode_available
from lightning_fastdata.loading.index import scan_image_folder
from lightning_fastdata.loading.workers import CpuBudget

__all__ = ["DoctorReport", "Option", "as_dict", "doctor", "main", "write_config"]


@dataclass
class Option:
    """One way to load the data, measured on the sample."""

    name: str
    images_per_s: float
    vs_baseline: float
    kb_per_image: float
    dataset_gb: float
    build_s: float
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class DoctorReport:
    """What ``fastdata doctor`` found and recommends (``lightning_fastdata.doctor(...)`` returns it)."""

    path: str
    kind: str
    files: int
    classes: int
    formats: dict[str, int]
    sampled: int
    mean_kb: float
    median_resolution: tuple[int, int]
    corrupt: list[str]
    usable_cpus: int
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
    recommendation: str
    reason: str
    expected_wait_fraction: float | None
    seconds: float

    def table(self) -> str:
        """The options as a Markdown table."""
        lines = [
            "| option | images/s per rank | vs baseline | KB per image | whole data set | build |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for o in self.options:
            build = "-" if not o.build_s else f"{o.build_s:.0f} s" if o.build_s < 120 else f"{o.build_s / 60:.0f} min"
            lines.append(
                f"| {o.name} | {o.images_per_s:.0f} | {o.vs_baseline:.2f}x | {o.kb_per_image:.0f} | "
                f"{o.dataset_gb:.1f} GB | {build} |"
            )
        return "\n".join(lines)


def _ram_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def _read_rate(paths: list[str], evict: bool) -> float:
    """MB/s reading ``paths``; with ``evict`` after asking the kernel to drop them from the page cache.

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
            total += len(fh.read())
    return total / 1e6 / max(time.perf_counter() - start, 1e-9)


def _sample_folder(index: Any, rows: np.ndarray, scratch: Path) -> Path:
    """A folder of symlinks to the sampled files, class by class, in the scratch directory (never in the data)."""
    root = scratch / "sample"
    for k, i in enumerate(rows):
        folder = root / index.classes[int(index.labels[i])]
        folder.mkdir(parents=True, exist_ok=True)
        src = index.path(int(i))
        (folder / f"{k:06d}{os.path.splitext(src)[1]}").symlink_to(os.path.abspath(src))
    for name in index.classes:  # every class folder must exist and hold an image
        (root / name).mkdir(exist_ok=True)
        if not any((root / name).iterdir()):
            first = int(np.flatnonzero(index.labels == index.classes.index(name))[0])
            (root / name / f"extra{os.path.splitext(index.path(first))[1]}").symlink_to(
                os.path.abspath(index.path(first))
            )
    return root


def _timed(make: Callable[[], Any], seconds: float) -> float:
    return time_loader(make, count_images, warmup=1, min_seconds=seconds)


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

    Args:
        path: Image folder (``root/<class>/<image>``) or HDF5 file.
        devices: Training processes per node (each rank gets ``usable CPUs / devices`` workers).
        batch_size: Batch size per rank.
        image_size: Training crop side.
        seconds: Time budget of the measurements (the scan comes on top).
        step_ms: Your model's step time without data wait, if known: gives the expected wait fraction.
        sample: Files sampled for statistics and timed runs.
        scratch_dir: Where to build the sample's caches (a temporary directory, removed afterwards).

    Raises:
        FileNotFoundError: If ``path`` does not exist, is an empty folder or holds no class folder.
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
    usable = CpuBudget.detect().usable
    workers = max(1, usable // devices - 1) if usable > 1 else 0
    per_time = seconds / 6
    with tempfile.TemporaryDirectory(prefix="fastdata-doctor-", dir=scratch_dir) as tmp:
        scratch = Path(tmp)
        if os.path.isdir(path):
            report_args = _folder(path, scratch, workers, batch_size, image_size, per_time, sample)
        else:
            report_args = _hdf5(path, workers, batch_size, image_size, per_time)
        free = shutil.disk_usage(scratch).free / 1e9
    shm = shutil.disk_usage("/dev/shm").total / 1e9 if os.path.isdir("/dev/shm") else 0.0
    ram = _ram_gb()
    options: list[Option] = report_args.pop("options")
    recommendation, reason, wait = _verdict(options, report_args["data_gb"], ram, free, batch_size, step_ms)
    return DoctorReport(
        path=os.path.abspath(path),
        usable_cpus=usable,
        devices=devices,
        workers_per_rank=workers,
        ram_gb=ram,
        scratch_free_gb=free,
        shm_gb=shm,
        roi_decoder=roi_decode_available(),
        pillow_simd=pillow_simd_installed(),
        options=options,
        recommendation=recommendation,
        reason=reason,
        expected_wait_fraction=wait,
        seconds=time.perf_counter() - start_all,
        **report_args,
    )


def _folder(
    root: str, scratch: Path, workers: int, batch_size: int, image_size: int, per_time: float, sample: int
) -> dict[str, Any]:
    index = scan_image_folder(root)
    n = len(index)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    paths = [index.path(int(i)) for i in rows]
    formats: Counter[str] = Counter()
    sizes, resolutions, corrupt = [], [], []
    for p in paths:
        sizes.append(os.path.getsize(p))
        try:
            with open(p, "rb") as fh:
                data = fh.read()
            with Image.open(io.BytesIO(data)) as img:
                img.convert("RGB")  # a full decode: a truncated or corrupt file fails here
                formats[(img.format or "?").lower()] += 1
                resolutions.append(img.size)
        except Exception:  # PIL raises several types for broken files
            corrupt.append(p)
    bad = set(corrupt)
    good_rows = np.array([i for i, p in zip(rows, paths) if p not in bad], dtype=np.int64)
    good = [p for p in paths if p not in bad]
    if len(good) < 4:
        raise OSError(
            f"{len(corrupt)} of the {len(paths)} sampled images in {root!r} are corrupt (e.g. {corrupt[0]!r}); "
            "too few decode to measure anything. Check the files."
        )
    mean_kb = statistics.mean(sizes) / 1e3
    batch = max(1, min(batch_size, len(good) // 4))
    warm = _read_rate(good, evict=False)
    cold = _read_rate(good, evict=True)
    threads = torch.get_num_threads()
    try:
        ceiling = max(decode_ceiling(good[:64]).values())  # one core: it sets torch's threads to 1 meanwhile
    finally:
        torch.set_num_threads(threads)
    sample_root = str(_sample_folder(index, good_rows, scratch))
    kw: dict[str, Any] = dict(image_size=image_size, batch_size=batch, num_workers=workers, val_fraction=0.0)
    cache_size = max(image_size, round(image_size * 256 / 224))
    folder = ImageFolderDataModule(sample_root, **kw)
    folder.setup("fit")
    measured: dict[str, tuple[float, float, float]] = {}  # name -> (images/s, KB per image, build s per image)
    measured["torchvision ImageFolder (baseline)"] = (
        _timed(lambda: baseline_loader(sample_root, image_size, batch, workers), per_time),
        mean_kb,
        0.0,
    )
    measured["ImageFolderDataModule"] = (_timed(folder.train_dataloader, per_time), mean_kb, 0.0)
    configs: dict[str, dict[str, Any]] = {
        "ImageFolderDataModule": {"class_path": "lightning_fastdata.ImageFolderDataModule"}
    }
    storages: tuple[Literal["jpeg", "raw"], ...] = ("jpeg", "raw")
    memcpy = float("nan")
    for storage in storages:
        cache_dir = scratch / f"cache-{storage}"
        dm = TensorCacheDataModule(
            sample_root, str(cache_dir), cache_size=cache_size, storage=storage, build_processes=max(1, workers), **kw
        )
        start = time.perf_counter()
        dm.prepare_data()
        build = (time.perf_counter() - start) / len(good)
        dm.setup("fit")
        kb = sum(f.stat().st_size for f in cache_dir.iterdir()) / len(good) / 1e3
        name = f"TensorCacheDataModule(storage='{storage}')"
        measured[name] = (_timed(dm.train_dataloader, per_time), kb, build)
        configs[name] = {
            "class_path": "lightning_fastdata.TensorCacheDataModule",
            "init_args": {
                # a local disk with room for it (see the report): never inside the data folder
                "cache_dir": f"cache/{os.path.basename(root.rstrip(os.sep))}-{storage}{cache_size}",
                "cache_size": cache_size,
                **({"storage": "jpeg"} if storage == "jpeg" else {}),
            },
        }
        if storage == "raw":
            images = np.load(cache_dir / "train_images.npy", mmap_mode="r")
            memcpy = memcpy_ceiling(np.asarray(images), min(batch, len(images)), image_size, 1)
        del dm
    base = measured["torchvision ImageFolder (baseline)"][0]
    options = [
        Option(
            name=name,
            images_per_s=rate,
            vs_baseline=rate / base,
            kb_per_image=kb,
            dataset_gb=kb * n / 1e6,
            build_s=build * n,
            config=configs.get(name, {}),
        )
        for name, (rate, kb, build) in measured.items()
    ]
    for o in options:
        if o.config:
            o.config.setdefault("init_args", {}).update(
                root=os.path.abspath(root), image_size=image_size, batch_size=batch_size, num_workers="auto"
            )
    res = sorted(resolutions)
    return {
        "kind": "folder",
        "files": n,
        "classes": len(index.classes),
        "formats": dict(formats),
        "sampled": len(paths),
        "mean_kb": mean_kb,
        "median_resolution": res[len(res) // 2] if res else (0, 0),
        "corrupt": corrupt,
        "data_gb": mean_kb * n / 1e6,
        "read_mb_s_warm": warm,
        "read_mb_s_cold": cold,
        "decode_ceiling_1core": ceiling,
        "memcpy_ceiling_1core": memcpy,
        "options": options,
    }


def _hdf5(path: str, workers: int, batch_size: int, image_size: int, per_time: float) -> dict[str, Any]:
    layout = inspect_hdf5(path)  # raises naming the file if it is not an HDF5 file of images
    n = len(layout.labels)
    size = os.path.getsize(path)
    dm = HDF5DataModule(path, image_size=image_size, batch_size=min(batch_size, max(1, n // 4)), num_workers=workers)
    dm.setup("fit")
    rate = _timed(dm.train_dataloader, per_time)
    warm = _read_rate([path], evict=False) if size < 2e9 else float("nan")
    option = Option(
        name=f"HDF5DataModule ({layout.kind})",
        images_per_s=rate,
        vs_baseline=float("nan"),
        kb_per_image=size / n / 1e3,
        dataset_gb=size / 1e9,
        build_s=0.0,
        config={
            "class_path": "lightning_fastdata.HDF5DataModule",
            "init_args": {"path": path, "image_size": image_size, "batch_size": batch_size, "num_workers": "auto"},
        },
    )
    return {
        "kind": "hdf5",
        "files": n,
        "classes": len(set(np.asarray(layout.labels).tolist())),
        "formats": {layout.kind: n},
        "sampled": n,
        "mean_kb": size / n / 1e3,
        "median_resolution": (0, 0),
        "corrupt": [],
        "data_gb": size / 1e9,
        "read_mb_s_warm": warm,
        "read_mb_s_cold": float("nan"),
        "decode_ceiling_1core": float("nan"),
        "memcpy_ceiling_1core": float("nan"),
        "options": [option],
    }


def _verdict(
    options: list[Option],
    data_gb: float,
    ram_gb: float,
    free_gb: float,
    batch_size: int,
    step_ms: float | None,
) -> tuple[str, str, float | None]:
    """The one option to use, why, and the expected wait fraction at ``step_ms``."""
    usable = [o for o in options if o.config]
    fits = [o for o in usable if not o.build_s or (o.dataset_gb < 0.8 * ram_gb and o.dataset_gb < 0.9 * free_gb)]
    ram_note = f"RAM {ram_gb:.0f} GB, free disk {free_gb:.0f} GB"

    def wait(o: Option) -> float | None:
        if step_ms is None:
            return None
        load_ms = 1000 * batch_size / o.images_per_s
        return max(0.0, (load_ms - step_ms) / load_ms)

    if step_ms is not None:
        enough = [o for o in fits if wait(o) == 0.0]
        if enough:  # the simplest (least to build and store) that keeps the model busy
            best = min(enough, key=lambda o: (o.build_s, o.dataset_gb))
            need = 1000 * batch_size / step_ms
            built = f"a {best.dataset_gb:.1f} GB cache to build once" if best.build_s else "nothing to build"
            return (
                best.name,
                f"the simplest option that keeps up ({built}): {best.images_per_s:.0f} images/s per rank, the model "
                f"needs {need:.0f} at {step_ms:g} ms per step of {batch_size} ({ram_note})",
                wait(best),
            )
    best = max(fits, key=lambda o: o.images_per_s)
    why = f"the fastest option that fits this machine ({ram_note}; whole data set {data_gb:.1f} GB)"
    if best.build_s:
        why += f"; its cache ({best.dataset_gb:.1f} GB) builds once in ~{max(1, round(best.build_s / 60))} min"
    return best.name, why, wait(best)


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
    out = Path(path)
    out.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return out


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
    parser.add_argument("--write-config", default=None, help="write a LightningCLI YAML with the recommendation")
    args = parser.parse_args(argv)
    try:
        report = doctor(
            args.path, args.devices, args.batch_size, args.image_size, args.seconds, args.step_ms, args.sample
        )
    except (FileNotFoundError, ValueError, PermissionError, OSError) as err:
        sys.exit(f"fastdata doctor: {err}")
    print(f"\nfastdata doctor: {report.path} ({report.kind})")
    print(
        f"  data: {report.files:,} images, {report.classes} classes, formats {report.formats} (sample of "
        f"{report.sampled}), mean {report.mean_kb:.0f} KB, median {report.median_resolution[0]}x"
        f"{report.median_resolution[1]}, ~{report.data_gb:.1f} GB; corrupt in the sample: {len(report.corrupt)}"
        + "".join(f"\n    corrupt: {p}" for p in report.corrupt[:10])
    )
    print(
        f"  machine: {report.usable_cpus} usable CPUs, {report.devices} device(s) -> {report.workers_per_rank} "
        f"workers per rank; RAM {report.ram_gb:.0f} GB; free disk for a cache {report.scratch_free_gb:.0f} GB; "
        f"/dev/shm {report.shm_gb:.1f} GB; ROI JPEG decoder {'yes' if report.roi_decoder else 'no'}; "
        f"pillow-simd {'yes' if report.pillow_simd else 'no'}"
    )
    print(
        f"  storage: {report.read_mb_s_warm:.0f} MB/s warm, {report.read_mb_s_cold:.0f} MB/s after eviction; "
        f"ceilings (1 core): decode {report.decode_ceiling_1core:.0f} img/s, memcpy "
        f"{report.memcpy_ceiling_1core:.0f} img/s\n"
    )
    print(report.table())
    wait = report.expected_wait_fraction
    print(
        f"\nRecommendation: {report.recommendation}: {report.reason}."
        + (f" Expected data wait at {args.step_ms:g} ms per step: {100 * wait:.0f}%." if wait is not None else "")
    )
    print(f"(measured in {report.seconds:.0f} s; nothing was written to {report.path})")
    if args.write_config:
        out = write_config(report, args.write_config)
        print(f"Wrote {out}: fastdata fit --config {out}")
    return report


def as_dict(report: DoctorReport) -> dict[str, Any]:
    """The report as plain data (JSON-serialisable)."""
    return asdict(report)
