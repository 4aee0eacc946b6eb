"""Shards read in place from a bucket vs the same shards on the local disk (issue 62's ">= 0.9x local").

One interleaved run: the same JPEGs as tar shards and as Parquet files (~16 MB each), on the local disk and uploaded
to a SeaweedFS server on 127.0.0.1, read by :class:`~lightning_fastdata.ShardDataModule` from the disk, from
``s3://`` direct, and from ``s3://`` through a proxy that adds ``--delay-ms`` before every request (a bucket in a
remote region). The shards' indexes are built before timing (kept locally, as a run's second epoch finds them).

``--kind captions``: the same photos as image-caption pairs in img2dataset's tar layout
(:func:`~lightning_fastdata.bench.captions.write_bench_shards`), read by
:class:`~lightning_fastdata.ImageTextDataModule` with the bench's stand-in tokenizer in the workers (issue 71's
">= 0.9x local").

``--kind detection``: generated COCO scenes (``--images`` of them, 500x375) as tar shards of ``key.jpg`` +
``key.json`` (:func:`~lightning_fastdata.detection.convert.write_detection_shards`), read by
:class:`~lightning_fastdata.DetectionDataModule` (the ``hflip`` recipe); the bucket rows twice: in runs of members
shuffled in windows (``shuffle_buffer``, the default) and a request an image (``shuffle_buffer=None``, the read
before runs reached detection and segmentation shards).

With ``--pin`` (the default) the loader (this process and its workers) runs on CPU 0 and the server and the proxy on
CPU 1, so the server does not take the loader's CPU: the local rows run on the same one CPU.

    python -m benchmarks.shards_s3 --json benchmarks/results/shards-s3.json
    python -m benchmarks.shards_s3 --kind captions --json benchmarks/results/captions-s3.json
    python -m benchmarks.shards_s3 --kind detection --json benchmarks/results/detection-s3.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.fault_proxy import fault_proxy
from benchmarks.s3 import _pin_process
from benchmarks.s3_server import local_s3_server, upload_folder
from lightning_fastdata.bench.captions import write_bench_shards
from lightning_fastdata.captions.datamodule import ImageTextDataModule
from lightning_fastdata.captions.text import HashTokenizer
from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards
from lightning_fastdata.datamodules.shards import ShardDataModule
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.detection.convert import write_detection_shards
from lightning_fastdata.detection.datamodule import DetectionDataModule
from lightning_fastdata.detection.demos import make_detection_folder
from lightning_fastdata.measure import Candidate, count_images, machine, measure

__all__ = ["main"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build the shards, start the server and the proxy, time every row; print the table, write ``--json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1536, help="JPEGs to generate (8 classes, ~500x375 q90)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=3.0)
    p.add_argument("--no-pin", dest="pin", action="store_false", help="loader, server and proxy share the CPUs")
    p.add_argument("--kind", choices=["images", "captions", "detection"], default="images",
                   help="captions: image-text pairs; detection: COCO scenes' images and boxes")  # fmt: skip
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    measured_on = machine()  # before pinning: the machine's CPUs, not the loader's one
    if threading.current_thread() is threading.main_thread():  # a SIGTERM stops the server through `finally`
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            raise SystemExit("shards_s3: pinning needs 2 CPUs (the loader on one, the server and proxy on the other)")
        loader_cpu, server_cpu = sorted(os.sched_getaffinity(0))[:2]
        os.sched_setaffinity(0, {loader_cpu})
        torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastdata-shards-s3-") as tmp:
        if args.kind == "detection":  # ~16 MB shards of scenes and their boxes
            scenes = make_detection_folder(Path(tmp) / "coco", count=args.images, size=(500, 375), val_fraction=0.0)
            shards = write_detection_shards(scenes, "train2017", Path(tmp) / "det" / "train", shard_bytes=16 * 2**20)
            folders = {"detection tar": shards[0].parent.parent}
        else:
            root = make_image_folder(Path(tmp) / "train", num_classes=8, per_class=args.images // 8, processes=2)
            if args.kind == "captions":  # ~180 pairs a shard (~16 MB), img2dataset's layout
                photos = sorted(str(f) for f in root.rglob("*.jpg"))
                folders = {"pairs": Path(write_bench_shards(photos, str(Path(tmp) / "pairs"), per_shard=180))}
            else:
                folders = {
                    "tar": write_tar_shards(root, Path(tmp) / "tar", shard_bytes=16 * 2**20)[0].parent,
                    "parquet": write_parquet_shards(root, Path(tmp) / "parquet", shard_bytes=16 * 2**20)[0].parent,
                }
        with local_s3_server(Path(tmp) / "s3") as s3, fault_proxy(s3.endpoint, delay=args.delay_ms / 1000) as slow:
            if args.pin:
                for pid in (s3.pid, slow.pid):
                    _pin_process(pid, server_cpu)
            kw = dict(val_fraction=0.0, image_size=args.size, batch_size=args.batch_size, num_workers=args.workers)
            kw["entropy_index"] = False  # the reads compared, the decode the same everywhere
            caption_kw = {k: v for k, v in kw.items() if k not in ("val_fraction", "entropy_index")}
            candidates: list[Candidate] = []
            for fmt, folder in folders.items():
                url = s3.url(f"shards-{fmt}")
                upload_folder(folder, url, s3.storage_options())
                sources = [
                    (f"{fmt}, local disk", str(folder), None),
                    (f"{fmt}, s3 direct", url, s3.storage_options()),
                    (f"{fmt}, s3 +{args.delay_ms:g} ms/request", url, s3.storage_options(slow.endpoint)),
                ]
                if args.kind == "detection":  # the same reads a request an image, as before runs
                    sources += [(f"{name} (a request an image)", src, opt) for name, src, opt in sources[1:]]
                for name, source, options in sources:
                    index = str(Path(tmp) / "idx" / name)
                    dm: Any
                    if args.kind == "captions":
                        dm = ImageTextDataModule(source, text_transform=HashTokenizer(), index_dir=index,
                                                 storage_options=options, **caption_kw)  # fmt: skip
                    elif args.kind == "detection":
                        buffer = None if name.endswith("(a request an image)") else 1000
                        dm = DetectionDataModule(source, layout="shards", index_dir=index, storage_options=options,
                                                 shuffle_buffer=buffer, batch_size=args.batch_size,
                                                 num_workers=args.workers)  # fmt: skip
                    else:
                        dm = ShardDataModule(source, index_dir=index, storage_options=options, **kw)
                    dm.prepare_data()
                    dm.setup("fit")
                    # a detection batch's second field is its boxes (a BoxBatch), so its images are counted
                    candidates.append(
                        (name, dm.train_dataloader, _count_first if args.kind == "detection" else count_images)
                    )
            rates = measure(candidates, args.repeats, args.min_seconds)
    for name, runs in rates.items():
        local = statistics.median(rates[name.split(",")[0] + ", local disk"])
        rate = statistics.median(runs)
        rows.append({"loader": name, "num_workers": args.workers, "images_per_s": rate, "vs_local": rate / local,
                     "runs": runs})  # fmt: skip
    print("| shards | images/s | vs local |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['loader']} | {r['images_per_s']:.0f} | {r['vs_local']:.2f}x |")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": measured_on + (", loader on 1 CPU, server and proxy on the other" if args.pin else ""),
        "args": vars(args),
        "rows": rows,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def _count_first(batch: Any) -> int:
    """The images of a batch whose first field is its images (a detection ``Batch``: the boxes are not a count)."""
    return len(batch[0])


if __name__ == "__main__":
    main()
