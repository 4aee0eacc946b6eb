"""torchvision's reference training recipe: its own loader against ours, on the same folder, in one interleaved run.

The recipe (torchvision's ``references/classification``, the ResNet-50 ``IMAGENET1K_V2`` flags): RandomResizedCrop
176 + flip, TrivialAugmentWide (bilinear), RandomErasing 0.1, MixUp 0.2 or CutMix 1.0 per batch. Rows:

- ``torchvision reference loader``: what its ``train.py`` builds: ``ImageFolder`` (PIL decode), v2
  ``RandomResizedCrop(176, antialias)``, flip, ``TrivialAugmentWide``, ``PILToTensor``, ``ToDtype``, ``Normalize``,
  ``RandomErasing(0.1)``, MixUp/CutMix in the ``collate_fn``; plain ``DataLoader`` (persistent workers, so worker
  start-up is not counted against it);
- ``ours, policy in workers``: ``ImageFolderDataModule(image_size=176, train_transforms=v2.TrivialAugmentWide(...),
  batch_transforms=[RandomErasing(0.1), RandomChoice(MixUp, CutMix)])``, twice: its batches through the
  DataModule's ``on_after_batch_transfer`` on this CPU (normalise, erase, mix: what a CPU-only step pays, and the
  same output as the reference's), and the loader alone (what the workers sustain when a GPU does the rest);
- ``ours, policy on the device (loader only)``: the same with ``device_transforms=TrivialAugmentWide(...)``: the
  loader hands out uint8 crops and their keys; what the device then does is timed apart (``device ops per batch``,
  here on this CPU, one thread) and on a GPU by ``scripts/gpu-check.sh`` when one is lent;
- ``ours, RandomResizedCrop + flip only``: the recipe-less row, for reference;
- the ceiling: one core's full JPEG decode (PIL), times the workers.

    python -m benchmarks.recipe --root /tmp/recipe-bench --json benchmarks/results/recipe.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate
from torchvision import datasets
from torchvision.transforms import v2

from benchmarks import record
from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.augment import RandomErasing, TrivialAugmentWide
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.measure import (
    Candidate,
    count_images,
    count_normalised,
    decode_ceiling,
    measure,
    print_table,
    rows_for,
)

BILINEAR = v2.InterpolationMode.BILINEAR


def mix(num_classes: int) -> v2.Transform:
    return v2.RandomChoice(
        [v2.MixUp(alpha=0.2, num_classes=num_classes), v2.CutMix(alpha=1.0, num_classes=num_classes)]
    )


def reference_loader(root: str, size: int, batch_size: int, workers: int) -> DataLoader:
    """torchvision's ``ClassificationPresetTrain`` (PIL backend) and its MixUp/CutMix ``collate_fn``."""
    preset = v2.Compose(
        [
            v2.RandomResizedCrop(size, interpolation=BILINEAR, antialias=True),
            v2.RandomHorizontalFlip(0.5),
            v2.TrivialAugmentWide(interpolation=BILINEAR),
            v2.PILToTensor(),
            v2.ToDtype(torch.float, scale=True),
            v2.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
            v2.RandomErasing(0.1),
            v2.ToPureTensor(),
        ]
    )
    ds = datasets.ImageFolder(root, transform=preset)
    mixing = mix(len(ds.classes))

    def collate(batch: Any) -> Any:
        return mixing(*default_collate(batch))

    return DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0, collate_fn=collate
    )


def ours(root: str, size: int, batch_size: int, workers: int, where: str) -> ImageFolderDataModule:
    kw: dict[str, Any] = {}
    if where == "workers":
        kw["train_transforms"] = v2.TrivialAugmentWide(interpolation=BILINEAR)
    elif where == "device":
        kw["device_transforms"] = TrivialAugmentWide(interpolation="bilinear")
    if where != "none":
        kw["batch_transforms"] = [RandomErasing(0.1), v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)])]
    dm = ImageFolderDataModule(
        root,
        image_size=size,
        batch_size=batch_size,
        num_workers=workers,
        val_fraction=0.0,
        persistent_workers=True,
        **kw,
    )
    dm.setup("fit")
    return dm


def device_cost(dm: ImageFolderDataModule, batches: int = 6) -> float:
    """Milliseconds per batch of ``on_after_batch_transfer`` (policy, normalise, erase, mix) on this CPU, one thread."""
    loader = dm.train_dataloader()
    got = [b for _, b in zip(range(batches), loader)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for batch in got:
            start = time.perf_counter()
            dm.on_after_batch_transfer(batch, 0)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="where the generated photo-like JPEG folder is made (or reused)")
    p.add_argument("--num-classes", type=int, default=8)
    p.add_argument("--per-class", type=int, default=96)
    p.add_argument("--image-size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=3.0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    root = Path(a.root) / "train"
    if not root.exists():
        make_image_folder(root, num_classes=a.num_classes, per_class=a.per_class, size=(500, 375))
    files = sorted(str(f) for f in root.glob("*/*.jpg"))
    ceiling = decode_ceiling(files[:200])["PIL"]
    r, s, b, w = str(root), a.image_size, a.batch_size, a.workers
    in_workers, on_device, plain = ours(r, s, b, w, "workers"), ours(r, s, b, w, "device"), ours(r, s, b, w, "none")
    candidates: list[Candidate] = [
        ("torchvision reference loader", lambda: reference_loader(r, s, b, w), count_images),
        (
            "ours, policy in workers (+ normalise, erase, mix on this CPU)",
            in_workers.train_dataloader,
            count_normalised(in_workers),
        ),
        ("ours, policy in workers (loader only)", in_workers.train_dataloader, count_images),
        ("ours, policy on the device (loader only)", on_device.train_dataloader, count_images),
        ("ours, RandomResizedCrop + flip only", plain.train_dataloader, count_normalised(plain)),
    ]
    rates = measure(candidates, repeats=a.repeats, min_seconds=a.min_seconds)
    rows = rows_for(rates, w, ceiling)
    print_table(rows)
    cost = device_cost(on_device)
    print(f"device ops per batch of {b} on this CPU (one thread): {cost:.1f} ms ({1000 * b / cost:.0f} images/s)")
    print(f"decode ceiling (one core, PIL full decode): {ceiling:.0f} images/s")
    return record(
        a.json,
        f"{w} workers, batch {b}, {s} px, {len(files)} photo-like 500x375 JPEGs",
        rows=rows,
        device_ops_ms_per_batch_cpu=cost,
        decode_ceiling_per_core=ceiling,
    )


if __name__ == "__main__":
    main()
