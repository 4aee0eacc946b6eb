"""The CPU side of ``decode_on="device"``: how fast the loader workers plan batches for the GPU vs decode them.

    python -m benchmarks.device_decode_cpu --json benchmarks/results/device-decode-cpu.json

With ``decode_on="device"`` the workers read each JPEG's header, draw its crop and send the bytes; the GPU decodes.
Their rate is what the device decode can be fed at most from these CPUs; the workers' own decode
(``decode_on="workers"``) is what the GPU is fed without it. Both are timed as batches leaving the loader (same
folder, workers, batch and crop), interleaved over ``--rounds``, on the demo's kind of photo (500x375 q90) and on
large quality-95 ones (1000x750), each generated once under ``data/`` if missing. No GPU is used: the GPU's side is
the GPU check's ``device-decode`` part (``scripts/gpu-check.sh device-decode``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.measure import count_images, time_loader

__all__ = ["main"]

#: name -> (folder, size, quality)
SETS = {
    "photo 500x375 q90": ("data/bench-decode-500x375-q90", (500, 375), 90),
    "photo 1000x750 q95": ("data/bench-decode-1000x750-q95", (1000, 750), 95),
}


def _folder(root: str, size: tuple[int, int], quality: int) -> str:
    if not (Path(root) / ".complete").exists():
        make_image_folder(root, num_classes=4, per_class=96, size=size, quality=quality, processes=os.cpu_count() or 1)
        (Path(root) / ".complete").touch()
    return root


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.device_decode_cpu``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_decode_cpu", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0, help="each loader's timed span")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    runs: dict[str, dict[str, list[float]]] = {}
    for k in range(args.rounds):
        order = ("workers", "device") if k % 2 == 0 else ("device", "workers")
        for name, (root, size, quality) in SETS.items():
            for decode_on in order:
                dm = ImageFolderDataModule(
                    _folder(root, size, quality), image_size=args.image_size, batch_size=args.batch_size,
                    num_workers=args.workers, val_fraction=0, entropy_index=False, decode_on=decode_on,  # type: ignore[arg-type]
                )  # fmt: skip
                dm.setup("fit")
                rate = time_loader(dm.train_dataloader, count_images, min_seconds=args.seconds)
                runs.setdefault(name, {}).setdefault(decode_on, []).append(round(rate, 1))
                print(f"round {k} {name} decode_on={decode_on}: {rate:.0f} img/s", flush=True)
    rows = []
    for name, by in runs.items():
        decode, plan = statistics.median(by["workers"]), statistics.median(by["device"])
        rows.append(
            {"set": name, "workers_decode_img_s": decode, "workers_plan_img_s": plan,
             "plan_vs_decode": round(plan / decode, 2), "runs": by}
        )  # fmt: skip
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "settings": vars(args),
        "rows": rows,
    }
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(
            f"{row['set']}: workers decode {row['workers_decode_img_s']:.0f} img/s, plan for the GPU "
            f"{row['workers_plan_img_s']:.0f} img/s ({row['plan_vs_decode']:.2f}x)"
        )
    return result


if __name__ == "__main__":
    main()
