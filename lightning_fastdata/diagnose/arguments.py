"""``fastdata doctor``'s command-line arguments (argparse only: ``fastdata doctor --help`` loads nothing else)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments to ``p`` (``fastdata doctor``'s subparser, or ``diagnose.main``'s own parser)."""
    p.add_argument(
        "path",
        help="image folder (root/<class>/<image>), a bucket URL of one (s3://bucket/train; credentials and endpoint "
        "from the standard AWS environment), an HDF5 file, or a folder of image-caption tar shards (img2dataset's)",
    )
    p.add_argument(
        "--caption-field",
        default=None,
        help="image-caption shards: read each caption from this field of key.json (default: key.txt)",
    )
    p.add_argument("--devices", type=int, default=1, help="training processes per node")
    p.add_argument("--batch-size", type=int, default=64, help="batch size per training process, as you train")
    p.add_argument("--image-size", type=int, default=224, help="side of the crops you train on (pixels)")
    p.add_argument("--seconds", type=float, default=60.0, help="time budget of the measurements")
    p.add_argument("--step-ms", type=float, default=None, help="your model's step time without data wait")
    p.add_argument(
        "--sample",
        type=int,
        default=256,
        help="files sampled from the data to time each option on (more: slower, steadier)",
    )
    p.add_argument("--scratch-dir", default=None, help="where to build the sample's caches (default: TMPDIR)")
    p.add_argument("--write-config", default=None, help="write a LightningCLI YAML with the recommendation")
    p.add_argument(
        "--val-root",
        default=None,
        help="your validation folder (or URL, or HDF5 file), kept in the written config; default: a 'val', 'valid' "
        "or 'validation' folder beside PATH with the same classes, if there is one, else a split of PATH",
    )
    p.add_argument(
        "--index-dir",
        default=None,
        help="a node-local folder of yours for file lists and entropy indexes, kept in the written config "
        "(default there: cache/index where one is needed)",
    )
    p.add_argument(
        "--recipe",
        default=None,
        help="a LightningCLI config (file or shipped name, e.g. recipe_torchvision) whose data arguments are your "
        "training recipe (train_transforms, device_transforms, batch_transforms, ...): every option is timed with "
        "it, against torchvision's reference loader of it, and --write-config keeps it",
    )
