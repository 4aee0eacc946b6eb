"""What an install without the compiled decoder costs: the default folder loader with it and without it.

    python -m benchmarks.no_decoder --json benchmarks/results/no-decoder.json [--root DIR ...]

Whether the decoder loads is decided at import (``FASTDATA_DISABLE_DECODER=1`` turns it off, as a failed build
leaves it), so each measurement is a child process, alternated with and without it (``--repeats`` of each), on the
same folder: ``ImageFolderDataModule`` with its defaults (with the decoder, the entropy index built before timing:
epochs 2+; without it there is none) and the torchvision baseline for scale, 2 workers, batch 64, RandomResizedCrop
224 + flip. The ratio (without / with) is what ``lightning_fastdata._ext.native.WITHOUT_DECODER_SPEED``, the
install message and the training warning say.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def child(root: str, index_dir: str, workers: int, batch: int, seconds: float) -> dict[str, float]:
    """One process's rates (images/s) of the baseline and of our default module."""
    from lightning_fastdata._ext.native import entropy_index_available
    from lightning_fastdata.measure import baseline_loader, count_images, ours_module, time_loader

    ours = ours_module(root, 224, batch, workers, entropy_index_dir=index_dir if entropy_index_available() else None)
    return {
        "baseline": time_loader(lambda: baseline_loader(root, 224, batch, workers), count_images, min_seconds=seconds),
        "ours": time_loader(ours.train_dataloader, count_images, min_seconds=seconds),
    }


def main() -> None:
    """Alternate the child processes; print and write the medians and the ratio per folder."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", nargs="+", default=["data/bench"], help="JPEG class folders")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=4.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "INDEX_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.workers, args.batch_size, args.min_seconds)))
        return
    from lightning_fastdata.measure import save_results

    results = []
    with tempfile.TemporaryDirectory(prefix="fastdata-no-decoder-") as scratch:
        for root in args.root:
            runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
            index_dir = os.path.join(scratch, Path(root).name)
            for _ in range(args.repeats):
                for name in ("with", "without"):
                    env = dict(os.environ, FASTDATA_DISABLE_DECODER="1" if name == "without" else "0")
                    command = [sys.executable, "-m", "benchmarks.no_decoder", "--child", root, index_dir]
                    command += ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
                    command += ["--min-seconds", str(args.min_seconds)]
                    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                    runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            keys = ("baseline", "ours")
            med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
            ratio = med["without"]["ours"] / med["with"]["ours"]
            results.append({"root": root, "medians": med, "runs": runs, "without_vs_with": ratio})
            print(
                f"{root}: ours with the decoder {med['with']['ours']:.0f} img/s, without {med['without']['ours']:.0f} "
                f"({ratio:.2f}x); baseline {med['with']['baseline']:.0f} / {med['without']['baseline']:.0f}"
            )
    save_results(args.json, args, skip=("json", "child"), folders=results)


if __name__ == "__main__":
    main()
