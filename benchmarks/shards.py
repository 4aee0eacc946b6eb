"""The shards suite: tar shards of the bench folder, read by what users write (webdataset + torchvision) and by ours.

Rows, interleaved, the same shards, workers, batch size and crop (``RandomResizedCrop`` + flip):

- ``webdataset + torchvision`` (the baseline): ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode("pil")``
  with torchvision's transforms (``ToTensor`` + ``Normalize``, as the folder suite's baseline), in a ``DataLoader``;
- ``ShardDataModule``: ours on the same shards (uint8 batches, normalised on the device later);
- ``ImageFolderDataModule (same images)``: ours on the folder the shards were written from.

Needs ``pip install webdataset`` (a peer, not a dependency): ``python -m benchmarks.loaders --suites shards``.
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

import torch

from lightning_fastdata import ShardDataModule
from lightning_fastdata.datasets.shard_writer import write_tar_shards
from lightning_fastdata.measure import Candidate, count_images, measure, ours_module, print_table, rows_for

__all__ = ["shards_suite", "webdataset_loader"]


def webdataset_loader(urls: list[str], size: int, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """What webdataset's documentation writes for ImageNet-style training, with the folder baseline's transforms."""
    import webdataset as wds
    from torchvision import transforms

    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = (
        wds.WebDataset(urls, shardshuffle=100, nodesplitter=wds.split_by_node, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(tf, int)
    )
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)


def shards_suite(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of the module docstring at each worker count (shards of ~16 MB written into the scratch folder)."""
    where = os.path.join(args.scratch, "shards")
    shards = [str(p) for p in write_tar_shards(args.root, where, shard_bytes=16 * 2**20)]
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        ours = ShardDataModule(
            where, index_dir=os.path.join(args.scratch, "shard-index"), val_fraction=0.0, image_size=args.image_size,
            batch_size=args.batch_size, num_workers=workers,
        )  # fmt: skip
        ours.prepare_data()
        ours.setup("fit")
        folder = ours_module(args.root, args.image_size, args.batch_size, workers)
        candidates: list[Candidate] = [
            (
                "webdataset + torchvision (shuffle buffer 1000)",
                functools.partial(webdataset_loader, shards, args.image_size, args.batch_size, workers),
                count_images,
            ),
            ("ShardDataModule", ours.train_dataloader, count_images),
            ("ImageFolderDataModule (same images)", folder.train_dataloader, count_images),
        ]
        rows += rows_for(measure(candidates, args.repeats, args.min_seconds), workers, None)
    print_table(rows)
    return rows
