"""What building the entropy index costs per file, next to what decoding a training crop costs, on one core.

    python -m benchmarks.index_cost --json benchmarks/results/index-cost.json [--kinds ...] [--files 200]

For each kind of JPEG of the matrix (``benchmarks.matrix.KINDS``, generated into ``--scratch``), the
same files and the same ``RandomResizedCrop(224)`` boxes, interleaved over ``--repeats`` rounds, one thread:

- ``build``: the index of one file (``index_file``: the walk over all its entropy-coded data, what the background
  build, ``entropy_index=True`` and any build inside the loader workers pay per file);
- ``crop``: the crop decoded and resized as the default module decodes it without an index (region of interest);
- ``crop_indexed``: the same crop with the file's index.

Whether the index can be built while training without slowing the first epoch is ``build / crop``: a build inside
the workers adds that share to every first-epoch sample; the background build is paced instead (2.5% of busy
CPUs, ``loading/jpeg/pace.py``), so on a machine the loader saturates it ends after about ``build / crop / 0.025``
epochs (18 at 0.45), whatever the number of CPUs (issue 36).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.matrix import KINDS, make_kind
from lightning_fastdata.augment.geometry import CROP_DRAWS, random_resized_crop_box
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop
from lightning_fastdata.loading.jpeg.entropy_index import index_file
from lightning_fastdata.measure import save_results


def kind_row(folder: Path, kind: str, files: int, repeats: int) -> dict[str, Any]:
    """Median milliseconds per file of each step on ``files`` files of ``folder``."""
    datas = [Path(f).read_bytes() for f in sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))[:files]]
    indexes = [index_file(d) or None for d in datas]
    out = torch.empty(3, 224, 224, dtype=torch.uint8)

    def boxes(r: int) -> list[Any]:  # one RandomResizedCrop box per file and round, the same for both crop rows
        rngs = [np.random.default_rng(1000 * r + i) for i in range(len(datas))]
        return [lambda w, h, g=g: random_resized_crop_box(g.random(CROP_DRAWS), w, h) for g in rngs]

    steps = {
        "build": lambda d, i, box: index_file(d),
        "crop": lambda d, i, box: decode_resized_crop(d, out, box),
        "crop_indexed": lambda d, i, box: decode_resized_crop(d, out, box, entropy_index=indexes[i]),
    }
    ms: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(repeats):
        for name, step in steps.items():
            fns = boxes(r)
            began = time.perf_counter()
            for i, d in enumerate(datas):
                step(d, i, fns[i])
            ms[name].append(1000 * (time.perf_counter() - began) / len(datas))
    med = {name: round(statistics.median(v), 3) for name, v in ms.items()}
    return {
        "kind": kind,
        "files": len(datas),
        "kb_per_file": round(sum(map(len, datas)) / len(datas) / 1000, 1),
        "indexed_files": sum(i is not None for i in indexes),
        "ms_per_file": med,
        "build_vs_crop": round(med["build"] / med["crop"], 3),
        "crop_indexed_vs_crop": round(med["crop_indexed"] / med["crop"], 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_kinds = ["photo 500x375 q90", "photo 1000x750 q95", "photo 800x600 q90 4:4:4", "photo 256x192 q75"]
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=default_kinds)
    parser.add_argument("--files", type=int, default=200, help="files per kind")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (the median is reported)")
    parser.add_argument("--scratch", default="/tmp/fastdata-index-cost", help="where the kinds are generated")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for kind in args.kinds:
        row = kind_row(make_kind(args.scratch, kind, args.files), kind, args.files, args.repeats)
        m = row["ms_per_file"]
        print(
            f"{kind:28s} build {m['build']:.3f} ms, crop {m['crop']:.3f} ms ({row['build_vs_crop']:.2f} of it), "
            f"crop with the index {m['crop_indexed']:.3f} ms ({row['crop_indexed_vs_crop']:.2f})"
        )
        rows.append(row)
    return save_results(args.json, args, kinds=rows)


if __name__ == "__main__":
    main()
