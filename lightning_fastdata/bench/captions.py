"""Suite ``captions``: webdataset + torchvision as open_clip trains vs ``ImageTextDataModule``, the same shards.

Rows, interleaved in one measurement, the same tar shards (img2dataset's layout: ``key.jpg``, ``key.txt``,
``key.json``), workers, batch size and tokenizer:

- ``webdataset + open_clip's pipeline`` (the baseline): what open_clip's ``get_wds_dataset`` builds: the shards
  shuffled, ``wds.shuffle(1000)`` of samples, ``decode("pilrgb")``, ``to_tuple("jpg;png;jpeg;webp", "txt")``, its
  training ``image_transform`` (``RandomResizedCrop(image_size, scale=(0.9, 1.0))`` bicubic, ``ToTensor``,
  ``Normalize`` with CLIP's mean and std) and the tokenizer on each caption, batched in the workers
  (``wds.batched``), a ``WebLoader``;
- ``ImageTextDataModule``: ours (uint8 batches, the crop decoded alone, the tokenizer in the workers; normalisation
  is the device's).

The tokenizer is a stand-in with open_clip's output shape (:class:`~lightning_fastdata.captions.text.HashTokenizer`;
open_clip is not a dependency): the same callable in both. ``--cap-root`` measures a folder of the user's shards;
by default the suite writes the bench photos (``--root``'s first ``--cap-images``) as shards of 256 pairs with made
captions. The ceiling beside them: one core reading and fully decoding each image
(:func:`~lightning_fastdata.measure.ceiling_img_s`).
"""

from __future__ import annotations

import argparse
import functools
import glob
import io
import json
import os
import statistics
import tarfile
from typing import Any

from lightning_fastdata.captions.datamodule import ImageTextDataModule
from lightning_fastdata.captions.text import HashTokenizer
from lightning_fastdata.measure import Candidate, ceiling_img_s, measure_one_thread, print_table, rows_for

__all__ = ["add_captions_arguments", "captions_suite", "webdataset_loader", "write_bench_shards"]

#: CLIP's normalisation (open_clip's OPENAI_DATASET_MEAN / STD).
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def write_bench_shards(photos: list[str], root: str, per_shard: int = 256) -> str:
    """``photos`` as img2dataset's shards in ``root`` (``key.jpg``, ``key.txt``, ``key.json``); returns ``root``."""
    os.makedirs(root, exist_ok=True)
    for s in range(0, len(photos), per_shard):
        path = os.path.join(root, f"{s // per_shard:05d}.tar")
        with tarfile.open(path + ".tmp", "w") as tf:
            for k, photo in enumerate(photos[s : s + per_shard], start=s):
                with open(photo, "rb") as f:
                    image = f.read()
                caption = f"a photo of a {os.path.basename(os.path.dirname(photo))} number {k} in a bench set"
                meta = {"caption": caption, "url": f"file://{photo}", "key": f"{k:09d}"}
                for ext, data in (("jpg", image), ("txt", caption.encode()), ("json", json.dumps(meta).encode())):
                    info = tarfile.TarInfo(f"{k:09d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        os.replace(path + ".tmp", path)
    return root


def webdataset_loader(root: str, image_size: int, batch_size: int, workers: int, tokenizer: Any) -> Any:
    """open_clip's training loader over ``root``'s shards (module docstring)."""
    import webdataset as wds
    from torchvision import transforms as T

    preprocess = T.Compose([
        T.RandomResizedCrop(image_size, scale=(0.9, 1.0), interpolation=T.InterpolationMode.BICUBIC),
        lambda im: im.convert("RGB"), T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD),
    ])  # fmt: skip
    urls = sorted(glob.glob(os.path.join(root, "*.tar")))
    pipeline = (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
        .shuffle(1000)
        .decode("pilrgb")
        .to_tuple("jpg;png;jpeg;webp", "txt")
        .map_tuple(preprocess, tokenizer)
        .batched(batch_size, partial=True)
    )
    return wds.WebLoader(pipeline, batch_size=None, shuffle=False, num_workers=workers,
                         persistent_workers=workers > 0)  # fmt: skip


def _count(batch: Any) -> int:
    return len(batch[0])


def add_captions_arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's own options (``fastdata bench --suites captions``)."""
    group = parser.add_argument_group("captions suite")
    group.add_argument("--cap-root", default=None, help="a folder of img2dataset tar shards (default: the photos')")
    group.add_argument("--cap-images", type=int, default=1024, help="bench photos written as shards")
    group.add_argument("--cap-batch-size", type=int, default=64)
    group.add_argument("--cap-image-size", type=int, default=224)


def captions_suite(args: argparse.Namespace) -> dict[str, Any]:
    """The rows of the module docstring at each ``--workers``, with the decode ceiling; printed and returned."""
    root = args.cap_root
    photos = sorted(glob.glob(os.path.join(args.root, "*", "*.jpg")))[: args.cap_images]
    if root is None:
        root = write_bench_shards(photos, os.path.join(args.scratch, f"pairs-{args.cap_images}"))
    pairs = sum(1 for p in glob.glob(os.path.join(root, "*.tar")) for m in tarfile.open(p) if m.name.endswith(".txt"))
    mean_kb = statistics.mean(os.path.getsize(f) for f in photos) / 1e3 if photos else 0.0
    ceiling = ceiling_img_s(photos, args.repeats, 1)
    print(f"Data: {pairs} pairs in {root}, images mean {mean_kb:.0f} KB; batch {args.cap_batch_size}")
    print(f"Decode ceiling (1 core, read + full decode, the faster of PIL and decode_jpeg): {ceiling:.0f} img/s")
    tokenizer = HashTokenizer()
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        dm = ImageTextDataModule(root, text_transform=tokenizer, image_size=args.cap_image_size,
                                 batch_size=args.cap_batch_size, num_workers=workers,
                                 index_dir=os.path.join(args.scratch, "pairs-index"))  # fmt: skip
        dm.setup("fit")
        candidates: list[Candidate] = [
            ("webdataset + open_clip's pipeline",
             functools.partial(webdataset_loader, root, args.cap_image_size, args.cap_batch_size, workers, tokenizer),
             _count),
            ("ImageTextDataModule", dm.train_dataloader, _count),
        ]  # fmt: skip
        rates = measure_one_thread(candidates, args.repeats, args.min_seconds)
        rows += rows_for(rates, workers, ceiling)
    print_table(rows)
    return {"data": {"root": root, "pairs": pairs, "mean_kb": mean_kb}, "decode_ceiling_1core": ceiling,
            "rows": rows}  # fmt: skip
