"""``fastdata doctor``: the command line of :func:`~lightning_fastdata.diagnose.run.doctor`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from lightning_fastdata.diagnose.arguments import add_arguments
from lightning_fastdata.errors import UsageError

if TYPE_CHECKING:
    from lightning_fastdata.diagnose.pairs import PairsReport
    from lightning_fastdata.diagnose.report import DoctorReport

__all__ = ["add_arguments", "main", "run"]


def run(args: argparse.Namespace) -> DoctorReport | PairsReport:
    """Measure, print the report and the commands to run; ``--write-config`` writes the config.

    A folder of tar shards of image-caption pairs gets the pairs' report (:mod:`~lightning_fastdata.diagnose.pairs`).

    Raises:
        UsageError: If the data, the scratch directory or an argument is unusable (the message says what to do).
    """
    from lightning_fastdata.diagnose.pairs import holds_tar_shards

    if holds_tar_shards(args.path):
        return _run_pairs(args)
    # the measuring parts load torch: imported here, so that the parser (and --help) loads nothing heavy
    from lightning_fastdata.diagnose.report import check_config_path, format_report, sibling_validation, write_config
    from lightning_fastdata.diagnose.run import doctor
    from lightning_fastdata.loading.storage.base import is_url

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
        val_root = getattr(args, "val_root", None) or sibling_validation(args.path)
        if val_root is not None and not getattr(args, "val_root", None):
            print(f"fastdata doctor: found the validation folder {val_root} beside the data: kept.", file=sys.stderr)
        write_config(report, args.write_config, val_root=val_root, index_dir=getattr(args, "index_dir", None))
        print(f"fastdata doctor: wrote {args.write_config}", file=sys.stderr)
    print(format_report(report, args.image_size, args.step_ms, args.write_config))
    return report


def _run_pairs(args: argparse.Namespace) -> PairsReport:
    """The doctor on image-caption shards: pairs, skipped keys, the module's rate; ``--write-config``."""
    from lightning_fastdata.diagnose.pairs import diagnose_pairs, format_pairs, write_pairs_config

    print(f"fastdata doctor: indexing the shards in {args.path} and timing ImageTextDataModule for about "
          f"{args.seconds:g} s ...", file=sys.stderr, flush=True)  # fmt: skip
    report = diagnose_pairs(args.path, args.caption_field, args.devices, args.batch_size, args.image_size,
                            args.seconds, args.scratch_dir)  # fmt: skip
    if args.write_config:
        write_pairs_config(report, args.write_config, args.batch_size, args.image_size)
        print(f"fastdata doctor: wrote {args.write_config}", file=sys.stderr)
    print(format_pairs(report, args.write_config))
    return report


def main(argv: list[str] | None = None) -> DoctorReport | PairsReport:
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
