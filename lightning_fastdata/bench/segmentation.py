"""Suite ``segmentation``: torchvision's segmentation reference loader vs ``SegmentationDataModule``, same scenes.

Rows, interleaved in one measurement, the same images and masks, workers, batch size, base size and crop:

- ``torchvision reference (v2, PIL)`` (the baseline): the reference's training preset as its ``--use-v2`` path
  builds it: PIL image and mask, ``RandomResize(0.5 x base, 2 x base)``, ``RandomHorizontalFlip(0.5)``,
  ``RandomCrop(crop)`` padded (image 0, mask 255), ``ToImage``, ``ToDtype(float, scale)``, ``Normalize``, the mask to
  int64; a plain shuffled ``DataLoader``;
- ``SegmentationDataModule (loader only)``: ours (uint8 images and masks; normalisation is the device's);
- ``SegmentationDataModule + CPU normalise``: the same batches through the DataModule's device side on the CPU, in
  the main process (``on_after_batch_transfer``: normalised float images, channels-last, int64 masks): what a
  CPU-only training step pays;
- ``SegmentationDataModule (HDF5, encoded)``: the same scenes' bytes in one HDF5 file
  (:func:`~lightning_fastdata.segmentation.convert.write_segmentation_hdf5`), loader only;
- ``SegmentationDataModule (cache_dir: decoded once)``: the same scenes decoded once at the base size into the
  module's cache (built before timing), loader only: no decode at all;
- ``SegmentationDataModule (entropy_index)``: the folder with its training images' entropy index (built before
  timing): each crop entropy-decoded alone, loader only.

The main process measures with one intra-op thread (``torch.set_num_threads(1)``, restored after): on a machine with as
many CPUs as workers, torch's other threads spin between operations on the CPUs the workers decode on
(``FastDataCallback`` caps them so while training on an accelerator). The ceiling beside them: one core reading and
fully decoding each image and its mask (PIL), no augmentation. ``--seg-root`` measures a VOC-style folder of the user's;
by default the suite writes photo-like scenes (``fastdata make-data --task segmentation``) of ``--seg-size`` at
``--seg-quality`` in the scratch folder.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import time
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.datamodules.segmentation import SegmentationDataModule
from lightning_fastdata.measure import Candidate, measure_one_thread, print_table, rows_for
from lightning_fastdata.segmentation.convert import write_segmentation_hdf5
from lightning_fastdata.segmentation.demos import make_segmentation_folder
from lightning_fastdata.segmentation.layouts import find_pairs

__all__ = ["ReferenceSegmentation", "add_segmentation_arguments", "segmentation_suite"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
REFERENCE = "torchvision reference (v2, PIL)"
OURS = "SegmentationDataModule (loader only)"
OURS_NORMALISED = "SegmentationDataModule + CPU normalise"
OURS_HDF5 = "SegmentationDataModule (HDF5, encoded)"
OURS_CACHE = "SegmentationDataModule (cache_dir: decoded once)"
OURS_INDEXED = "SegmentationDataModule (entropy_index)"


class ReferenceSegmentation(torch.utils.data.Dataset):
    """torchvision's segmentation reference dataset and training preset (module docstring), on a VOC-style folder."""

    def __init__(self, root: str, base_size: int, crop_size: int, split: str = "train") -> None:
        from torchvision import tv_tensors
        from torchvision.transforms import v2

        pairs = find_pairs(root, split, "voc")
        self.files = [(os.path.join(root, i), os.path.join(root, m)) for i, m in zip(pairs.images, pairs.payloads)]
        self.tv_tensors = tv_tensors
        self.transform = v2.Compose(
            [
                v2.RandomResize(int(0.5 * base_size), int(2.0 * base_size)),
                v2.RandomHorizontalFlip(0.5),
                v2.RandomCrop(crop_size, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
                v2.ToImage(),
                v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64, "others": None}, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, mask_path = self.files[i]
        image = Image.open(image_path).convert("RGB")
        mask = self.tv_tensors.Mask(torch.from_numpy(np.array(Image.open(mask_path))))
        return self.transform(image, mask)


def _reference(root: str, args: argparse.Namespace, workers: int) -> Any:
    ds = ReferenceSegmentation(root, args.base_size, args.crop_size)
    return torch.utils.data.DataLoader(
        ds, batch_size=args.seg_batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )


def _module(root: str, args: argparse.Namespace, workers: int, num_classes: int, **kw: Any) -> SegmentationDataModule:
    dm = SegmentationDataModule(
        root, num_classes=num_classes, base_size=args.base_size, crop_size=args.crop_size, val_split=None,
        batch_size=args.seg_batch_size, num_workers=workers, persistent_workers=workers > 0, **kw,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _count(batch: Any) -> int:
    return len(batch[0])


def _count_normalised(dm: SegmentationDataModule) -> Any:
    """Our CPU step's work: the DataModule's device side on the CPU (normalised images, int64 masks)."""

    def consume(batch: Any) -> int:
        return len(dm.on_after_batch_transfer(batch, 0)[0])

    return consume


def decode_ceiling(root: str, seconds: float = 2.0) -> float:
    """Images/s of one core reading and fully decoding each training image and its mask (PIL), no augmentation."""
    pairs = find_pairs(root, "train", "voc")
    files = [(os.path.join(root, i), os.path.join(root, m)) for i, m in zip(pairs.images, pairs.payloads)]
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or done == 0:
        image_path, mask_path = files[done % len(files)]
        with open(image_path, "rb") as f, open(mask_path, "rb") as g:
            Image.open(io.BytesIO(f.read())).convert("RGB").load()
            Image.open(io.BytesIO(g.read())).load()
        done += 1
    return done / (time.perf_counter() - start)


def add_segmentation_arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's own options (``fastdata bench --suites segmentation``)."""
    group = parser.add_argument_group("segmentation suite")
    group.add_argument("--seg-root", default=None, help="a VOC-style folder to measure (default: generated scenes)")
    group.add_argument("--seg-images", type=int, default=256, help="scenes to generate")
    group.add_argument("--seg-size", default="500x375", help="generated scenes' size, WIDTHxHEIGHT")
    group.add_argument("--seg-quality", type=int, default=90, help="generated scenes' JPEG quality")
    group.add_argument("--seg-batch-size", type=int, default=8)
    group.add_argument("--base-size", type=int, default=520, help="the reference's --base-size")
    group.add_argument("--crop-size", type=int, default=480, help="the reference's --crop-size")


def segmentation_suite(args: argparse.Namespace) -> dict[str, Any]:
    """The rows of the module docstring at each ``--workers``, with the decode ceiling; printed and returned."""
    root = args.seg_root
    num_classes = 21
    if root is None:
        width, height = (int(v) for v in args.seg_size.lower().split("x"))
        root = os.path.join(args.scratch, f"scenes-{args.seg_size}-q{args.seg_quality}-{args.seg_images}")
        if not os.path.isfile(os.path.join(root, "ImageSets", "Segmentation", "train.txt")):
            make_segmentation_folder(root, count=args.seg_images, size=(width, height), quality=args.seg_quality,
                                     val_fraction=0.0, fixed_size=True)  # fmt: skip
    files = find_pairs(root, "train", "voc").images
    mean_kb = statistics.mean(os.path.getsize(os.path.join(root, f)) for f in files) / 1e3
    h5 = None
    if args.seg_root is None:
        h5 = str(write_segmentation_hdf5(root, ["train"], os.path.join(args.scratch, f"{os.path.basename(root)}.h5")))
    ceiling = statistics.median(decode_ceiling(root, args.min_seconds) for _ in range(args.repeats))
    print(f"Data: {len(files)} scenes in {root}, mean {mean_kb:.0f} KB; base {args.base_size}, crop {args.crop_size}")
    print(f"Decode ceiling (1 core, read + full decode of image and mask): {ceiling:.0f} img/s")
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        dm = _module(root, args, workers, num_classes)
        candidates: list[Candidate] = [
            (REFERENCE, functools.partial(_reference, root, args, workers), _count),
            (OURS, dm.train_dataloader, _count),
            (OURS_NORMALISED, dm.train_dataloader, _count_normalised(dm)),
        ]
        if h5 is not None:
            candidates.append((OURS_HDF5, _module(h5, args, workers, num_classes).train_dataloader, _count))
        cache = os.path.join(args.scratch, "segmentation-cache")
        candidates.append(
            (OURS_CACHE, _module(root, args, workers, num_classes, cache_dir=cache).train_dataloader, _count)
        )
        index = os.path.join(args.scratch, "segmentation-index")  # built by prepare_data, before the timing
        indexed = _module(root, args, workers, num_classes, entropy_index=True, index_dir=index)
        candidates.append((OURS_INDEXED, indexed.train_dataloader, _count))
        rates = measure_one_thread(candidates, args.repeats, args.min_seconds)
        rows += rows_for(rates, workers, ceiling)
    print_table(rows)
    return {"data": {"root": root, "images": len(files), "mean_kb": mean_kb}, "decode_ceiling_1core": ceiling,
            "rows": rows}  # fmt: skip
