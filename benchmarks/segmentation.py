"""Segmentation loaders (issue 63, first measurement): torchvision's segmentation reference loader vs our dataset.

One interleaved run on the same VOC-style scenes (``fastdata make-data --task segmentation``: photo-like 500x375
JPEGs, q90, with palette PNG masks), the same workers, batch size, base size (520) and crop (480):

- ``torchvision reference``: the reference's training preset as its ``--use-v2`` path builds it: PIL image and
  mask, ``RandomResize(0.5 x base, 2 x base)``, ``RandomHorizontalFlip(0.5)``, ``RandomCrop(crop)`` padded (image
  0, mask 255), ``ToImage``, ``ToDtype(float, scale)``, ``Normalize``, the mask to int64; a plain ``DataLoader``;
- ``SegmentationFolderDataset``: ours, loader only (uint8 images and masks; normalisation is the device's);
- ``SegmentationFolderDataset + CPU normalise``: the same, normalised to float on the CPU in the main process (the
  DataModules' ``Normalizer``) and the masks made int64 (what a CPU-only step pays).

    python -m benchmarks.segmentation --json benchmarks/results/segmentation.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_fastdata.augment.normalize import Normalizer
from lightning_fastdata.datasets.segmentation import SegmentationFolderDataset
from lightning_fastdata.demos_segmentation import SEGMENTATION_CLASSES, make_segmentation_folder
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.measure import Candidate, machine, measure, print_table, rows_for

__all__ = ["ReferenceSegmentation", "main"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ReferenceSegmentation(torch.utils.data.Dataset):
    """torchvision's segmentation reference dataset and training preset (module docstring), on a VOC-style folder."""

    def __init__(self, root: Path, base_size: int, crop_size: int) -> None:
        from torchvision import tv_tensors
        from torchvision.transforms import v2

        self.root = root
        self.ids = (root / "ImageSets" / "Segmentation" / "train.txt").read_text().split()
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
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = Image.open(self.root / "JPEGImages" / f"{self.ids[i]}.jpg").convert("RGB")
        mask = self.tv_tensors.Mask(
            torch.from_numpy(np.asarray(Image.open(self.root / "SegmentationClass" / f"{self.ids[i]}.png")))
        )
        return self.transform(image, mask)


def _reference(root: Path, args: argparse.Namespace) -> Any:
    ds = ReferenceSegmentation(root, args.base_size, args.crop_size)
    return torch.utils.data.DataLoader(
        ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, persistent_workers=args.workers > 0
    )


def _ours(root: Path, args: argparse.Namespace) -> Any:
    ds = SegmentationFolderDataset(root, "train", num_classes=len(SEGMENTATION_CLASSES), base_size=args.base_size,
                                   crop_size=args.crop_size)  # fmt: skip
    sampler = EpochSampler(len(ds), shuffle=True, seed=0)
    return PrefetchingDataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers, collate_fn=collate_prebatched,
        persistent_workers=args.workers > 0,
    )  # fmt: skip


def _count(batch: Any) -> int:
    return len(batch[0])


_NORMALIZE = Normalizer(MEAN, STD)


def _count_normalised(batch: Any) -> int:
    """Our CPU step's work: the images normalised to float (the DataModules' Normalizer), the masks to int64."""
    _NORMALIZE(batch[0])
    batch[1].long()
    return len(batch[0])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Generate the scenes, time the rows; print the table, write ``--json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--base-size", type=int, default=520)
    p.add_argument("--crop-size", type=int, default=480)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=3.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fastdata-seg-bench-") as tmp:
        root = make_segmentation_folder(Path(tmp) / "voc", count=args.images, val_fraction=0.0)
        kb = (
            np.mean(
                [
                    len((root / "JPEGImages" / f).read_bytes())
                    for f in sorted(p.name for p in (root / "JPEGImages").iterdir())
                ]
            )
            / 1e3
        )
        candidates: list[Candidate] = [
            ("torchvision reference (v2, PIL)", lambda: _reference(root, args), _count),
            ("SegmentationFolderDataset (loader only)", lambda: _ours(root, args), _count),
            ("SegmentationFolderDataset + CPU normalise", lambda: _ours(root, args), _count_normalised),
        ]
        rates = measure(candidates, args.repeats, args.min_seconds)
    rows = rows_for(rates, args.workers, None)
    print_table(rows)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "data": {"images": args.images, "mean_kb": float(kb), "size": "~500x375 q90 + palette PNG masks"},
        "args": vars(args),
        "rows": rows,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
