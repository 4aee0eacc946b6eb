"""Suite ``shards``: the bench folder as WebDataset tars and as the hubs' Parquet, read by what users write and by ours.

Rows, all interleaved in one measurement, the same images, workers, batch size and crop (``RandomResizedCrop`` +
flip), each format's ratio to its own baseline:

- ``webdataset + torchvision`` (the tar baseline): ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode("pil")``
  with torchvision's transforms (``ToTensor`` + ``Normalize``, as the folder suite's baseline), in a ``DataLoader``;
- ``ShardDataModule (tar)``: ours on the same tar shards (uint8 batches, normalised on the device later);
- ``datasets + torchvision`` (the Parquet baseline): the hubs' ``datasets`` library on the same Parquet files
  (``load_dataset("parquet", ...)``, its Arrow cache built before timing) with ``with_transform`` applying the same
  torchvision transforms to its decoded PIL images, in a shuffled ``DataLoader``;
- ``ShardDataModule (parquet)``: ours on the same Parquet files (row groups of 100 rows, windows of 1,000 rows);
- ``ShardDataModule (parquet, full shuffle)``: the same files in a full shuffle (``shuffle_buffer=None``: each batch
  from nearly every row group, each worker keeping the row groups it read up to its budget);
- ``ShardDataModule (tar, entropy_index=True)``: the tar row with each crop entropy-decoded alone, from the shards'
  entropy index built before timing (where the compiled decoder is installed);
- ``ImageFolderDataModule (same images)``: ours on the folder the shards were written from.

Our rows other than the entropy index's run without it (``entropy_index=False``), as the folder suite's do.

The peers are not dependencies: a baseline whose library is missing is left out, and said so
(``pip install webdataset datasets``).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
from typing import Any

import torch

from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards
from lightning_fastdata.datamodules.shards import ShardDataModule
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available
from lightning_fastdata.measure import Candidate, count_images, measure, ours_module

__all__ = ["hub_loader", "shards_suite", "webdataset_loader"]

#: The rows' names.
WDS = "webdataset + torchvision (shuffle buffer 1000)"
HUB = "datasets + torchvision (with_transform)"
OURS_TAR = "ShardDataModule (tar)"
OURS_PARQUET = "ShardDataModule (parquet)"
OURS_PARQUET_FULL = "ShardDataModule (parquet, full shuffle)"
OURS_TAR_INDEXED = "ShardDataModule (tar, entropy_index=True)"
FOLDER = "ImageFolderDataModule (same images)"
#: Each row's baseline (the folder row is compared with the tar baseline, as before).
BASELINE = {
    WDS: WDS,
    OURS_TAR: WDS,
    OURS_TAR_INDEXED: WDS,
    FOLDER: WDS,
    HUB: HUB,
    OURS_PARQUET: HUB,
    OURS_PARQUET_FULL: HUB,
}


def _transform(size: int) -> Any:
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )


def webdataset_loader(urls: list[str], size: int, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """What webdataset's documentation writes for ImageNet-style training, with the folder baseline's transforms."""
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=100, nodesplitter=wds.split_by_node, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(_transform(size), int)
    )
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)


def _hub_transform(tf: Any, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {"pixel_values": [tf(image.convert("RGB")) for image in batch["image"]], "label": batch["label"]}


def _hub_collate(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([r["pixel_values"] for r in rows]), torch.tensor([r["label"] for r in rows])


def hub_loader(hub: Any, size: int, batch_size: int, workers: int) -> torch.utils.data.DataLoader:
    """What the hubs' image-classification guides write: ``with_transform`` and a shuffled ``DataLoader``."""
    ds = hub.with_transform(functools.partial(_hub_transform, _transform(size)))
    return torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=workers, collate_fn=_hub_collate,
        persistent_workers=workers > 0,
    )  # fmt: skip


def _load_hub(files: list[str], cache_dir: str) -> Any:
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache_dir)


def shards_suite(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of the module docstring at each worker count (shards of ~16 MB written into the scratch folder)."""
    tar_dir, parquet_dir = os.path.join(args.scratch, "shards"), os.path.join(args.scratch, "parquet")
    # the suite's own scratch: written anew each run (a second run on the same --scratch was refused)
    shards = [str(p) for p in write_tar_shards(args.root, tar_dir, shard_bytes=16 * 2**20, overwrite=True)]
    files = [str(p) for p in write_parquet_shards(args.root, parquet_dir, shard_bytes=16 * 2**20, overwrite=True)]
    missing = [name for name in ("webdataset", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"shards suite: {' and '.join(missing)} not installed, their baseline left out (pip install {missing})")
    hub = None if "datasets" in missing else _load_hub(files, os.path.join(args.scratch, "hub-cache"))
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        kw = dict(
            index_dir=os.path.join(args.scratch, "shard-index"), val_fraction=0.0, image_size=args.image_size,
            batch_size=args.batch_size, num_workers=workers,
        )  # fmt: skip
        tar = ShardDataModule(tar_dir, entropy_index=False, **kw)
        parquet = ShardDataModule(parquet_dir, entropy_index=False, **kw)
        full = ShardDataModule(parquet_dir, entropy_index=False, shuffle_buffer=None, **kw)
        modules = [tar, parquet, full]
        indexed = None
        if entropy_index_available():
            indexed = ShardDataModule(tar_dir, entropy_index=True, **kw)  # built in prepare_data, before timing
            modules.append(indexed)
        for dm in modules:
            dm.prepare_data()
            dm.setup("fit")
        folder = ours_module(args.root, args.image_size, args.batch_size, workers)
        candidates: list[Candidate] = []
        if "webdataset" not in missing:
            loader = functools.partial(webdataset_loader, shards, args.image_size, args.batch_size, workers)
            candidates.append((WDS, loader, count_images))
        candidates.append((OURS_TAR, tar.train_dataloader, count_images))
        if indexed is not None:
            candidates.append((OURS_TAR_INDEXED, indexed.train_dataloader, count_images))
        if hub is not None:
            candidates.append((HUB, functools.partial(hub_loader, hub, args.image_size, args.batch_size, workers),
                               count_images))  # fmt: skip
        candidates += [
            (OURS_PARQUET, parquet.train_dataloader, count_images),
            (OURS_PARQUET_FULL, full.train_dataloader, count_images),
            (FOLDER, folder.train_dataloader, count_images),
        ]
        rates = measure(candidates, args.repeats, args.min_seconds)
        for name, runs in rates.items():
            base = rates.get(BASELINE[name])
            rate = statistics.median(runs)
            ratio = rate / statistics.median(base) if base else None
            rows.append({"loader": name, "num_workers": workers, "images_per_s": rate, "vs_baseline": ratio,
                         "baseline": BASELINE[name] if base else None, "runs": runs})  # fmt: skip
    print("| loader | num_workers | images/s | vs its baseline |\n|---|---:|---:|---:|")
    for r in rows:
        shown = "-" if r["vs_baseline"] is None else f"{r['vs_baseline']:.2f}x"
        print(f"| {r['loader']} | {r['num_workers']} | {r['images_per_s']:.0f} | {shown} |")
    return rows
