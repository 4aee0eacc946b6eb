"""Cache suite: the tensor cache (both augmentation placements) vs the torchvision baseline and memcpy."""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import numpy as np

from lightning_fastdata.bench.scratch import scratch_path
from lightning_fastdata.datamodules.cache import TensorCacheDataModule
from lightning_fastdata.measure import Candidate, baseline_loader, count_images, measure, memcpy_ceiling, rows_for

__all__ = ["cache_suite"]


def cache_suite(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Baseline vs cache (workers, device placement); plus the memcpy ceiling and the build time."""
    cache_dir = scratch_path(args, "cache256")
    build_s = 0.0
    modules = {}
    for placement in ("workers", "device"):
        modules[placement] = {
            w: TensorCacheDataModule(
                args.root,
                str(cache_dir),
                cache_size=256,
                augment_on=placement,
                image_size=args.image_size,
                batch_size=args.batch_size,
                num_workers=w,
                val_fraction=0.0,
            )
            for w in args.workers
        }
    first = modules["workers"][args.workers[0]]
    if not (cache_dir / "manifest.json").exists():
        start = time.perf_counter()
        first.prepare_data()
        build_s = time.perf_counter() - start
    for by_workers in modules.values():
        for dm in by_workers.values():
            dm.setup("fit")
    images = np.load(cache_dir / "train_images.npy", mmap_mode="r")
    n = len(images)
    extra = {
        "memcpy_ceiling_1core": memcpy_ceiling(np.asarray(images), args.batch_size, args.image_size, args.repeats),
        "build_s_per_1000": 1000 * build_s / n if build_s else float("nan"),
    }
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        candidates: list[Candidate] = [
            (
                "baseline (torchvision ImageFolder)",
                functools.partial(baseline_loader, args.root, args.image_size, args.batch_size, workers),
                count_images,
            ),
            ("TensorCacheDataModule, augment in workers", modules["workers"][workers].train_dataloader, count_images),
            (
                "TensorCacheDataModule, augment on device (loader only)",
                modules["device"][workers].train_dataloader,
                count_images,
            ),
        ]
        for row in rows_for(measure(candidates, args.repeats, args.min_seconds), workers, None):
            row["pct_of_memcpy_ceiling"] = 100 * row["images_per_s"] / (extra["memcpy_ceiling_1core"] * max(1, workers))
            rows.append(row)
    return rows, extra
