"""The annotations of 100k images in the loader's workers: does each worker's memory grow as it reads them?

A COCO split of ``--images`` tiny JPEGs (one 8 x 8 file each: the annotations are what is measured) and 1-12 boxes
each, read by ``DetectionDataModule``'s training loader with ``--workers`` workers: each worker's private memory
(``Private_Clean + Private_Dirty`` of ``/proc/<pid>/smaps_rollup``: pages of its own, copied from the parent's on
first write, which Python's reference counts do on read) sampled through an epoch. Copy-on-read growth is what
detectron2 serializes its dataset dicts against (``DatasetFromList(serialize=True)``); the source's pairs and COCO's
inline annotations are held so too (``sources.folder.Serialized``). ``--plain`` measures them as Python tuples (the
code before), for the comparison.

    python -m benchmarks.detection_memory --images 100000 --json benchmarks/results/detection-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def write_coco(root: Path, images: int, seed: int = 0) -> Path:
    """``images`` 8 x 8 JPEGs in ``root/train2017`` (one file copied) and their COCO annotations (1-12 boxes)."""
    from io import BytesIO

    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "train2017").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    buf = BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(buf, "JPEG")
    data = buf.getvalue()
    entries, annotations = [], []
    for i in range(images):
        name = f"{i:012d}.jpg"
        (root / "train2017" / name).write_bytes(data)
        entries.append({"id": i + 1, "file_name": name, "width": 8, "height": 8})
        for _ in range(int(rng.integers(1, 13))):
            x, y = rng.uniform(0, 4, 2)
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": int(rng.integers(1, 4)),
                                "bbox": [x, y, 3.0, 3.0], "area": 9.0, "iscrowd": 0})  # fmt: skip
    doc = {"images": entries, "annotations": annotations,
           "categories": [{"id": c, "name": f"c{c}"} for c in (1, 2, 3)]}  # fmt: skip
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(doc))
    return root


def private_mib(pid: int) -> float:
    """A process's private memory (clean + dirty), MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    return (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024


def _workers(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(c) for c in children]


def measure(root: Path, workers: int, batch_size: int, plain: bool) -> dict[str, Any]:
    """One epoch of the training loader; each worker's private memory at its start and through the epoch."""
    from lightning_fastdata import DetectionDataModule
    from lightning_fastdata.sources import folder

    if plain:
        folder.Serialized = tuple  # type: ignore[misc,assignment]  # the code before: Python tuples
    dm = DetectionDataModule(str(root), val_split=None, batch_size=batch_size, num_workers=workers,
                             keep_empty=True, persistent_workers=True)  # fmt: skip
    dm.setup("fit")
    samples: list[tuple[float, list[float]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                kids = _workers(os.getpid())
                samples.append((time.perf_counter(), [private_mib(k) for k in kids]))
            except (FileNotFoundError, ProcessLookupError):
                pass
            time.sleep(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    thread.start()
    seen = 0
    for batch in dm.train_dataloader():
        seen += len(batch.images)
    stop.set()
    thread.join()
    rows = [s for s in samples if len(s[1]) >= workers]
    first = rows[min(2, len(rows) - 1)][1] if rows else []
    peak = [max(s[1][k] for s in rows) for k in range(workers)] if rows else []
    return {"plain": plain, "images": seen, "seconds": round(time.perf_counter() - start, 1),
            "worker_private_mib_early": [round(v, 1) for v in first],
            "worker_private_mib_peak": [round(v, 1) for v in peak],
            "growth_mib": [round(p - f, 1) for p, f in zip(peak, first)],
            "parent_private_mib": round(private_mib(os.getpid()), 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Write the data (a scratch folder), measure with the serialized pairs, then plain, each in a fresh process."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json", default=None)
    p.add_argument("--root", default=None, help="an existing folder written by this script (kept)")
    p.add_argument("--one", choices=["serialized", "plain"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:  # a child: one measurement, printed as JSON
        print(json.dumps(measure(Path(args.root), args.workers, args.batch_size, args.one == "plain")))
        return {}
    import subprocess

    with tempfile.TemporaryDirectory(prefix="fastdata-detmem-", dir="data") as tmp:
        root = Path(args.root) if args.root else write_coco(Path(tmp) / "coco", args.images)
        results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "images": args.images, "workers": args.workers}
        for kind in ("serialized", "plain"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.detection_memory", "--root", str(root),
                                  "--workers", str(args.workers), "--batch-size", str(args.batch_size),
                                  "--one", kind], capture_output=True, text=True, check=True)  # fmt: skip
            results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
            print(kind, results[kind])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
