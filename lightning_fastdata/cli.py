"""The ``fastdata`` command: LightningCLI (``fit``, ...) and ``demo``, ``make-data``, ``convert``, ``bench``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from lightning_fastdata.bench import main as bench_main
from lightning_fastdata.convert import convert_folder_to_hdf5
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.demos import ensure_demo_data
from lightning_fastdata.models import ImageClassifier

__all__ = ["FastDataCLI", "main", "run_cli"]


class FastDataCLI(LightningCLI):
    """LightningCLI with ``model.num_classes`` linked from the DataModule's ``num_classes``."""

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - jsonargparse's parser type
        """Link the class count so configs never repeat it."""
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")


def run_cli(args: list[str] | None = None) -> FastDataCLI:
    """Run LightningCLI over :class:`ImageClassifier` and any :class:`FastDataModule` subclass.

    ``args`` (default: the command line) are handed over as the command line itself, not as LightningCLI's
    ``args=`` (which warns that it is meant for calls from Python whenever the process has arguments too).
    """
    saved = sys.argv
    if args is not None:
        sys.argv = [saved[0] if saved else "fastdata", *args]
    try:
        return FastDataCLI(
            ImageClassifier, FastDataModule, subclass_mode_data=True, save_config_kwargs={"overwrite": True}
        )
    finally:
        sys.argv = saved


def _make_data(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="fastdata make-data",
        description="Generate a photo-like JPEG folder (into a new or empty folder only).",
        epilog="example: fastdata make-data data/fake --num-classes 4 --per-class 32",
    )
    parser.add_argument("root")
    parser.add_argument("--num-classes", type=int, default=8)
    parser.add_argument("--per-class", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        ensure_demo_data(args.root, args.num_classes, args.per_class, args.processes, use_existing=False)
    except (FileExistsError, NotADirectoryError) as err:
        sys.exit(f"fastdata make-data: {err}")


def _demo(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="fastdata demo",
        description="Generate demo data and train on it; other arguments go to `fastdata fit`.",
        epilog="example: fastdata demo --trainer.max_epochs 1",
    )
    parser.add_argument("--root", default="data/demo")
    parser.add_argument("--config", default="configs/demo.yaml")
    args, rest = parser.parse_known_args(argv)
    if not Path(args.config).exists():
        sys.exit(f"fastdata demo: config {args.config!r} not found; run it from the repository root.")
    ensure_demo_data(args.root)
    run_cli(["fit", "--config", args.config, "--data.init_args.root", args.root, *rest])


def _convert(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="fastdata convert",
        description="Convert an image folder.",
        epilog="example: fastdata convert hdf5 --src data/demo --dst data/demo.h5 --mode raw --size 160",
    )
    sub = parser.add_subparsers(dest="target", required=True)
    h5 = sub.add_parser("hdf5", help="write one HDF5 file (see HDF5Dataset for the layout)")
    h5.add_argument("--src", required=True, help="image folder: SRC/<class>/<image>")
    h5.add_argument("--dst", required=True, help="output .h5 file (written atomically)")
    h5.add_argument("--mode", choices=["encoded", "raw"], default="encoded")
    h5.add_argument("--size", type=int, default=256, help="side of the stored square (raw mode)")
    h5.add_argument("--processes", type=int, default=None)
    h5.add_argument("--overwrite", action="store_true", help="replace an existing --dst")
    args = parser.parse_args(argv)
    try:
        dst = convert_folder_to_hdf5(
            args.src, args.dst, mode=args.mode, size=args.size, processes=args.processes, overwrite=args.overwrite
        )
    except (FileExistsError, FileNotFoundError, OSError, ValueError) as err:
        sys.exit(f"fastdata convert: {err}")
    print(f"fastdata convert: wrote {dst}")


COMMANDS = """usage: fastdata COMMAND [options]

commands:
  fit, validate, test, predict  LightningCLI: train or evaluate     fastdata fit --config configs/demo.yaml
  demo                          make demo JPEGs and train on them   fastdata demo
  make-data                     write a photo-like JPEG folder      fastdata make-data data/fake
  convert                       image folder -> one HDF5 file       fastdata convert hdf5 --src DIR --dst F.h5
  bench                         our loaders vs torchvision's        fastdata bench --suites folder

`fastdata COMMAND --help` shows a command's options."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``fastdata`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(COMMANDS)
    elif argv[0] == "bench":
        bench_main(argv[1:])
    elif argv and argv[0] == "convert":
        _convert(argv[1:])
    elif argv and argv[0] == "demo":
        _demo(argv[1:])
    elif argv and argv[0] == "make-data":
        _make_data(argv[1:])
    else:
        run_cli(argv)


if __name__ == "__main__":
    main()
