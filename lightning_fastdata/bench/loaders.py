"""Images/s of the baselines users write vs lightning-fastdata's loaders, same data, same run.

    fastdata bench --root data/bench --json benchmarks/results/latest.json --plot docs/benchmark.png
    python -m benchmarks.loaders ...   (the same from a checkout, with the lab's suites: scale, matrix, peers, s3)

Prints one markdown table per suite (median of ``--repeats`` runs, each whole passes over the dataset for at
least ``--min-seconds`` after two warm-up batches, candidates interleaved so drift hits all alike) and writes
the figures as JSON. Every loader keeps its workers between passes (``persistent_workers``; the baselines
too, which is kinder to them than their default), so worker start-up is counted for none.

Suite ``folder`` (rows):

- ``baseline``: torchvision ``ImageFolder`` + ``RandomResizedCrop``, ``RandomHorizontalFlip``, ``ToTensor``,
  ``Normalize`` + plain ``DataLoader`` (what users write today);
- ``ImageFolderDataModule``: our train loader, uint8 batches as they reach the device;
- ``ImageFolderDataModule (exact_decode=True)``: the same with every crop decoded at full size with the exact
  IDCT (no DCT-domain scaling, no fast IDCT): what the defaults gain, in the same run;
- ``ImageFolderDataModule (entropy_index=True)``: the same with each crop entropy-decoded alone, from the
  entropy index built in ``--scratch`` before timing (the same pixels; where the compiled decoder is installed);
- ``ImageFolderDataModule + CPU normalise``: the same, plus the float normalisation in the main process
  (what a CPU-only run pays; on a GPU it runs on the device);
- ``decode ceiling``: one process reading and fully decoding every file (PIL and torchvision's
  ``decode_jpeg``), times the worker count for the "% of ceiling" column.

Suite ``hdf5`` (:mod:`lightning_fastdata.bench.hdf5`): the seed-style user HDF5 dataset vs ``HDF5DataModule`` in raw
and encoded mode, and the folder module for reference.

Suite ``cache`` (:mod:`lightning_fastdata.bench.cache`): the torchvision baseline vs ``TensorCacheDataModule`` with
augmentation in the workers and on the device (loader only: on a CPU-only machine the device crop is not
timed), the one-core memcpy ceiling, and the cache build time per 1,000 images.

Suite ``recipe`` (:mod:`lightning_fastdata.bench.recipe`): a training recipe (``--recipe CONFIG``; default torchvision's
classification reference recipe) through torchvision's reference loader of it and through ours, with the policy in
the workers and on the device, and the device ops' cost per batch on this CPU.

The lab's suites (``scale``, ``matrix``, ``peers``, ``s3``: the package's own measurements on generated trees, other
kinds of JPEG, its peers and a local S3 server) live in the repository's ``benchmarks/`` and run through this same
harness from a checkout (``python -m benchmarks.loaders --suites ...``: :class:`LabSuite`); they are not installed.

Suite ``shards`` (:mod:`lightning_fastdata.bench.shards`): the folder as WebDataset tars and as the hubs' Parquet files,
through webdataset and the hubs' ``datasets`` library (with torchvision's transforms) and through ``ShardDataModule``.

Suite ``callback`` (:mod:`lightning_fastdata.bench.callback`): the step time of the same CPU training run with and
without ``FastDataCallback`` (fast in-memory data, so any overhead of the callback shows).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_fastdata.bench.cache import cache_suite
from lightning_fastdata.bench.callback import callback_suite, snapshot_suite
from lightning_fastdata.bench.captions import add_captions_arguments
from lightning_fastdata.bench.detection import add_detection_arguments
from lightning_fastdata.bench.hdf5 import hdf5_suite
from lightning_fastdata.bench.segmentation import add_segmentation_arguments
from lightning_fastdata.demos import ensure_demo_data
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available
from lightning_fastdata.measure import (
    Candidate,
    baseline_loader,
    count_images,
    count_normalised,
    decode_ceiling,
    measure,
    ours_module,
    print_table,
    rows_for,
)
from lightning_fastdata.measure import machine as measured_on

__all__ = ["SUITES", "LabSuite", "folder_suite", "main", "plot"]


def folder_suite(args: argparse.Namespace, best_ceiling: float) -> list[dict[str, Any]]:
    """Baseline vs ImageFolderDataModule at each worker count."""
    rows: list[dict[str, Any]] = []
    for workers in args.workers:
        dm = ours_module(args.root, args.image_size, args.batch_size, workers)
        exact = ours_module(args.root, args.image_size, args.batch_size, workers, exact_decode=True)
        indexed = None
        if entropy_index_available():
            where = os.path.join(args.scratch, "entropy-index")
            indexed = ours_module(args.root, args.image_size, args.batch_size, workers, entropy_index_dir=where)

        candidates: list[Candidate] = [
            (
                "baseline (torchvision ImageFolder)",
                functools.partial(baseline_loader, args.root, args.image_size, args.batch_size, workers),
                count_images,
            ),
            ("ImageFolderDataModule", dm.train_dataloader, count_images),
            ("ImageFolderDataModule (exact_decode=True)", exact.train_dataloader, count_images),
            ("ImageFolderDataModule + CPU normalise", dm.train_dataloader, count_normalised(dm)),
        ]
        if indexed is not None:
            candidates.insert(2, ("ImageFolderDataModule (entropy_index=True)", indexed.train_dataloader, count_images))
        rows += rows_for(measure(candidates, args.repeats, args.min_seconds), workers, best_ceiling)
    return rows


@dataclass(frozen=True)
class LabSuite:
    """A suite of the repository's lab (``benchmarks/``), run through this harness after the installed suites.

    Args:
        help: What it measures, for ``--suites``'s help.
        add_arguments: Adds its own options to the harness's parser.
        run: Runs it with the parsed options; its figures go to the JSON under its name.
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Any]


#: The suites installed with the package: what a user measures on their own data and recipe.
SUITES = (
    "folder", "hdf5", "cache", "callback", "recipe", "predict", "shards", "segmentation", "detection", "captions",
)  # fmt: skip
#: The suites run when ``--suites`` is not given (segmentation, detection and captions: name them to run them).
DEFAULT_SUITES = SUITES[:-3]


def main(
    argv: list[str] | None = None, lab: Mapping[str, LabSuite] | None = None, prog: str = "fastdata bench"
) -> dict[str, Any]:
    """Run the benchmark; print the tables; return the figures.

    ``lab``: more suites, by name (``python -m benchmarks.loaders`` passes the repository's); none are run by
    default.
    """
    lab = dict(lab or {})
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", default="data/bench", help="image folder (generated if missing)")
    parser.add_argument("--num-classes", type=int, default=8)
    parser.add_argument("--per-class", type=int, default=192, help="images per class when generating")
    parser.add_argument(
        "--suites",
        nargs="+",
        choices=[*SUITES, *lab],
        default=list(DEFAULT_SUITES),
        help="recipe: a training recipe (--recipe) through torchvision's reference loader and ours, at the largest "
        "--workers; segmentation (not run by default): torchvision's segmentation reference loader and ours on "
        "VOC-style scenes (--seg-root: your own); detection (not run by default): torchvision's detection reference "
        "loader and ours, recipes ssd and hflip, on the bench photos with random boxes (--det-root: your COCO folder); "
        "captions (not run by default): webdataset + open_clip's pipeline and ours on the bench photos as "
        "img2dataset shards (--cap-root: your shards)"
        + "".join(f"; {name} (not run by default): {suite.help}" for name, suite in lab.items()),
    )
    parser.add_argument(
        "--recipe",
        default="recipe_torchvision",
        help="recipe suite: a LightningCLI config (file or shipped name) whose data arguments are the recipe "
        "(train_transforms, device_transforms, batch_transforms, image_size, ...); default: torchvision's reference",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=2.0, help="each timed run lasts at least this")
    parser.add_argument(
        "--scratch",
        default=None,
        help="folder for the HDF5 files and caches the suites build from --root (kept, and reused by later runs); "
        "default: a temporary folder, removed at the end. Nothing is ever written in or beside --root.",
    )
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--plot", default=None, help="write a bar chart (PNG) of images/s per loader here")
    add_segmentation_arguments(parser)
    add_detection_arguments(parser)
    add_captions_arguments(parser)
    for suite in lab.values():
        suite.add_arguments(parser)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        if args.scratch is None:
            args.scratch = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="fastdata-bench-"))
        else:
            Path(args.scratch).mkdir(parents=True, exist_ok=True)
        return _run(args, lab)


def _run(args: argparse.Namespace, lab: Mapping[str, LabSuite]) -> dict[str, Any]:
    machine = measured_on()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),  # what the docs' figures say beside each number (benchmarks/figures.py)
        "machine": machine,
        "suites": {},
    }
    if set(args.suites) != {"segmentation"}:  # the image folder's suites: its data and its decode ceiling
        result.update(_folder_data(args))
    else:
        print(f"Machine: {machine}")
    for name, run in _SUITE_RUNS.items():  # in this order, whatever the order asked
        if name in args.suites:
            run(args, result)
    for name, suite in lab.items():
        if name in args.suites:
            result["suites"][name] = suite.run(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)
        print(f"\nPlot written to {args.plot}")
    return result


def _run_folder(args: argparse.Namespace, result: dict[str, Any]) -> None:
    rows = folder_suite(args, max(result["decode_ceiling_1core"].values()))
    print("\nSuite folder: JPEG folder, RandomResizedCrop + flip\n")
    print_table(rows)
    result["suites"]["folder"] = rows


def _run_hdf5(args: argparse.Namespace, result: dict[str, Any]) -> None:
    rows = hdf5_suite(args)
    print("\nSuite hdf5: one HDF5 file (baseline: the seed-style float32 dataset, one read per sample)\n")
    print_table(rows)
    result["suites"]["hdf5"] = rows


def _run_cache(args: argparse.Namespace, result: dict[str, Any]) -> None:
    rows, extra = cache_suite(args)
    print(
        f"\nSuite cache: uint8 tensor cache (256 px squares); memcpy ceiling (1 core, {args.image_size} px "
        f"samples): {extra['memcpy_ceiling_1core']:.0f} img/s; "
        f"build: {extra['build_s_per_1000']:.1f} s per 1,000 images (nan: cache was already built)\n"
    )
    print_table(rows)
    result["suites"]["cache"] = rows
    result["cache"] = extra


def _run_callback(args: argparse.Namespace, result: dict[str, Any]) -> None:
    cb = callback_suite(args)
    print(
        "\nSuite callback: CPU step time of the same run (in-memory data, small CNN, batch 32, medians of 7 "
        f"alternating runs): without FastDataCallback {cb['step_ms_without']:.2f} ms, "
        f"with it {cb['step_ms_with']:.2f} ms "
        f"({cb['overhead_pct']:+.1f}%; runs without {min(cb['runs'][0]):.2f}-{max(cb['runs'][0]):.2f} ms, "
        f"with {min(cb['runs'][1]):.2f}-{max(cb['runs'][1]):.2f} ms); time inside the callback's per-step hooks: "
        f"{cb['hook_us_per_step']:.0f} us per step"
    )
    result["suites"]["callback"] = cb
    snap = snapshot_suite(args)
    print("\nStatefulDataLoader snapshots (tensor cache loader, 2 workers, ms per batch of the loader itself):")
    for name, value in snap["ms_per_batch"].items():
        runs = snap["ms_per_batch_runs"][name]
        print(
            f"  {name}: median {value:.2f} ms ({snap['overhead_pct'][name]:+.1f}% vs no state; "
            f"runs {min(runs):.1f}-{max(runs):.1f} ms)"
        )
    result["suites"]["snapshot"] = snap


def _run_recipe(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from lightning_fastdata.bench.recipe import recipe_suite
    from lightning_fastdata.recipe import load_recipe

    recipe, written = load_recipe(args.recipe)
    print(f"\nSuite recipe: {args.recipe} ({', '.join(f'{k}={v!r}' for k, v in written.items())})\n")
    index_dir = os.path.join(args.scratch, "entropy-index")
    ceiling = result["decode_ceiling_1core"]["PIL"]
    out = recipe_suite(
        args.root, recipe, args.batch_size, max(args.workers), args.repeats, args.min_seconds, ceiling, print, index_dir
    )
    print_table(out["rows"])
    result["suites"]["recipe"] = {**out, "recipe": args.recipe}


def _run_predict(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from lightning_fastdata.bench.predict import predict_suite

    rows = predict_suite(args)
    print("\nSuite predict: trainer.predict's loader (Resize + CenterCrop, in order, no labels needed)\n")
    print_table(rows)
    result["suites"]["predict"] = rows


def _run_shards(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from lightning_fastdata.bench.shards import shards_suite

    print("\nSuite shards: tar and Parquet shards of the folder, what users write vs ours (each to its baseline)\n")
    result["suites"]["shards"] = shards_suite(args)


def _run_segmentation(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from lightning_fastdata.bench.segmentation import segmentation_suite

    print("\nSuite segmentation: torchvision's segmentation reference loader vs ours (images and masks)\n")
    result["suites"]["segmentation"] = segmentation_suite(args)


def _run_detection(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from lightning_fastdata.bench.detection import detection_suite

    print("\nSuite detection: torchvision's detection reference loader vs ours (images and boxes)\n")
    result["suites"]["detection"] = detection_suite(args)


def _run_captions(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from lightning_fastdata.bench.captions import captions_suite

    print("\nSuite captions: webdataset + open_clip's pipeline vs ours (image-text pairs)\n")
    result["suites"]["captions"] = captions_suite(args)


#: Each suite's run (it prints its table and puts its figures in the result), in the order they run.
_SUITE_RUNS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], None]] = {
    "folder": _run_folder,
    "hdf5": _run_hdf5,
    "cache": _run_cache,
    "callback": _run_callback,
    "recipe": _run_recipe,
    "predict": _run_predict,
    "shards": _run_shards,
    "segmentation": _run_segmentation,
    "detection": _run_detection,
    "captions": _run_captions,
}


def _folder_data(args: argparse.Namespace) -> dict[str, Any]:
    """The bench folder (generated if missing), described, and one core's decode ceiling on it."""
    ensure_demo_data(args.root, args.num_classes, args.per_class)
    files = sorted(glob.glob(os.path.join(args.root, "*", "*")))
    mean_kb = statistics.mean(os.path.getsize(f) for f in files) / 1e3
    ceiling_runs = [decode_ceiling(files) for _ in range(args.repeats)]
    ceiling = {k: statistics.median(run[k] for run in ceiling_runs) for k in ("PIL", "decode_jpeg")}
    print(f"\nData: {len(files)} JPEGs in {args.root}, mean {mean_kb:.0f} KB")
    print(
        f"Output: {args.image_size}px, batch {args.batch_size}, "
        f"median of {args.repeats} runs (>= {args.min_seconds:g} s)"
    )
    print(f"Machine: {measured_on()}")
    print(
        f"Decode ceiling (1 core, read + full decode): PIL {ceiling['PIL']:.0f} img/s, "
        f"decode_jpeg {ceiling['decode_jpeg']:.0f} img/s"
    )
    return {
        "data": {"root": args.root, "files": len(files), "mean_kb": mean_kb, "image_size": args.image_size},
        "decode_ceiling_1core": ceiling,
    }


def plot(result: dict[str, Any], path: str) -> None:
    """Speed-up over each suite's baseline, per loader and worker count, on a linear axis (1x: the baseline).

    Ratios, not images/s: the suites' baselines differ (torchvision's ImageFolder for the folder and cache
    suites, the float32 per-sample HDF5 dataset users write for the HDF5 suite), and a ratio measured within
    one run is what holds across machines.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ModuleNotFoundError("--plot needs matplotlib. Run `pip install matplotlib`.") from err
    by_label: dict[str, dict[int, float]] = {}
    for suite, suite_rows in result["suites"].items():
        if not isinstance(suite_rows, list):  # the callback and snapshot suites time steps, not loaders
            continue
        for r in suite_rows:
            if r["loader"].startswith(("baseline", "seed-style")) or "CPU normalise" in r["loader"]:
                continue
            by_label.setdefault(f"[{suite}] {r['loader']}", {})[int(r["num_workers"])] = float(r["vs_baseline"])
    rows = list(by_label.items())
    workers = sorted({w for _, ratios in rows for w in ratios})
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(rows) * max(1, len(workers)) + 2.0))
    height = 0.8 / max(1, len(workers))
    for j, w in enumerate(workers):
        ys = [i + (j - (len(workers) - 1) / 2) * height for i in range(len(rows))]
        values = [ratios.get(w, 0.0) for _, ratios in rows]
        ax.barh(ys, values, height=height, label=f"num_workers={w}")
        for y, v in zip(ys, values):
            if v:
                ax.text(v, y, f" {v:.1f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel(
        "speed-up over the suite's baseline in the same run (the 1x line).\n"
        "Baseline: torchvision ImageFolder + classic transforms; for [hdf5], the 'seed-style' dataset users write\n"
        "(float32 arrays, one read per sample). 'loader only': the crop runs on the GPU later, not timed here.",
        fontsize=8,
    )
    machine = result["machine"].split(", Python")[0]
    ax.set_title(f"lightning-fastdata loaders vs the baseline, {machine}", fontsize=10)
    ax.set_xlim(0, max(v for _, r in rows for v in r.values()) * 1.12)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
