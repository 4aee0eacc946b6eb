"""The full shuffle of Parquet files against the windowed order, before and after the row-group budget (issue 69).

    python -m benchmarks.parquet_shuffle --json benchmarks/results/parquet-shuffle.json [--roots data/bench ...]

For each image folder (``--roots``; the bench's two sets are generated where missing: the demo-like 500x375
photos and 1000x750 quality-95 ones), its images written as Parquet files of ~16 MB in row groups of 100 rows, then
three ``ShardDataModule`` training loaders on them, interleaved over ``--repeats`` rounds, the same workers, batch
size and crop:

- ``windowed``: the default order (``shuffle_buffer=1000``: windows of row groups, each read once a window);
- ``full shuffle``: ``shuffle_buffer=None``, each worker keeping the row groups it read up to its budget
  (:data:`~lightning_fastdata.datasets.group_reads.FULL_SHUFFLE_CACHE_BYTES`);
- ``full shuffle, no budget``: the same with the budget set to 0 on the built dataset (the code before the
  budget: each worker keeps its last few row groups, so nearly every row reads its row group again).

Loaders keep their workers between passes (``measure.time_loader``), as training with persistent workers does: the
full shuffle's rows after the first pass read nothing where the data fits the budget. The first pass alone is
``first_pass`` (``steady_rate`` is not used: the point is the reads of a whole epoch).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_fastdata.convert.shards import write_parquet_shards
from lightning_fastdata.datamodules.shards import ShardDataModule
from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.measure import count_images, measure, save_results

#: The sets generated where ``--roots`` names a missing folder: (classes, per class, size, quality).
SETS = {"data/bench": (8, 192, (500, 375), 90), "data/bench-large": (4, 192, (1000, 750), 95)}


def unbudgeted(dm: ShardDataModule) -> Any:
    """``dm``'s training loader with its dataset's budget set back to 0 (before its workers start): the code before."""
    loader = dm.train_dataloader()
    dataset = loader.dataset
    assert dataset.cache_bytes > 0  # the loader gave it the budget: take it back
    dataset.cache_bytes = 0
    return loader


def first_pass(make: Callable[[], Any]) -> float:
    """Images/s of one fresh loader's first epoch, its workers' start included."""
    start, n = time.perf_counter(), 0
    for batch in make():
        n += count_images(batch)
    return n / (time.perf_counter() - start)


def root_rows(root: str, scratch: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The three rows of the module docstring on ``root``'s images."""
    if not os.path.isdir(root):
        classes, per_class, size, quality = SETS[root]
        make_image_folder(root, classes, per_class, size, quality, processes=2)
    out = os.path.join(scratch, Path(root).name)
    write_parquet_shards(root, out, shard_bytes=16 * 2**20, rows_per_group=100, overwrite=True)
    kw = dict(index_dir=os.path.join(scratch, "index"), val_fraction=0.0, image_size=224, batch_size=64,
              num_workers=args.workers, entropy_index=False)  # fmt: skip
    modules = {
        "windowed": ShardDataModule(out, **kw),
        "full shuffle": ShardDataModule(out, shuffle_buffer=None, **kw),
        "full shuffle, no budget": ShardDataModule(out, shuffle_buffer=None, **kw),
    }
    makers = {}
    for name, dm in modules.items():
        dm.setup("fit")
        makers[name] = functools.partial(unbudgeted, dm) if name.endswith("no budget") else dm.train_dataloader
    rates = measure([(name, make, count_images) for name, make in makers.items()], args.repeats, 2.0)
    firsts = {name: [first_pass(make) for _ in range(args.repeats)] for name, make in makers.items()}
    base, first_base = statistics.median(rates["windowed"]), statistics.median(firsts["windowed"])
    mb = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".parquet")) / 2**20
    return [
        {
            "root": root,
            "parquet_mb": round(mb),
            "loader": name,
            "num_workers": args.workers,
            "images_per_s": statistics.median(runs),
            "vs_windowed": statistics.median(runs) / base,
            "first_pass_images_per_s": statistics.median(firsts[name]),
            "first_pass_vs_windowed": statistics.median(firsts[name]) / first_base,
            "runs": runs,
            "first_pass_runs": firsts[name],
        }  # fmt: skip
        for name, runs in rates.items()
    ]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Measure, print the table, and save the figures (``--json``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--roots", nargs="+", default=list(SETS))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastdata-parquet-shuffle-") as scratch:
        for root in args.roots:
            rows += root_rows(root, scratch, args)
    print("| images | Parquet MB | order | images/s | vs windowed | first epoch img/s | vs windowed |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['root']} | {r['parquet_mb']} | {r['loader']} | {r['images_per_s']:.0f} | {r['vs_windowed']:.2f}x "
              f"| {r['first_pass_images_per_s']:.0f} | {r['first_pass_vs_windowed']:.2f}x |")  # fmt: skip
    save_results(args.json, args, rows=rows)
    return rows


if __name__ == "__main__":
    main()
