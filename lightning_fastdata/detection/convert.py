"""A detection split (COCO, VOC or YOLO; local or in a bucket) as WebDataset tar shards or Parquet files.

Tar: each sample is ``<key>.<ext>`` (the image's bytes as they are) and ``<key>.json``; Parquet (``fmt="parquet"``): an
``image`` column (the hubs' ``{bytes, path}`` structs) and an ``objects`` column holding the same JSON. The JSON:
``{"boxes": [[x1, y1, x2, y2], ...], "categories": [label, ...], "iscrowd": [...], "difficult": [...]}``, the boxes in
the stored image's pixels (YOLO's fractions scaled, VOC's 1-based edges made 0-based, COCO's XYWH made XYXY) and the
categories already the module's labels, with ``classes.json`` (the class names in label order) beside the files. So they
read with :class:`~lightning_fastdata.detection.datamodule.DetectionDataModule` (found by ``layout="auto"`` locally;
``"shards"``/``"parquet"`` for a bucket) give the batches the folder gives. Written by
:func:`~lightning_fastdata.convert.shards.pack_shards`: each shard under a temporary name, renamed when whole; nothing
written into the source.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from PIL import Image

from lightning_fastdata.convert.shards import pack_shards, shard_destination
from lightning_fastdata.detection.layouts import DetectionLayout
from lightning_fastdata.detection.target import BoxTarget
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.atomic import atomic_write_text
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.sources.folder import PairedFolderDataset

__all__ = ["write_detection_shards"]


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
    folders = DetectionLayout(layout, None, None if class_names is None else tuple(class_names))
    names, categories = folders.categories(root, split, storage_options)
    data = PairedFolderDataset(root, split, BoxTarget(categories, len(names)), folders, storage_options)
    name = "shard-%06d.tar" if fmt == "tar" else "part-%06d.parquet"
    shard_destination(dst, name, overwrite, None if is_url(root) else root)

    def read(start: int, stop: int) -> list[tuple[int, bytes, str, bytes]]:
        rows = []
        for i, (image, payload) in zip(range(start, stop), data.read_fields(list(range(start, stop)))):
            assert isinstance(image, bytes)
            with Image.open(io.BytesIO(image)) as im:
                width, height = im.size
            names_i = (data.name(i), data.name(i, 1))
            value = data.target.sized(data.target.decode(payload, names_i[1]), width, height, names_i)
            boxes = {"boxes": value["boxes"].tolist(), "categories": value["labels"].tolist(),
                     "iscrowd": value["iscrowd"].tolist()}  # fmt: skip
            ext = data.pairs.images[i].rsplit(".", 1)[-1].lower()
            rows.append((i, image, ext, json.dumps(boxes).encode()))
        return rows

    def write(tf: tarfile.TarFile, rows: list[tuple[int, bytes, str, bytes]]) -> None:
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

    def write(writer: Any, rows: list[tuple[int, bytes, str, bytes]]) -> None:
        images = [{"bytes": image, "path": os.path.basename(data.pairs.images[i])} for i, image, _, _ in rows]
        objects = [boxes for _, _, _, boxes in rows]
        writer.write_table(
            pa.Table.from_arrays([pa.array(images, kind), pa.array(objects, pa.binary())], schema=schema)
        )

    return open_parquet, write
