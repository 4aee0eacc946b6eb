"""The ``fastdata`` command: LightningCLI (``fit``, ...) and ``demo``, ``config``, ``convert``, ``doctor``, ....

Configs ship inside the package (``lightning_fastdata/configs/``; the repository's ``configs/`` holds the same
files): ``--config imagefolder`` finds the shipped ``imagefolder.yaml`` from any directory, and
``fastdata config imagefolder`` prints it to start your own.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_fastdata.cli_convert import add_task_converters, size_bytes
from lightning_fastdata.diagnose.arguments import add_arguments as add_doctor_arguments
from lightning_fastdata.errors import UsageError
from lightning_fastdata.shipped import CONFIG_DIR, ConfigNotFoundError, config_summary, find_config, shipped_configs

__all__ = ["CONFIG_DIR", "ConfigNotFoundError", "find_config", "main", "run_cli"]  # + FastDataCLI, on use

#: The model the demo trains when there is no GPU: small enough that training stays well under a minute.
DEMO_CPU_ARCH = "mobilenet_v3_small"


def run_cli(args: list[str] | None = None) -> Any:
    """Run LightningCLI: :func:`lightning_fastdata.lightning_cli.run_cli`, imported on first use.

    ``args``: ``[subcommand, options...]`` (default: the command line after the program name). ``--config`` may
    name a shipped config (``--config imagefolder``).
    """
    from lightning_fastdata.lightning_cli import run_cli as run

    return run(args)


def __getattr__(name: str) -> Any:
    """``FastDataCLI`` and ``SecretFreeSaveConfigCallback`` from :mod:`lightning_fastdata.lightning_cli`, on use."""
    if name in ("FastDataCLI", "SecretFreeSaveConfigCallback"):
        from lightning_fastdata import lightning_cli

        return getattr(lightning_cli, name)
    raise AttributeError(f"module 'lightning_fastdata.cli' has no attribute {name!r}")


def _make_data(args: argparse.Namespace, rest: list[str]) -> None:
    from lightning_fastdata.demos import ensure_demo_data

    if args.task in ("segmentation", "detection", "captions"):
        from lightning_fastdata.captions.demos import make_caption_shards
        from lightning_fastdata.detection.demos import make_detection_folder
        from lightning_fastdata.errors import PathExistsError
        from lightning_fastdata.segmentation.demos import make_segmentation_folder

        root = Path(args.root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise PathExistsError(f"{args.root!r} exists and is not empty; choose a new or empty folder.")
        if args.task == "captions":
            make_caption_shards(root, count=args.count)
            print(f"fastdata make-data: wrote {args.count} captioned scenes as tar shards in {root}/train and /val")
            return
        if args.task == "detection":
            make_detection_folder(root, count=args.count, size=(320, 240))
            print(f"fastdata make-data: wrote {args.count} scenes and their boxes in COCO's layout in {root}")
            return
        make_segmentation_folder(root, count=args.count)
        print(f"fastdata make-data: wrote {args.count} scenes and their masks in VOC's layout in {root}")
        return
    ensure_demo_data(args.root, args.num_classes, args.per_class, args.processes, use_existing=False)


def _demo(args: argparse.Namespace, rest: list[str]) -> None:
    import torch

    from lightning_fastdata.demos import ensure_demo_data
    from lightning_fastdata.loading.workers import resolve_num_workers
    from lightning_fastdata.measure import compare_folder_loaders

    config = find_config(args.config)
    root = ensure_demo_data(args.root, args.num_classes, args.per_class)
    comparison = None
    if args.seconds > 0:
        images = sum(1 for f in root.glob("*/*") if not f.name.startswith("."))
        size, batch, workers = 224, max(1, min(32, images // 4)), resolve_num_workers("auto")
        print(
            f"fastdata demo: loading {root} as {size} px random-resized crops, batch {batch}, {workers} "
            f"worker(s), {args.seconds:g} s each: torchvision's ImageFolder + DataLoader, then ours ..."
        )
        rates = compare_folder_loaders(str(root), size, batch, workers, min_seconds=args.seconds)
        comparison = (
            f"fastdata demo: loading on this machine ({workers} worker(s), {size} px, batch {batch}):\n"
            f"  torchvision ImageFolder + DataLoader   {rates['baseline']:7.0f} images/s\n"
            f"  lightning_fastdata ImageFolderDataModule {rates['ours']:5.0f} images/s  "
            f"({rates['ours'] / rates['baseline']:.1f}x)"
        )
        print(comparison)
    if not torch.cuda.is_available() and not any(a.startswith("--model.arch") for a in rest):
        print(f"fastdata demo: no GPU, so it trains a {DEMO_CPU_ARCH} (the config's model on a GPU) ...")
        rest = ["--model.arch", DEMO_CPU_ARCH, *rest]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastdata-demo-") as scratch:
        # the run's saved config (and anything else the Trainer writes) goes to a temporary folder: the demo leaves
        # only its data behind (--trainer.default_root_dir DIR keeps them in DIR)
        if not any(a.startswith("--trainer.default_root_dir") for a in rest):
            rest = ["--trainer.default_root_dir", scratch, *rest]
        run_cli(["fit", "--config", str(config), "--data.init_args.root", str(root), *rest])
    print(f"fastdata demo: trained for {time.perf_counter() - start:.0f} s.")
    if comparison:
        print(comparison)


def _doctor(args: argparse.Namespace, rest: list[str]) -> None:
    from lightning_fastdata.diagnose.main import run as run_doctor

    run_doctor(args)


def _config(args: argparse.Namespace, rest: list[str]) -> None:
    if args.name is None:
        names = shipped_configs()
        width = max(map(len, names))
        for name in names:
            print(f"{name:{width}s}  {config_summary(name)}")
        print(f"\n(in {CONFIG_DIR}; `fastdata fit --config NAME` uses one from any directory)")
        return
    print(find_config(args.name).read_text(), end="")


def _convert(args: argparse.Namespace, rest: list[str]) -> None:
    from lightning_fastdata.convert.hdf5 import convert_folder_to_hdf5

    dst = convert_folder_to_hdf5(
        args.src,
        args.dst,
        mode=args.mode,
        size=args.size,
        processes=args.processes,
        overwrite=args.overwrite,
        max_side=args.max_side,
        quality=args.quality,
        labels=args.labels,
        multi_label=args.multi_label,
        label_separator=args.label_separator,
        id_column=args.id_column,
        label_column=args.label_column,
    )
    print(f"fastdata convert: wrote {dst}")


def _convert_shards(args: argparse.Namespace, rest: list[str]) -> None:
    from lightning_fastdata.convert.shards import write_parquet_shards, write_tar_shards

    order = {"overwrite": args.overwrite, "shuffle": args.shuffle, "seed": args.seed}
    if args.format == "parquet":
        written = write_parquet_shards(args.src, args.dst, args.shard_size, rows_per_group=args.rows_per_group, **order)
    else:
        written = write_tar_shards(args.src, args.dst, shard_bytes=args.shard_size, **order)
    print(f"fastdata convert: wrote {len(written)} {args.format} shard(s) in {args.dst}")


#: Subcommands whose options another parser reads: LightningCLI's, and the benchmark's.
_PASS_THROUGH = ("fit", "validate", "test", "predict", "bench")


def build_parser() -> argparse.ArgumentParser:
    """The ``fastdata`` parser: one subcommand each, with its help and an example."""
    parser = argparse.ArgumentParser(
        prog="fastdata",
        description="Fast input pipelines for PyTorch Lightning: train, measure, convert, diagnose.",
        epilog="`fastdata COMMAND --help` shows a command's options and an example.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, what in (
        ("fit", "LightningCLI: train (fastdata fit --config imagefolder --data.init_args.root DIR)"),
        ("validate", "LightningCLI: validate a checkpoint"),
        ("test", "LightningCLI: test a checkpoint"),
        ("predict", "LightningCLI: predict with a checkpoint"),
    ):
        sub.add_parser(name, help=what, add_help=False)  # LightningCLI reads (and documents) the options
    sub.add_parser("bench", help="our loaders vs torchvision's (fastdata bench --suites folder)", add_help=False)

    _add_demo(sub)
    _add_config(sub)
    _add_make_data(sub)
    targets = _add_convert(sub)
    _add_convert_hdf5(targets)
    _add_convert_shards(targets)
    add_task_converters(targets)
    _add_doctor(sub)
    return parser


def _add_demo(sub: Any) -> None:
    """``fastdata demo``."""
    demo = sub.add_parser(
        "demo",
        help="make demo JPEGs, time torchvision's loader vs ours, train briefly",
        description=(
            "Generate demo JPEGs, measure torchvision's loader against ours on them, then train briefly "
            "(ResNet-18 on a GPU; a small model on a CPU). Other arguments go to `fastdata fit`."
        ),
        epilog="example: fastdata demo --trainer.max_epochs 1",
    )
    demo.add_argument("--root", default="data/demo", help="demo data folder (generated if missing)")
    demo.add_argument("--config", default="demo", help="config for the training part (a path or shipped name)")
    demo.add_argument("--num-classes", type=int, default=8, help="classes when generating")
    demo.add_argument("--per-class", type=int, default=64, help="images per class when generating")
    demo.add_argument(
        "--seconds", type=float, default=3.0, help="each loader's timed run in the comparison (0: no comparison)"
    )
    demo.set_defaults(handler=_demo, takes_rest=True)


def _add_config(sub: Any) -> None:
    """``fastdata config``."""
    config = sub.add_parser(
        "config",
        help="list or print the shipped configs",
        description="List the configs shipped with the package, or print one (to start your own from it).",
        epilog="example: fastdata config imagefolder > my.yaml && fastdata fit --config my.yaml",
    )
    config.add_argument("name", nargs="?", help="a shipped config's name; none: list them")
    config.set_defaults(handler=_config)


def _add_make_data(sub: Any) -> None:
    """``fastdata make-data``."""
    make = sub.add_parser(
        "make-data",
        help="write a photo-like JPEG folder (or scenes with masks, boxes or captions)",
        description="Generate a photo-like JPEG folder (into a new or empty folder only).",
        epilog="examples: fastdata make-data data/fake --num-classes 4 --per-class 32\n"
        "          fastdata make-data data/scenes --task segmentation --count 200  # VOC's layout, palette masks\n"
        "          fastdata make-data data/boxes --task detection --count 200  # COCO's layout\n"
        "          fastdata make-data data/pairs --task captions --count 400  # img2dataset's tar shards",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    make.add_argument("root")
    make.add_argument(
        "--task",
        choices=["classification", "segmentation", "detection", "captions"],
        default="classification",
        help="classification: class sub-folders; segmentation: scenes of shapes whose masks are known (VOC layout); "
        "detection: scenes of rectangles whose boxes are known (COCO layout); captions: captioned scenes of one "
        "coloured shape (img2dataset's tar shards)",
    )
    make.add_argument("--count", type=int, default=200, help="segmentation, detection, captions: scenes to write")
    make.add_argument("--num-classes", type=int, default=8)
    make.add_argument("--per-class", type=int, default=64)
    make.add_argument("--processes", type=int, default=2)
    make.set_defaults(handler=_make_data)


def _add_convert(sub: Any) -> Any:
    """``fastdata convert``; returns its targets' subparsers."""
    convert = sub.add_parser(
        "convert",
        help="image folder -> one HDF5 file, or shards (WebDataset tars, Parquet); a segmentation dataset too",
        description="Convert an image folder.",
        epilog="examples: fastdata convert hdf5 --src data/demo --dst data/demo.h5 --mode raw --size 160\n"
        "          fastdata convert hdf5 --src data/demo --dst data/demo-256.h5 --max-side 256  # compact\n"
        "          fastdata convert hdf5 --src s3://bucket/train --dst /local/nvme/train.h5 --max-side 256\n"
        "          fastdata convert hdf5 --src train --labels train.csv --multi-label --dst train.h5  # a table\n"
        "          fastdata convert shards --src data/demo --dst data/demo-shards --shard-size 64MB  # tar shards\n"
        "          fastdata convert shards --src data/demo --dst data/demo-parquet --format parquet  # as the hubs\n"
        "          fastdata convert segmentation --src data/VOC2012 --dst data/voc-shards  # train/ and val/ shards",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    targets = convert.add_subparsers(dest="target", required=True)
    return targets


def _add_convert_hdf5(sub: Any) -> None:
    """``fastdata convert hdf5``."""
    h5 = sub.add_parser("hdf5", help="write one HDF5 file (see HDF5Dataset for the layout)")
    h5.add_argument(
        "--src",
        required=True,
        help="image folder SRC/<class>/<image>, or a bucket URL of one (s3://bucket/train; configured by the "
        "standard environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_PROFILE)",
    )
    h5.add_argument("--dst", required=True, help="output .h5 file (written atomically)")
    h5.add_argument("--mode", choices=["encoded", "raw"], default="encoded")
    h5.add_argument("--size", type=int, default=256, help="side of the stored square (raw mode)")
    h5.add_argument(
        "--max-side",
        type=int,
        default=None,
        help="encoded mode: re-encode each image once, shorter side at most this (compact cache, e.g. 256)",
    )
    h5.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images (--max-side)")
    h5.add_argument(
        "--labels",
        default=None,
        help="labels from a table (.csv/.parquet: an id column naming each image under SRC, then its label(s)) "
        "instead of class sub-folders",
    )
    h5.add_argument(
        "--multi-label",
        action="store_true",
        help="with --labels: several labels per image (split by --label-separator, or one 0/1 column per class)",
    )
    h5.add_argument(
        "--label-separator",
        default=" ",
        help="with --multi-label: what separates a cell's labels (default: spaces; '|' for ChestX-ray14)",
    )
    h5.add_argument("--id-column", default=None, help="with --labels: the table's id column (default: its first)")
    h5.add_argument(
        "--label-column", default=None, help="with --labels: the table's label column (default: all but the ids')"
    )
    h5.add_argument("--processes", type=int, default=None)
    h5.add_argument("--overwrite", action="store_true", help="replace an existing --dst")
    h5.set_defaults(handler=_convert)


def _add_convert_shards(sub: Any) -> None:
    """``fastdata convert shards``."""
    tars = sub.add_parser("shards", help="write WebDataset tar shards or the hubs' Parquet files")
    tars.add_argument("--src", required=True, help="image folder SRC/<class>/<image>")
    tars.add_argument(
        "--dst", required=True, help="output folder (shard-000000.tar, ... and classes.json; or shard-000000.parquet)"
    )
    tars.add_argument(
        "--format",
        choices=["tar", "parquet"],
        default="tar",
        help="tar: WebDataset (<key>.<ext> + <key>.cls members); parquet: the hubs' image {bytes, path} and label "
        "(ClassLabel) columns",
    )
    tars.add_argument("--shard-size", type=size_bytes, default=10**9, help="about this much a shard (1GB, 64MB)")
    tars.add_argument("--rows-per-group", type=int, default=100, help="parquet: rows per row group")
    tars.add_argument("--overwrite", action="store_true", help="replace shards already in --dst")
    tars.add_argument(
        "--shuffle",
        action="store_true",
        help="write the samples in a random order (what windowed readers assume); default: the folder's, by class",
    )
    tars.add_argument("--seed", type=int, default=0, help="with --shuffle: the order's seed")
    tars.set_defaults(handler=_convert_shards)


def _add_doctor(sub: Any) -> None:
    """``fastdata doctor``."""
    doctor = sub.add_parser(
        "doctor",
        help="measure your data, recommend a setup (fastdata doctor data/train --step-ms 120)",
        description="Measure your data and this machine (read-only), and recommend the fastest DataModule.",
        epilog="example: fastdata doctor data/train --devices 8 --step-ms 120 --write-config fast.yaml",
    )
    add_doctor_arguments(doctor)
    doctor.set_defaults(handler=_doctor)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``fastdata`` console script.

    An error our validation raises on purpose (:class:`~lightning_fastdata.errors.UsageError`) ends the command
    with its message alone (``fastdata COMMAND: error: ...``, exit status 1; a command line argparse cannot parse
    exits with 2); any other error is a bug and keeps its traceback.
    """
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "bench":
            from lightning_fastdata.bench import main as bench_main

            bench_main(rest)
        elif args.command in _PASS_THROUGH:
            run_cli([args.command, *rest])
        else:
            if rest and not getattr(args, "takes_rest", False):
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            args.handler(args, rest)
    except UsageError as err:
        raise SystemExit(f"fastdata {args.command}: error: {err}") from err
    except BrokenPipeError:  # the reader went away (`fastdata config | head`): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        raise SystemExit(141) from None


if __name__ == "__main__":
    main()
