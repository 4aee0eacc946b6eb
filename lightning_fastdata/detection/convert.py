"""A detection split (COCO, VOC, YOLO or CSV; local or in a bucket) as WebDataset tar shards, Parquet or HDF5.

Tar: each sample is ``<key>.<ext>`` (the image's bytes as they are) and ``<key>.json``; Parquet (``fmt="parquet"``): an
``image`` column (the hubs' ``{bytes, path}`` structs) and an ``objects`` column holding the same JSON; HDF5
(:func:`write_detection_hdf5`, several splits in one file): a group per split of ``images`` (each image's bytes as
they are, variable-length uint8) and ``boxes`` (the same JSON, variable-length uint8), the class names in the file's
``classes`` attribute. The JSON:
``{"boxes": [[x1, y1, x2, y2], ...], "categories": [label, ...], "iscrowd": [...], "difficult": [...]}``, the boxes in
the stored image's pixels (YOLO's fractions scaled, VOC's 1-based edges made 0-based, COCO's XYWH made XYXY) and the
categories already the module's labels, with ``classes.json`` (the class names in label order) beside the files. So they
read with :class:`~lightning_fastdata.detection.datamodule.DetectionDataModule` (found by ``layout="auto"`` locally;
``"shards"``/``"parquet"`` for a bucket; an HDF5 file by its name) give the batches the folder gives. Written by
:func:`~lightning_fastdata.convert.shards.pack_shards`: each shard under a temporary name, renamed when whole (the HDF5
file likewise); nothing written into the source.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from lightning_fastdata.convert.shards import pack_shards, refuse_inside_source, shard_destination
from lightning_fastdata.detection.layouts import DetectionLayout
from lightning_fastdata.detection.target import BoxTarget
from lightning_fastdata.errors import InvalidValueError, PathExistsError
from lightning_fastdata.loading.atomic import atomic_path, atomic_write_text
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.sources.folder import PairedFolderDataset

__all__ = ["convert_detection", "write_detection_hdf5", "write_detection_shards"]

#: A converted sample: its position, the image's bytes, its extension, its boxes' JSON.
_Row = tuple[int, bytes, str, bytes]


def _split(
    root: str, split: str, layout: str, class_names: list[str] | None, storage_options: dict[str, Any] | None
) -> tuple[tuple[str, ...], PairedFolderDataset]:
    """The class names and the split's samples, read as the module reads them."""
    folders = DetectionLayout(layout, None, None if class_names is None else tuple(class_names))
    names, categories = folders.categories(root, split, storage_options)
    return names, PairedFolderDataset(root, split, BoxTarget(categories, len(names)), folders, storage_options)


def _plain(segmentation: Any) -> Any:
    """A segmentation as JSON holds it (a compressed RLE's counts as text)."""
    if isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), bytes):
        return {**segmentation, "counts": segmentation["counts"].decode()}
    return segmentation


def _rows(data: PairedFolderDataset, start: int, stop: int) -> list[_Row]:
    """Samples ``start .. stop`` with their boxes in the stored image's pixels, as our JSON (module docstring)."""
    rows = []
    for i, (image, payload) in zip(range(start, stop), data.read_fields(list(range(start, stop)))):
        assert isinstance(image, bytes)
        with Image.open(io.BytesIO(image)) as im:
            width, height = im.size
        names_i = (data.name(i), data.name(i, 1))
        value = data.target.sized(data.target.decode(payload, names_i[1]), width, height, names_i)
        boxes = {"boxes": value["boxes"].tolist(), "categories": value["labels"].tolist(),
                 "iscrowd": value["iscrowd"].tolist()}  # fmt: skip
        if isinstance(payload, dict) and "image_id" in payload:  # COCO's id, kept
            boxes["image_id"] = int(payload["image_id"])
        raw = payload.get("segmentation") if isinstance(payload, dict) else None
        if raw is not None and all(seg is not None for seg in raw):  # COCO's polygons and RLE, as they are
            boxes["segmentation"] = [_plain(seg) for seg in raw]
        ext = data.pairs.images[i].rsplit(".", 1)[-1].lower()
        rows.append((i, image, ext, json.dumps(boxes).encode()))
    return rows


def write_detection_shards(
    root: str | os.PathLike[str],
    split: str,
    dst: str | os.PathLike[str],
    layout: str = "auto",
    class_names: list[str] | None = None,
    shard_bytes: int = 64 * 2**20,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = False,
    fmt: str = "tar",
    rows_per_group: int = 100,
) -> list[Path]:
    """Write ``split`` of a detection folder as tar shards (or Parquet files) into ``dst``; returns their paths.

    ``fmt``: ``"tar"`` or ``"parquet"`` (row groups of ``rows_per_group``); module docstring.

    Raises:
        FileNotFoundError: If the split's images or annotations are missing (named).
        FileExistsError: If ``dst`` already holds shards and not ``overwrite``.
        ValueError: If ``shard_bytes`` is not positive or ``dst`` is inside ``root``; DataError: an annotation that
            cannot be read, a box outside its image, a category not in the classes (named).
    """
    if shard_bytes <= 0 or rows_per_group <= 0 or fmt not in ("tar", "parquet"):
        raise InvalidValueError(
            f"shard_bytes and rows_per_group should be positive and fmt 'tar' or 'parquet', got {shard_bytes!r}, "
            f"{rows_per_group!r}, {fmt!r}."
        )
    root = os.fspath(root)
    names, data = _split(root, split, layout, class_names, storage_options)
    name = "shard-%06d.tar" if fmt == "tar" else "part-%06d.parquet"
    shard_destination(dst, name, overwrite, None if is_url(root) else root)

    def read(start: int, stop: int) -> list[_Row]:
        return _rows(data, start, stop)

    def write(tf: tarfile.TarFile, rows: list[_Row]) -> None:
        for position, image, ext, boxes in rows:
            for member, payload in ((f"{position:08d}.{ext}", image), (f"{position:08d}.json", boxes)):
                info = tarfile.TarInfo(member)
                info.size, info.mtime, info.mode = len(payload), 0, 0o644
                tf.addfile(info, io.BytesIO(payload))

    def open_tar(tmp: Path) -> tarfile.TarFile:
        return tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT)

    opener, writer, step = (open_tar, write, 4) if fmt == "tar" else (*_parquet_writer(data), rows_per_group)
    written = pack_shards(
        len(data), read, lambda row: len(row[1]) + len(row[3]) + 2048, dst, name, shard_bytes, step, opener, writer,
        f"{fmt} shards ({split})" if progress else None,
    )  # fmt: skip
    atomic_write_text(Path(dst) / "classes.json", json.dumps(list(names)))
    return written


def _parquet_writer(data: PairedFolderDataset) -> tuple[Any, Any]:
    """The Parquet writer's opener and row writer: ``image`` ``{bytes, path}`` structs and ``objects`` JSON bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", kind), ("objects", pa.binary())])

    def open_parquet(tmp: Path) -> Any:
        return pq.ParquetWriter(tmp, schema)

    def write(writer: Any, rows: list[_Row]) -> None:
        images = [{"bytes": image, "path": os.path.basename(data.pairs.images[i])} for i, image, _, _ in rows]
        objects = [boxes for _, _, _, boxes in rows]
        writer.write_table(
            pa.Table.from_arrays([pa.array(images, kind), pa.array(objects, pa.binary())], schema=schema)
        )

    return open_parquet, write


def write_detection_hdf5(
    root: str | os.PathLike[str],
    splits: Sequence[str],
    dst: str | os.PathLike[str],
    layout: str = "auto",
    class_names: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write ``splits`` of a detection folder as one HDF5 file, a group each (module docstring); returns ``dst``.

    Written under a temporary name and renamed when whole. The classes are the first split's (its annotations' or
    ``class_names``).

    Raises:
        FileNotFoundError: If a split's images or annotations are missing (named).
        FileExistsError: If ``dst`` exists and not ``overwrite``.
        ValueError: If ``dst`` is inside ``root``; DataError: an annotation that cannot be read, a box outside its
            image, a category not in the classes (named).
    """
    import h5py

    root, dst = os.fspath(root), Path(dst)
    if dst.exists() and not overwrite:
        raise PathExistsError(f"{dst} exists: pass overwrite=True (--overwrite) to replace it.")
    refuse_inside_source(dst, None if is_url(root) else root)
    names, _ = _split(root, splits[0], layout, class_names, storage_options)
    dst.parent.mkdir(parents=True, exist_ok=True)
    bytes_kind = h5py.vlen_dtype(np.uint8)
    with atomic_path(dst) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["classes"] = json.dumps(list(names))
        for split in splits:
            _, data = _split(root, split, layout, list(names), storage_options)
            images = f.create_dataset(f"{split}/images", (len(data),), dtype=bytes_kind)
            boxes = f.create_dataset(f"{split}/boxes", (len(data),), dtype=bytes_kind)
            with tqdm(total=len(data), desc=f"hdf5 ({split})", unit="img", disable=not progress) as bar:
                for start in range(0, len(data), 64):
                    for position, image, _, json_boxes in _rows(data, start, min(len(data), start + 64)):
                        images[position] = np.frombuffer(image, np.uint8)
                        boxes[position] = np.frombuffer(json_boxes, np.uint8)
                        bar.update(1)
    return dst


def convert_detection(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    fmt: str = "tar",
    splits: Sequence[str] | None = None,
    layout: str = "auto",
    class_names: list[str] | None = None,
    shard_bytes: int | None = None,
    rows_per_group: int = 100,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, list[Path]]:
    """``fastdata convert detection``: ``splits`` of ``src`` as ``dst/<split>/`` shards or Parquet, or one HDF5 file.

    ``splits``: by default the layout's training and validation splits (COCO's ``train2017``/``val2017``, else
    ``train``/``val``), the validation one where it exists. Each split's classes are the training split's. Returns the
    files written per split (the HDF5 file under each split).
    """
    src = os.fspath(src)
    if splits is None:
        coco = DetectionLayout(layout).found(src, storage_options) == "coco"
        splits = ["train2017", "val2017"] if coco else ["train", "val"]
        try:
            _split(src, splits[1], layout, class_names, storage_options)
        except FileNotFoundError:
            splits = splits[:1]
    if fmt == "hdf5":
        path = write_detection_hdf5(src, splits, dst, layout, class_names, storage_options, overwrite, True)
        return {split: [path] for split in splits}
    names = class_names if class_names is not None else list(_split(src, splits[0], layout, None, storage_options)[0])
    size = shard_bytes or (64 if fmt == "tar" else 256) * 2**20
    return {
        split: write_detection_shards(
            src, split, Path(dst) / split, layout, names, size, storage_options, overwrite, True, fmt, rows_per_group
        )  # fmt: skip
        for split in splits
    }
