"""HDF5 suite: the seed-style user dataset vs ``HDF5DataModule`` (raw and encoded), same images, same run."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_fastdata import HDF5DataModule, convert_folder_to_hdf5
from lightning_fastdata.bench.scratch import scratch_path
from lightning_fastdata.loading.atomic import atomic_path
from lightning_fastdata.measure import Candidate, count_images, measure, ours_module, rows_for

__all__ = ["SeedStyleH5", "bench_files", "hdf5_suite"]


class SeedStyleH5(Dataset):
    """What users write first: float32 N x 3 x H x W stored pre-resized, one read per ``__getitem__``.

    The file is opened lazily (the one fix everybody learns after the ``fork`` error), but each sample is a
    separate h5py read, converted and collated per sample.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: Any = None
        with h5py.File(path, "r") as f:
            self.n = len(f["labels"])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return torch.from_numpy(self.file["images"][i]), int(self.file["labels"][i])


def bench_files(args: argparse.Namespace) -> dict[str, Path]:
    """Build the three files from the benchmark folder, once per scratch folder."""
    out = {
        "raw": scratch_path(args, "raw256.h5"),
        "encoded": scratch_path(args, "encoded.h5"),
        "seed": scratch_path(args, "seed.h5"),
    }
    if not out["encoded"].exists():
        convert_folder_to_hdf5(args.root, out["encoded"], mode="encoded")
    if not out["raw"].exists():
        convert_folder_to_hdf5(args.root, out["raw"], mode="raw", size=256)
    if not out["seed"].exists():
        size = args.image_size
        with h5py.File(out["raw"], "r") as src:
            n, labels = len(src["labels"]), src["labels"][()]
            with atomic_path(out["seed"], fsync=False) as tmp, h5py.File(tmp, "w") as f:
                images = f.create_dataset("images", shape=(n, 3, size, size), dtype=np.float32)
                for start in range(0, n, 128):
                    x = torch.from_numpy(src["images"][start : start + 128]).permute(0, 3, 1, 2).float() / 255
                    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
                    images[start : start + len(x)] = x.numpy()
                f.create_dataset("labels", data=labels)
    return out


def hdf5_suite(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Seed-style vs ours (raw, encoded) vs the folder module, at each worker count."""
    files = bench_files(args)

    def seed_loader(workers: int) -> DataLoader:
        return DataLoader(
            SeedStyleH5(str(files["seed"])),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        modules = {
            kind: HDF5DataModule(
                str(files[kind]),
                image_size=args.image_size,
                batch_size=args.batch_size,
                num_workers=workers,
                val_fraction=0.0,
            )
            for kind in ("raw", "encoded")
        }
        for dm in modules.values():
            dm.setup("fit")
        folder = ours_module(args.root, args.image_size, args.batch_size, workers)
        candidates: list[Candidate] = [
            ("seed-style HDF5 (float32, per-sample reads)", functools.partial(seed_loader, workers), count_images),
            ("HDF5DataModule raw (uint8 256px, random resized crop)", modules["raw"].train_dataloader, count_images),
            ("HDF5DataModule encoded (JPEG bytes)", modules["encoded"].train_dataloader, count_images),
            ("ImageFolderDataModule (same JPEGs, for reference)", folder.train_dataloader, count_images),
        ]
        rows += rows_for(measure(candidates, args.repeats, args.min_seconds), workers, None)
    return rows
