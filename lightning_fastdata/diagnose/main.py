"""``fastdata doctor``: the command line of :func:`~lightning_fastdata.diagnose.run.doctor`."""

from __future__ import annotations

import argparse
import os
import sys

from lightning_fastdata.diagnose.report import DoctorReport, check_config_path, format_report, write_config
from lightning_fastdata.diagnose.run import doctor
from lightning_fastdata.errors import UsageError
from lightning_fastdata.loading.storage.base import is_url

__all__ = ["add_arguments", "main", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments to ``p`` (``fastdata doctor``'s subparser, or :func:`main`'s own parser)."""
    p.add_argument(
        "path",
        help="image folder (root/<class>/<image>), a bucket URL of one (s3://bucket/train; credentials and endpoint "
        "from the standard AWS environment), or an HDF5 file",
    )
    p.add_argument("--devices", type=int, default=1, help="training processes per node")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seconds", type=float, default=60.0, help="time budget of the measurements")
    p.add_argument("--step-ms", type=float, default=None, help="your model's step time without data wait")
    p.add_argument("--sample", type=int, default=256, help="files sampled")
    p.add_argument("--scratch-dir", default=None, help="where to build the sample's caches (default: TMPDIR)")
    p.add_argument("--write-config", default=None, help="write a LightningCLI YAML with the recommendation")
    p.add_argument(
        "--recipe",
        default=None,
        help="a LightningCLI config (file or shipped name, e.g. recipe_torchvision) whose data arguments are your "
        "training recipe (train_transforms, device_transforms, batch_transforms, ...): every option is timed with "
        "it, against torchvision's reference loader of it, and --write-config keeps it",
    )


def run(args: argparse.Namespace) -> DoctorReport:
    """Measure, print the report and the commands to run; ``--write-config`` writes the config.

    Raises:
        UsageError: If the data, the scratch directory or an argument is unusable (the message says what to do).
    """
    if args.write_config:
        check_config_path(args.path, args.write_config)  # before a minute of measuring, not after
    if os.path.exists(args.path) or is_url(args.path):
        print(
            f"fastdata doctor: measuring {args.path} for about {args.seconds:g} s after listing it (a sample's "
            "HDF5 files and caches are built in a temporary directory and removed) ...",
            file=sys.stderr,
            flush=True,
        )
    report = doctor(
        args.path,
        args.devices,
        args.batch_size,
        args.image_size,
        args.seconds,
        args.step_ms,
        args.sample,
        args.scratch_dir,
        recipe=args.recipe,
    )
    if args.write_config:
        write_config(report, args.write_config)
        print(f"fastdata doctor: wrote {args.write_config}", file=sys.stderr)
    print(format_report(report, args.image_size, args.step_ms, args.write_config))
    return report


def main(argv: list[str] | None = None) -> DoctorReport:
    """``fastdata doctor`` on its own (``python -m lightning_fastdata.diagnose.main``); errors as the command's."""
    p = argparse.ArgumentParser(
        prog="fastdata doctor",
        description="Measure your data and this machine (read-only), and recommend the fastest DataModule.",
        epilog="example: fastdata doctor data/train --devices 8 --step-ms 120 --write-config fast.yaml",
    )
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except UsageError as err:
        raise SystemExit(f"fastdata doctor: error: {err}") from err


if __name__ == "__main__":
    main()
