"""Predict suite: ``trainer.predict``'s loader against torchvision ``ImageFolder`` + ``Resize``/``CenterCrop``."""

from __future__ import annotations

import argparse
import functools
from typing import Any

import torch

from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.measure import Candidate, count_images, count_normalised, measure, rows_for

__all__ = ["predict_loader_baseline", "predict_suite"]


def predict_loader_baseline(root: str, size: int, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """What users write to predict today: ``ImageFolder`` + ``Resize(size / 0.875)`` + ``CenterCrop`` + normalise."""
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [
            transforms.Resize(round(size / 0.875)),
            transforms.CenterCrop(size),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = datasets.ImageFolder(root, transform=tf)
    return torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=False, num_workers=workers, persistent_workers=workers > 0
    )


def predict_suite(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The baseline, then ``ImageFolderDataModule(predict_root=...)``'s ``predict_dataloader``, interleaved.

    Ours twice: as it leaves the loader (uint8, normalised on the device), and normalised on this CPU, as the
    baseline is; at each worker count.
    """
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        dm = ImageFolderDataModule(
            args.root,
            predict_root=args.root,
            val_fraction=0.0,
            image_size=args.image_size,
            batch_size=args.batch_size,
            num_workers=workers,
        )
        dm.setup("predict")
        candidates: list[Candidate] = [
            (
                "baseline (torchvision ImageFolder, Resize + CenterCrop)",
                functools.partial(predict_loader_baseline, args.root, args.image_size, args.batch_size, workers),
                count_images,
            ),
            ("ImageFolderDataModule predict_dataloader", dm.predict_dataloader, count_images),
            ("ImageFolderDataModule predict_dataloader + CPU normalise", dm.predict_dataloader, count_normalised(dm)),
        ]
        rows += rows_for(measure(candidates, args.repeats, args.min_seconds), workers, None)
    return rows
