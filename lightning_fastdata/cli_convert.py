"""``fastdata convert``'s task converters (segmentation, detection, captions) and its size argument.

Each subcommand's parser and handler; the handlers import their converter on use, so ``fastdata --help`` stays light.
"""

from __future__ import annotations

import argparse
from typing import Any

from lightning_fastdata.errors import InvalidValueError

__all__ = ["add_task_converters", "size_bytes"]


def size_bytes(text: str) -> int:
    """``1GB``, ``64MB``, ``500kB`` or a number of bytes, as an int (argparse's type)."""
    units = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "b": 1}
    lowered = text.strip().lower()
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if lowered.endswith(unit):
            try:
                return int(float(lowered[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(lowered)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write it as 1GB, 64MB or bytes.") from None


def _convert_segmentation(args: argparse.Namespace, rest: list[str]) -> None:
    import json

    from lightning_fastdata.segmentation.convert import convert_segmentation
    from lightning_fastdata.segmentation.layouts import NAMED_TABLES

    label_map: dict[int, int] | str | None = args.label_map
    try:
        if args.label_map is not None and args.label_map not in NAMED_TABLES:
            label_map = {int(k): int(v) for k, v in json.loads(args.label_map).items()}
    except (ValueError, AttributeError):
        raise InvalidValueError(
            f"--label-map {args.label_map!r} is neither a table's name ({', '.join(NAMED_TABLES)}) nor a JSON object "
            'of mask value -> class, e.g. \'{"0": 255, "1": 0, "2": 1}\'.'
        ) from None
    written = convert_segmentation(
        args.src, args.dst, args.format, args.splits, args.shard_size, args.rows_per_group, args.overwrite,
        layout=args.layout, num_classes=args.num_classes, label_map=label_map, ignore_index=args.ignore_index,
        images_dir=args.images_dir, masks_dir=args.masks_dir,
    )  # fmt: skip
    for split, files in written.items():
        print(f"fastdata convert: {split}: {len(files)} {args.format} file(s) in {files[0].parent}")
    print(f"fastdata convert: train from it with SegmentationDataModule(root={args.dst!r}, num_classes=...)")


def _convert_detection(args: argparse.Namespace, rest: list[str]) -> None:
    from lightning_fastdata.detection.convert import convert_detection

    written = convert_detection(args.src, args.dst, args.format, args.splits, args.layout, args.class_names,
                                args.shard_size, args.rows_per_group, args.overwrite)  # fmt: skip
    for split, files in written.items():
        print(f"fastdata convert: {split}: {len(files)} {args.format} file(s) in {files[0].parent}")
    print(f"fastdata convert: train from it with DetectionDataModule(root={args.dst!r})")


def _convert_captions(args: argparse.Namespace, rest: list[str]) -> None:
    from lightning_fastdata.captions.convert import write_caption_shards

    written = write_caption_shards(args.src, args.table, args.dst, args.format, args.shard_size, args.rows_per_group,
                                   args.overwrite, progress=True)  # fmt: skip
    print(f"fastdata convert: {len(written)} {args.format} file(s) in {args.dst}")
    field = ", caption_field='caption'" if args.format == "tar" else ""
    print(f"fastdata convert: train from it with ImageTextDataModule(root={args.dst!r}{field})")


def _add_convert_segmentation(sub: Any) -> None:
    """``fastdata convert segmentation``."""
    seg = sub.add_parser(
        "segmentation",
        help="a segmentation dataset's splits -> tar shards, Parquet or one HDF5 file (masks as classes)",
        description="Write a segmentation dataset (VOC, ADE20K, Cityscapes, paired folders; local or s3://) as tar "
        "shards (DST/<split>/shard-*.tar), the hubs' Parquet (DST/<split>/part-*.parquet) or one HDF5 file (a group "
        "per split; masks of one size). Masks are written as the classes they mean (the layout's table or "
        "--label-map applied), so SegmentationDataModule(root=DST) reads them with no table.",
    )
    seg.add_argument("--src", required=True, help="the dataset's root (a folder or s3://bucket/prefix)")
    seg.add_argument("--dst", required=True, help="output folder (tar, parquet) or .h5 file (hdf5)")
    seg.add_argument("--format", choices=["tar", "parquet", "hdf5"], default="tar")
    seg.add_argument(
        "--splits", nargs="+", default=None, help="splits to write (default: those of train val test training "
        "validation that exist)"
    )  # fmt: skip
    seg.add_argument("--layout", choices=["auto", "voc", "ade20k", "cityscapes", "paired"], default="auto")
    seg.add_argument(
        "--num-classes", type=int, default=None, help="the classes (default: the layout's: VOC 21, ADE20K 150, "
        "Cityscapes 19; needed for paired folders)"
    )  # fmt: skip
    seg.add_argument(
        "--label-map", default=None, help='mask value -> class as JSON (\'{"0": 255, "1": 0}\'), or a table\'s name: '
        "ade20k, cityscapes (masks coded so in another layout)"
    )  # fmt: skip
    seg.add_argument("--ignore-index", type=int, default=255, help="what a value of no class is written as")
    seg.add_argument("--images-dir", default="images", help="paired folders: the images' folder")
    seg.add_argument("--masks-dir", default="annotations", help="paired folders: the masks' folder")
    _file_options(seg)
    seg.set_defaults(handler=_convert_segmentation)


def _add_convert_detection(sub: Any) -> None:
    """``fastdata convert detection``."""
    det = sub.add_parser(
        "detection",
        help="a detection dataset's splits -> tar shards, Parquet or one HDF5 file (boxes as JSON)",
        description="Write a detection dataset (COCO, VOC, YOLO, a CSV of boxes; local or s3://) as tar shards "
        "(DST/<split>/shard-*.tar: key.jpg + key.json), Parquet (DST/<split>/part-*.parquet) or one HDF5 file (a "
        "group per split), the boxes in the images' pixels and the classes' labels, so DetectionDataModule(root=DST) "
        "reads them as the folder.",
    )
    det.add_argument("--src", required=True, help="the dataset's root (a folder or s3://bucket/prefix)")
    det.add_argument("--dst", required=True, help="output folder (tar, parquet) or .h5 file (hdf5)")
    det.add_argument("--format", choices=["tar", "parquet", "hdf5"], default="tar")
    det.add_argument("--splits", nargs="+", default=None, help="splits (default: the layout's train and val)")
    det.add_argument("--layout", choices=["auto", "coco", "voc", "yolo", "csv"], default="auto")
    det.add_argument("--class-names", nargs="+", default=None, help="the classes in label order (VOC: its 20)")
    _file_options(det)
    det.set_defaults(handler=_convert_detection)


def _add_convert_captions(sub: Any) -> None:
    """``fastdata convert captions``."""
    cap = sub.add_parser(
        "captions",
        help="a folder of images + a file,caption table -> img2dataset's tar shards or Parquet",
        description="Write a folder of images with a captions table beside it (CSV or Parquet, a file's rows its "
        "captions; local or s3://) as tar shards in img2dataset's layout (DST/shard-*.tar: key.jpg, key.txt with "
        "the first caption, key.json with every caption and the file) or Parquet (DST/part-*.parquet: image, "
        "caption), so ImageTextDataModule(root=DST) reads them.",
    )
    cap.add_argument("--src", required=True, help="the images' root (a folder or s3://bucket/prefix)")
    cap.add_argument("--table", required=True, help="the captions table's path under --src (captions.csv)")
    cap.add_argument("--dst", required=True, help="output folder")
    cap.add_argument("--format", choices=["tar", "parquet"], default="tar")
    _file_options(cap)
    cap.set_defaults(handler=_convert_captions)


def _file_options(p: Any) -> None:
    """The options every task converter's files take: their size, Parquet's row groups, replacing old ones."""
    p.add_argument("--shard-size", type=size_bytes, default=None, help="about this much a file (tar 64MB, "
                   "parquet 256MB)")  # fmt: skip
    p.add_argument("--rows-per-group", type=int, default=100, help="parquet: rows per row group")
    p.add_argument("--overwrite", action="store_true", help="replace shards or a file already at --dst")


def add_task_converters(sub: Any) -> None:
    """Add ``segmentation``, ``detection`` and ``captions`` to ``fastdata convert``'s subcommands ``sub``."""
    _add_convert_segmentation(sub)
    _add_convert_detection(sub)
    _add_convert_captions(sub)
