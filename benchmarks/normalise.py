"""What does normalising a uint8 batch to float cost on the CPU, and how much of it is fresh memory?

A CPU-only training step (and every "CPU normalise" row of the benchmarks) turns each uint8 batch into float32:
128 images at 224 px are 77 MB of output. Timed on one core, one torch thread, channels-last input, medians of
interleaved rounds, per image:

- ``plain``: ``images.to(float32).mul_(scale).add_(shift)`` (``Normalizer`` before this benchmark);
- ``into reused memory``: the same operations into a buffer written before (what they cost without page faults;
  not a design: a reused buffer could overwrite a batch the caller kept);
- ``huge pages (now)``: ``Normalizer``: fresh output advised ``MADV_HUGEPAGE``, then the same operations.

    python -m benchmarks.normalise --json benchmarks/results/normalise.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import record
from lightning_fastdata.augment.normalize import Normalizer


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=5, help="batches per round and design")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    normalizer = Normalizer()
    scale, shift = normalizer._constants(torch.device("cpu"))
    images = torch.randint(0, 256, (args.batch_size, 3, args.size, args.size), dtype=torch.uint8)
    images = images.contiguous(memory_format=torch.channels_last)
    reused = torch.empty_like(images, dtype=torch.float32)
    designs: dict[str, Callable[[], torch.Tensor]] = {
        "plain": lambda: images.to(torch.float32).mul_(scale).add_(shift),
        "into reused memory": lambda: reused.copy_(images).mul_(scale).add_(shift),
        "huge pages (now)": lambda: normalizer(images),
    }
    want = designs["plain"]()
    for name, fn in designs.items():
        assert torch.equal(fn(), want), f"{name} differs from the plain conversion"
    ms: dict[str, list[float]] = {name: [] for name in designs}
    for _ in range(args.rounds):
        for name, fn in designs.items():
            start = time.perf_counter()
            for _ in range(args.reps):
                fn()
            ms[name].append((time.perf_counter() - start) / (args.reps * args.batch_size) * 1e3)
    rows = {name: {"ms_per_image": statistics.median(v), "runs": [round(x, 4) for x in v]} for name, v in ms.items()}
    print(f"| normalise ({args.batch_size} x 3 x {args.size} x {args.size}, one core) | ms per image (median) |")
    print("|---|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['ms_per_image']:.3f} |")
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return record(
        args.json,
        "timed on one, one torch thread",
        transparent_hugepage=thp.read_text().strip() if thp.exists() else "n/a",
        batch=[args.batch_size, 3, args.size, args.size],
        rows=rows,
    )


if __name__ == "__main__":
    main()
