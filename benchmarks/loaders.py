"""The benchmark from a checkout: ``python -m benchmarks.loaders [--suites ...] [--json PATH] [--plot PATH]``.

``fastdata bench``'s harness (installed with the package: the suites a user runs on their own data and recipe)
with the lab's suites added (:data:`LAB`: not installed, not run by default):

- ``scale`` (:mod:`benchmarks.scale`): builds a 1.28M-file tree of hard links (~5 min): index, worker memory, cold
  reads;
- ``matrix`` (:mod:`benchmarks.matrix`, ~10 min): the folder module without an entropy index, with a dense one and
  with the default one, on eight kinds of JPEG (sizes, qualities, 4:4:4, flat content, restart markers), next to each
  kind's full-decode ceiling; and each index's bytes; at the largest ``--workers``;
- ``peers`` (:mod:`benchmarks.peers`, ~12 min): DALI's CPU pipeline, SPDL and LitData doing the same crop and flip
  on the same folders as the baseline and ours (first epoch, and epochs 2+ with the entropy index), on ``--root``
  and three kinds of the matrix, batch 256, at the largest ``--workers`` (the peers are not dependencies: missing
  ones are skipped and said so);
- ``s3`` (:mod:`benchmarks.s3`, ~8 min): the folder module on a local S3 server, direct and with ``--s3-delay-ms``
  per request, vs the local folder, a per-item ``get_object`` loader and LitData (its own data, 2 workers, batch 128).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from lightning_fastdata.bench.loaders import LabSuite
from lightning_fastdata.bench.loaders import main as harness

__all__ = ["LAB", "main"]


def _scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale-root", default="data/scale", help="scale suite: where to build the linked tree")
    parser.add_argument("--scale-classes", type=int, default=1000)
    parser.add_argument("--scale-per-class", type=int, default=1281)
    parser.add_argument("--scale-epochs", type=int, default=3, help="scale suite: epochs of the worker PSS run")
    parser.add_argument("--scale-batches", type=int, default=30, help="scale suite: batches per PSS epoch")
    parser.add_argument(
        "--scale-doctor-seconds", type=float, default=60.0, help="scale suite: `fastdata doctor --seconds` on the tree"
    )


def _scale(args: argparse.Namespace) -> Any:
    from benchmarks.scale import scale_suite

    return scale_suite(args)


def _matrix(args: argparse.Namespace) -> Any:
    from benchmarks.matrix import FILES, KINDS, matrix_suite, print_matrix

    wide = {"kinds": list(KINDS), "files": FILES, "workers": max(args.workers)}
    print("\nSuite matrix: the entropy index on kinds of JPEG (ratios: to the full-decode ceiling)\n")
    out = matrix_suite(argparse.Namespace(**{**vars(args), **wide}))
    print()
    print_matrix(out)
    return out


def _peers(args: argparse.Namespace) -> Any:
    from benchmarks.peers import main as peers_main

    peers_args = ["--root", args.root, "--workers", str(max(args.workers)), "--repeats", str(args.repeats)]
    return peers_main(peers_args + ["--scratch", os.path.join(args.scratch, "peers")])


def _s3_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3-delay-ms", type=float, default=20.0, help="s3 suite: latency added per request")
    parser.add_argument(
        "--s3-pin", action="store_true", help="s3 suite: the loader on one CPU, the server and proxy on another"
    )


def _s3(args: argparse.Namespace) -> Any:
    from benchmarks.s3 import main as s3_main

    s3_args = ["--repeats", str(args.repeats), "--delay-ms", str(args.s3_delay_ms)]
    return s3_main(s3_args + (["--pin"] if args.s3_pin else []))


def _none(parser: argparse.ArgumentParser) -> None:
    return None


#: The lab's suites, in the order they run (after the installed ones).
LAB = {
    "scale": LabSuite(
        "a 1.28M-file tree of hard links (~5 min): index, worker memory, cold reads", _scale_arguments, _scale
    ),
    "matrix": LabSuite("the entropy index on eight kinds of JPEG (~10 min; benchmarks.matrix)", _none, _matrix),
    "peers": LabSuite("DALI (CPU), SPDL and LitData beside ours (~12 min; benchmarks.peers)", _none, _peers),
    "s3": LabSuite("the folder module on a local S3 server (~8 min; benchmarks.s3)", _s3_arguments, _s3),
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.loaders``: the installed harness with :data:`LAB`."""
    return harness(argv, lab=LAB, prog="python -m benchmarks.loaders")


if __name__ == "__main__":
    main()
