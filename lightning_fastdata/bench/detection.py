"""Suite ``detection``: torchvision's detection reference loader vs ``DetectionDataModule``, same images and boxes.

Rows, interleaved in one measurement, the same COCO-layout folder, workers and batch size, for each recipe of
``--det-recipes`` (each of ours against the reference loader of the same recipe):

- ``torchvision reference (<recipe>)`` (the baseline): what the reference's ``train.py`` builds with ``--use-v2``:
  ``CocoDetection`` wrapped by ``wrap_dataset_for_transforms_v2``, its ``presets.py`` preset on PIL images
  (``"ssd"``: ``RandomPhotometricDistort``, ``RandomZoomOut`` onto the mean colour, ``RandomIoUCrop``, the flip;
  ``"hflip"``: the flip), ``PILToTensor``, ``ConvertBoundingBoxFormat(XYXY)``, ``SanitizeBoundingBoxes``; for
  ``"ssd"`` the model's ``Resize((300, 300))`` added, as ours outputs; uint8 images (normalisation is the
  device's in both), its ``collate_fn`` (lists of images and targets) and a shuffled ``DataLoader``;
- ``DetectionDataModule (<recipe>)``: ours (uint8 batches, the boxes packed; the device makes the lists);
- ``DetectionDataModule (<recipe>, cache)``: ours from the decoded cache (``cache_dir``, built before the timing;
  ``--det-cache-size`` its shorter side, by default each image as it is): no decode, the same recipe.

``--det-root`` measures a COCO-layout folder of the user's (its ``train2017`` split); by default the suite copies
the bench photos (``--root``'s first ``--det-images``) into the scratch folder as ``train2017/`` with 2-6 random
boxes each of three sparse categories: photo-like JPEGs, where the decode is the work. The ceiling beside them: one
core reading and fully decoding each image (the faster of PIL and ``decode_jpeg``, as every suite's,
:func:`~lightning_fastdata.measure.ceiling_img_s`). The main process measures with one intra-op thread.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import shutil
import statistics
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.detection.datamodule import DetectionDataModule
from lightning_fastdata.measure import Candidate, ceiling_img_s, measure_one_thread, print_table, rows_for

__all__ = ["add_detection_arguments", "detection_suite", "reference_loader", "write_bench_coco"]

#: The reference's zoom-out fill (``presets.py``: ``mean = (123.0, 117.0, 104.0)``).
MEAN = (123.0, 117.0, 104.0)


def write_bench_coco(photos: list[str], root: str, seed: int = 0) -> str:
    """``photos`` copied to ``root/train2017`` with 2-6 random boxes each (COCO ids 1, 3, 5); returns ``root``."""
    images_dir = os.path.join(root, "train2017")
    os.makedirs(images_dir, exist_ok=True)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    rng = np.random.default_rng(seed)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for k, path in enumerate(photos):
        name = f"{k:012d}.jpg"
        shutil.copyfile(path, os.path.join(images_dir, name))
        with Image.open(path) as im:
            w, h = im.size
        images.append({"id": k + 1, "file_name": name, "width": w, "height": h})
        for _ in range(int(rng.integers(2, 7))):
            bw, bh = rng.uniform(0.1, 0.5) * w, rng.uniform(0.1, 0.5) * h
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            category = int(rng.choice([1, 3, 5]))
            annotations.append({"id": len(annotations) + 1, "image_id": k + 1, "category_id": category,
                                "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})  # fmt: skip
    doc = {"images": images, "annotations": annotations,
           "categories": [{"id": c, "name": n} for c, n in ((1, "a"), (3, "b"), (5, "c"))]}  # fmt: skip
    with open(os.path.join(root, "annotations", "instances_train2017.json"), "w") as f:
        json.dump(doc, f)
    return root


def _reference_transforms(recipe: str) -> Any:
    from torchvision import tv_tensors
    from torchvision.transforms import v2 as T

    steps: list[Any] = []
    if recipe == "ssd":
        fill = {tv_tensors.Image: MEAN, tv_tensors.Mask: 0, "others": MEAN}
        steps += [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=fill), T.RandomIoUCrop()]
    steps += [T.RandomHorizontalFlip(0.5), T.PILToTensor()]
    if recipe == "ssd":
        steps.append(T.Resize((300, 300)))
    steps += [T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY), T.SanitizeBoundingBoxes(),
              T.ToPureTensor()]  # fmt: skip
    return T.Compose(steps)


def _collate(batch: list[Any]) -> tuple[Any, ...]:
    return tuple(zip(*batch))  # the reference's utils.collate_fn


def reference_loader(root: str, recipe: str, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """Torchvision's detection reference's training loader of ``recipe`` on ``root``'s ``train2017`` (docstring)."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    ds = CocoDetection(os.path.join(root, "train2017"), os.path.join(root, "annotations", "instances_train2017.json"),
                       transforms=_reference_transforms(recipe))  # fmt: skip
    ds = wrap_dataset_for_transforms_v2(ds, target_keys=("boxes", "labels", "image_id"))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                                       collate_fn=_collate, persistent_workers=workers > 0)  # fmt: skip


def _count(batch: Any) -> int:
    return len(batch[0])


def add_detection_arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's own options (``fastdata bench --suites detection``)."""
    group = parser.add_argument_group("detection suite")
    group.add_argument("--det-root", default=None, help="a COCO-layout folder to measure (default: the bench photos)")
    group.add_argument("--det-images", type=int, default=256, help="bench photos to copy with random boxes")
    group.add_argument("--det-batch-size", type=int, default=16)
    group.add_argument("--det-recipes", nargs="+", default=["ssd", "hflip"], choices=["ssd", "hflip"])
    group.add_argument("--det-cache-size", type=int, default=None, help="the cache's shorter side (default: as is)")


def detection_suite(args: argparse.Namespace) -> dict[str, Any]:
    """The rows of the module docstring at each ``--workers``, with the decode ceiling; printed and returned."""
    root = args.det_root
    if root is None:
        photos = sorted(glob.glob(os.path.join(args.root, "*", "*.jpg")))[: args.det_images]
        root = write_bench_coco(photos, os.path.join(args.scratch, f"coco-{args.det_images}"))
    files = sorted(glob.glob(os.path.join(root, "train2017", "*.jpg")))
    mean_kb = statistics.mean(os.path.getsize(f) for f in files) / 1e3
    ceiling = ceiling_img_s(files, args.repeats, 1)
    print(f"Data: {len(files)} images in {root}, mean {mean_kb:.0f} KB; batch {args.det_batch_size}")
    print(f"Decode ceiling (1 core, read + full decode, the faster of PIL and decode_jpeg): {ceiling:.0f} img/s")
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        for recipe in args.det_recipes:
            settings: dict[str, Any] = dict(data_augmentation=recipe, val_split=None, batch_size=args.det_batch_size,
                            num_workers=workers)  # fmt: skip
            dm = DetectionDataModule(root, **settings)
            dm.setup("fit")
            cache = os.path.join(args.scratch, "detection-cache")
            cached = DetectionDataModule(root, cache_dir=cache, cache_size=args.det_cache_size, **settings)
            cached.prepare_data()  # built before the timing
            cached.setup("fit")
            candidates: list[Candidate] = [
                (f"torchvision reference ({recipe})",
                 functools.partial(reference_loader, root, recipe, args.det_batch_size, workers), _count),
                (f"DetectionDataModule ({recipe})", dm.train_dataloader, _count),
                (f"DetectionDataModule ({recipe}, cache)", cached.train_dataloader, _count),
            ]  # fmt: skip
            rates = measure_one_thread(candidates, args.repeats, args.min_seconds)
            rows += rows_for(rates, workers, ceiling)
    print_table(rows)
    return {"data": {"root": root, "images": len(files), "mean_kb": mean_kb}, "decode_ceiling_1core": ceiling,
            "rows": rows}  # fmt: skip
