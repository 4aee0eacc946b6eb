"""Scale suite: what grows with the number of files and bytes (``fastdata bench --suites scale``).

- **Index**: a hard-linked ImageNet-shaped tree (default 1,000 classes x 1,281 files; hard links, so seconds and
  no disk) scanned by torchvision's ``ImageFolder`` and by us, each in a fresh process: seconds and resident
  memory added; then the persisted index (``index_dir``): first run (scan + write) and reuse.
- **Cache staleness check**: what ``TensorCacheDataModule.prepare_data`` spends per run checking a current cache
  against that tree: every file (``verify_source="files"``) against the folders (``"folders"``).
- **Worker memory**: PSS of each loader worker after each of a few epochs over that 1.28M-file index (ours vs
  torchvision's list of tuples, whose reference counts make every touched page a private copy).
- **Cold reads**: one pass of every DataModule over the benchmark data after evicting its files from the page
  cache (``posix_fadvise(DONTNEED)``), against a warm pass of the same loader; MB read from the block device
  per image; with and without ``block_shuffle``.
- **Formats**: size on disk per image and images/s of the same images as JPEG files, HDF5 (original bytes,
  re-encoded compact, raw) and the uint8 tensor cache.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.probes import probe_server, run_probe
from lightning_fastdata import HDF5DataModule, ImageFolderDataModule, TensorCacheDataModule, convert_folder_to_hdf5
from lightning_fastdata.bench.hdf5 import bench_files
from lightning_fastdata.bench.scratch import scratch_path
from lightning_fastdata.measure import Candidate, baseline_loader, count_images, measure, rows_for

__all__ = [
    "cold_read_rows",
    "compact_rows",
    "evict",
    "linked_tree",
    "scale_suite",
    "scan_rows",
    "staleness_rows",
    "worker_pss_rows",
]

_DONE = ".fastdata-linked-tree"  # not the demo data's marker: a demo folder is not a tree of ours


def linked_tree(root: str, classes: int, per_class: int, sources: list[str]) -> Path:
    """An ImageNet-shaped tree of hard links to ``sources`` (one copy per class, then links), built once.

    Only into a folder that does not exist or that this function made (its marker says so). Folder mtimes are
    set a minute back, as real data's are, so a persisted index of it is trusted at once.
    """
    path = Path(root)
    if (path / _DONE).exists():
        return path
    if path.exists() and any(path.iterdir()) and not (path / ".fastdata-generating").exists():
        raise FileExistsError(f"{root!r} exists and is not empty; the scale suite builds its tree in a new folder.")
    print(f"scale: building {classes} x {per_class} hard links in {root} ...", flush=True)
    path.mkdir(parents=True, exist_ok=True)
    (path / ".fastdata-generating").write_text("incomplete until .complete exists\n")
    past = time.time() - 60
    for c in range(classes):
        folder = path / f"n{c:08d}"
        folder.mkdir(exist_ok=True)
        first = folder / f"n{c:08d}_0.JPEG"
        if not first.exists():
            shutil.copyfile(sources[c % len(sources)], first)
        for i in range(1, per_class):
            link = folder / f"n{c:08d}_{i}.JPEG"
            if not link.exists():
                os.link(first, link)
        os.utime(folder, (past, past))
    (path / ".fastdata-generating").unlink()
    (path / _DONE).write_text("ok\n")
    os.utime(path, (past, past))
    return path


def scan_rows(root: str, index_dir: str, repeats: int) -> list[dict[str, Any]]:
    """Seconds and MB for torchvision's scan, ours, the index's first run and its reuse (interleaved repeats)."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ("torchvision", "ours", "first", "reuse")}
    for _ in range(repeats):
        for how in runs:
            if how == "first":
                shutil.rmtree(index_dir, ignore_errors=True)
            runs[how].append(run_probe("scan", how, root, index_dir))
    names = {
        "torchvision": "torchvision ImageFolder(root)",
        "ours": "scan_image_folder (ImageFolderDataModule.setup)",
        "first": "index_dir, first run (scan + write)",
        "reuse": "index_dir, reuse (stat each folder)",
    }
    base = statistics.median(r["s"] for r in runs["torchvision"])
    return [
        {
            "what": names[how],
            "files": rs[0]["files"],
            "seconds": statistics.median(r["s"] for r in rs),
            "vs_torchvision": statistics.median(r["s"] for r in rs) / base,
            "mb": statistics.median(r["mb"] for r in rs),
            "runs_s": [r["s"] for r in rs],
        }
        for how, rs in runs.items()
    ]


def staleness_rows(root: str, index_dir: str, repeats: int) -> list[dict[str, Any]]:
    """Seconds a ``TensorCacheDataModule.prepare_data`` spends checking a current cache of ``root`` against it.

    The cache is a manifest only (building 1.28M images would take hours; the check reads nothing else), written
    as a build writes it. Each check runs in a fresh process after the index is loaded from ``index_dir``,
    ``verify_source="files"`` and ``"folders"`` interleaved.
    """
    from lightning_fastdata.cache.manifest import CacheParams, write_manifest
    from lightning_fastdata.cache.source import fingerprint, source_record
    from lightning_fastdata.loading.index.store import IndexStore

    index, _ = IndexStore(index_dir).folder(root)
    cache_dir = Path(f"{root.rstrip(os.sep)}-manifest-only-cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache_dir.mkdir(parents=True)
    record = source_record([index, None])
    params = CacheParams(256, 224, 0.875, fingerprint([index, None]), tuple(index.classes))
    write_manifest(cache_dir, params, {"train": len(index), "val": 0}, record)
    runs: dict[str, list[dict[str, Any]]] = {"files": [], "folders": []}
    for _ in range(repeats):
        for mode in runs:
            runs[mode].append(run_probe("check", mode, root, index_dir, str(cache_dir)))
    shutil.rmtree(cache_dir)
    base = statistics.median(r["s"] for r in runs["files"])
    return [
        {
            "verify_source": mode,
            "files": rs[0]["files"],
            "folders": len(record["folders"][0]),
            "seconds": statistics.median(r["s"] for r in rs),
            "vs_files": statistics.median(r["s"] for r in rs) / base,
            "runs_s": [r["s"] for r in rs],
        }
        for mode, rs in runs.items()
    ]


def worker_pss_rows(root: str, epochs: int, batches: int) -> list[dict[str, Any]]:
    """PSS (MB) of each of 2 workers after each epoch of ``batches`` batches, for torchvision's loader and ours."""
    rows = []
    for which in ("torchvision", "ours"):
        got = run_probe("worker_pss", which, root, str(epochs), str(batches))
        per_epoch = [statistics.mean(ws) for ws in got["pss_mb"]]
        rows.append(
            {
                "loader": which,
                "worker_pss_mb_per_epoch": per_epoch,
                "growth_mb_per_epoch": (per_epoch[-1] - per_epoch[0]) / max(1, epochs - 1),
                "main_pss_mb": got["main_pss_mb"],
            }
        )
    return rows


def evict(paths: Iterable[str]) -> None:
    """Drop ``paths`` from the page cache (``POSIX_FADV_DONTNEED``), as if read for the first time.

    Dirty pages (a file written moments ago) are not dropped, so each file is written back first (``fsync``,
    which changes no byte of it).
    """
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _sectors_read(path: str) -> int:
    """Sectors read so far from the block device holding ``path`` (whole-disk counter of /sys/dev/block)."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return int(stat.read_text().split()[2])


def _one_pass(loader: Iterable[Any], consume: Callable[[Any], int]) -> tuple[int, float]:
    start, n = time.perf_counter(), 0
    for batch in loader:
        n += consume(batch)
    return n, time.perf_counter() - start


def cold_read_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Warm and cold images/s and MB read per image, per DataModule (2 workers; each timed pass starts its loader).

    Every pass builds its loader anew, so no worker keeps a file mapped (mapped pages survive eviction) and warm
    and cold passes both include the workers' start; the block device's read counter gives the bytes read.
    """

    def files() -> list[str]:
        return sorted(glob.glob(os.path.join(args.root, "*", "*")))

    h5 = bench_files(args)
    cache_dir = str(scratch_path(args, "cache256"))
    kw = dict(image_size=args.image_size, batch_size=args.batch_size, num_workers=2, val_fraction=0.0)

    def folder(block: int | None) -> Any:
        dm = ImageFolderDataModule(args.root, block_shuffle=block, entropy_index=False, **kw)
        dm.setup("fit")
        return dm.train_dataloader()

    def hdf5(which: str, block: int | None) -> Any:
        dm = HDF5DataModule(str(h5[which]), block_shuffle=block, **kw)
        dm.setup("fit")
        return dm.train_dataloader()

    def cache(block: int | None) -> Any:
        dm = TensorCacheDataModule(args.root, cache_dir, cache_size=256, block_shuffle=block, **kw)
        dm.prepare_data()
        dm.setup("fit")
        return dm.train_dataloader()

    def count(batch: Any) -> int:
        return len(batch[1])

    def cache_files() -> list[str]:
        return sorted(glob.glob(os.path.join(cache_dir, "*.npy")))

    candidates: list[tuple[str, Callable[[], Any], Callable[[], list[str]]]] = [
        (
            "baseline (torchvision ImageFolder)",
            lambda: baseline_loader(args.root, args.image_size, args.batch_size, 2),
            files,
        ),
        ("ImageFolderDataModule", lambda: folder(None), files),
        ("HDF5DataModule raw", lambda: hdf5("raw", None), lambda: [str(h5["raw"])]),
        ("HDF5DataModule raw, block_shuffle=64", lambda: hdf5("raw", 64), lambda: [str(h5["raw"])]),
        ("HDF5DataModule encoded", lambda: hdf5("encoded", None), lambda: [str(h5["encoded"])]),
        ("TensorCacheDataModule", lambda: cache(None), cache_files),
        ("TensorCacheDataModule, block_shuffle=64", lambda: cache(64), cache_files),
    ]
    rows = []
    for name, make, paths_of in candidates:
        _one_pass(make(), count)  # warm-up (and, for the cache, the build)
        gc.collect()  # the loader's workers and their memory maps are gone: eviction can drop every page
        warm_n, warm_s = _one_pass(make(), count)
        gc.collect()
        paths = paths_of()
        evict(paths)
        sectors = _sectors_read(paths[0])
        cold_n, cold_s = _one_pass(make(), count)
        read_mb = (_sectors_read(paths[0]) - sectors) * 512 / 1e6
        gc.collect()
        rows.append(
            {
                "loader": name,
                "warm_images_per_s": warm_n / warm_s,
                "cold_images_per_s": cold_n / cold_s,
                "cold_vs_warm": (cold_n / cold_s) / (warm_n / warm_s),
                "mb_read_per_image": read_mb / cold_n,
                "mb_on_disk_per_image": sum(os.path.getsize(p) for p in paths) / 1e6 / cold_n,
            }
        )
    return rows


def compact_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Size on disk per image and images/s of each format of the same images (2 workers, interleaved runs)."""
    h5 = bench_files(args)
    compact = scratch_path(args, "jpeg256q90.h5")
    if not compact.exists():
        convert_folder_to_hdf5(args.root, compact, max_side=256, quality=90)
    cache_dir = str(scratch_path(args, "cache256"))
    kw = dict(image_size=args.image_size, batch_size=args.batch_size, num_workers=2, val_fraction=0.0)
    folder = ImageFolderDataModule(args.root, entropy_index=False, **kw)
    modules: dict[str, tuple[Any, list[str]]] = {
        "ImageFolderDataModule (original JPEGs)": (folder, sorted(glob.glob(os.path.join(args.root, "*", "*")))),
        "HDF5DataModule encoded (original JPEGs)": (HDF5DataModule(str(h5["encoded"]), **kw), [str(h5["encoded"])]),
        "HDF5DataModule compact (--max-side 256, q90)": (HDF5DataModule(str(compact), **kw), [str(compact)]),
        "HDF5DataModule raw (256 px squares)": (HDF5DataModule(str(h5["raw"]), **kw), [str(h5["raw"])]),
    }
    cache = TensorCacheDataModule(args.root, cache_dir, cache_size=256, **kw)
    cache.prepare_data()
    modules["TensorCacheDataModule (256 px uint8)"] = (cache, sorted(glob.glob(os.path.join(cache_dir, "*.npy"))))
    jpeg_dir = str(scratch_path(args, "cache-jpeg256"))
    jpeg = TensorCacheDataModule(args.root, jpeg_dir, cache_size=256, storage="jpeg", quality=90, **kw)
    jpeg.prepare_data()
    modules["TensorCacheDataModule storage='jpeg' (256, q90)"] = (
        jpeg,
        sorted(glob.glob(os.path.join(jpeg_dir, "*.h5"))),
    )
    for dm, _ in modules.values():
        dm.setup("fit")
    n = len(modules["ImageFolderDataModule (original JPEGs)"][1])  # images (the folder's files)
    candidates: list[Candidate] = [
        (
            "baseline (torchvision ImageFolder)",
            lambda: baseline_loader(args.root, args.image_size, args.batch_size, 2),
            count_images,
        )
    ]
    candidates += [(name, dm.train_dataloader, count_images) for name, (dm, _) in modules.items()]
    rows = rows_for(measure(candidates, args.repeats, args.min_seconds), 2, None)
    on_disk = {name: sum(os.path.getsize(p) for p in paths) / n / 1e3 for name, (_, paths) in modules.items()}
    on_disk["baseline (torchvision ImageFolder)"] = on_disk["ImageFolderDataModule (original JPEGs)"]
    for row in rows:
        row["kb_per_image"] = on_disk[row["loader"]]
        row["imagenet_gb"] = row["kb_per_image"] * 1_281_167 / 1e6
    return rows


def scale_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Build the linked tree; measure scans, the persisted index, worker PSS and cold reads; print the tables."""
    sources = sorted(glob.glob(os.path.join(args.root, "*", "*.jpg")))
    tree = linked_tree(args.scale_root, args.scale_classes, args.scale_per_class, sources)
    index_dir = f"{args.scale_root.rstrip(os.sep)}-index"
    with probe_server():
        scans = scan_rows(str(tree), index_dir, args.repeats)
        checks = staleness_rows(str(tree), index_dir, args.repeats)
        pss = worker_pss_rows(str(tree), args.scale_epochs, args.scale_batches)
    print(f"\nSuite scale: index of {scans[0]['files']:,} files (hard links, warm metadata), fresh process each\n")
    print("| what | seconds | vs torchvision | MB resident |\n|---|---:|---:|---:|")
    for r in scans:
        print(f"| {r['what']} | {r['seconds']:.2f} | {r['vs_torchvision']:.2f}x | {r['mb']:.0f} |")
    print(
        f"\nTensor cache staleness check at each prepare_data ({checks[0]['files']:,} files in "
        f"{checks[0]['folders']:,} folders, index reused, warm metadata, fresh process each)\n"
    )
    print("| verify_source | seconds | vs files |\n|---|---:|---:|")
    for r in checks:
        print(f"| {r['verify_source']} | {r['seconds']:.2f} | {r['vs_files']:.3f}x |")
    print(
        f"\nWorker PSS over the {scans[0]['files']:,}-file index (2 workers, {args.scale_batches} batches of 64 per "
        "epoch, MB per worker after each epoch)\n"
    )
    print("| loader | PSS per epoch | growth per epoch |\n|---|---|---:|")
    for r in pss:
        per_epoch = " / ".join(f"{x:.0f}" for x in r["worker_pss_mb_per_epoch"])
        print(f"| {r['loader']} | {per_epoch} | {r['growth_mb_per_epoch']:+.1f} MB |")
    cold = cold_read_rows(args)
    print(
        f"\nCold reads: one pass over {args.root} after evicting its files from the page cache, against a warm pass "
        "(2 workers, started each pass)\n"
    )
    print("| loader | warm img/s | cold img/s | cold/warm | MB read per image | MB on disk per image |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in cold:
        print(
            f"| {r['loader']} | {r['warm_images_per_s']:.0f} | {r['cold_images_per_s']:.0f} | "
            f"{r['cold_vs_warm']:.2f} | {r['mb_read_per_image']:.3f} | {r['mb_on_disk_per_image']:.3f} |"
        )
    compact = compact_rows(args)
    print(
        f"\nFormats of the same {args.root} images: size on disk and images/s (2 workers, {args.image_size} px, "
        f"median of {args.repeats} interleaved runs); ImageNet GB = KB per image x 1,281,167\n"
    )
    print("| loader | KB per image | ImageNet GB | images/s | vs baseline |\n|---|---:|---:|---:|---:|")
    for r in compact:
        print(
            f"| {r['loader']} | {r['kb_per_image']:.0f} | {r['imagenet_gb']:.0f} | {r['images_per_s']:.0f} | "
            f"{r['vs_baseline']:.2f}x |"
        )
    report = doctor_row(str(tree), args.scale_doctor_seconds, args.batch_size, args.image_size)
    print(
        f"\n`fastdata doctor` on the {report['files']:,}-file tree (--devices 8 --step-ms 120 --seconds "
        f"{args.scale_doctor_seconds:g}): a sample of {report['sampled']}; the listing comes on top of the budget\n"
    )
    print("| budget | listing | whole run | recommendation |\n|---:|---:|---:|---|")
    print(
        f"| {args.scale_doctor_seconds:g} s | {report['scan_s']:.1f} s | {report['seconds']:.0f} s | "
        f"{report['recommendation']} |"
    )
    return {
        "scan": scans,
        "staleness_check": checks,
        "worker_pss": pss,
        "cold_reads": cold,
        "formats": compact,
        "doctor": report,
    }


def doctor_row(tree: str, seconds: float, batch_size: int, image_size: int) -> dict[str, Any]:
    """``fastdata doctor`` on the whole tree, as for 8 ranks: does it stay within its budget plus the listing?"""
    from lightning_fastdata.diagnose import doctor

    report = doctor(tree, devices=8, batch_size=batch_size, image_size=image_size, seconds=seconds, step_ms=120)
    return {
        "files": report.files,
        "sampled": report.sampled,
        "scan_s": report.scan_s,
        "seconds": report.seconds,
        "budget_s": seconds,
        "recommendation": report.recommendation,
    }
