"""A segmentation split (any layout, local or in a bucket) as tar shards, Parquet files or one HDF5 file.

What ``fastdata convert segmentation`` writes. The source is read as
:class:`~lightning_fastdata.datamodules.segmentation.SegmentationDataModule` reads it
(:class:`~lightning_fastdata.sources.folder.PairedFolderDataset` with the mask target: the layout's pairs, its table of
what a mask value means, or ``label_map=``), and every mask is written **as the classes** it means: ADE20K's ``k`` as
``k - 1``, Cityscapes' label ids as its training ids, a ``label_map``'s values as their classes, values that mean none
as ``ignore_index``. A mask whose values already are the classes (VOC's palette PNGs, paired folders) is copied as it
is, byte for byte. So a converted split is read with no layout table and no ``label_map`` and gives the batches the
folder gives; a value that is no class is an error at conversion, naming the file. The images' bytes are copied as they
are.

- ``tar``: ``key.<ext>`` + ``key.seg.png`` members (keys ``00000000``, ... in the split's order), shards of about
  ``shard_bytes``: :class:`~lightning_fastdata.sources.tar.PairedTarDataset` reads them.
- ``parquet``: the hubs' ``image`` and ``annotation`` columns (``{bytes, path}`` structs, named as ``Image`` features
  in the ``huggingface`` metadata), row groups of ``rows_per_group``.
- ``hdf5``: one file, a group per split: ``<split>/images`` (each file's bytes, a variable-length row each) and
  ``<split>/masks`` (``N x H x W`` uint8 classes), so every mask of a split must have one size (scans, tiles).

Every shard or file is written under a temporary name and renamed when whole; a destination already holding shards (or
the HDF5 file) is refused unless ``overwrite`` (then replaced, stale shards removed). Nothing is written into the source
folder.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image
from tqdm import tqdm

from lightning_fastdata.convert.shards import pack_shards, refuse_inside_source, shard_destination
from lightning_fastdata.errors import InvalidValueError, PathExistsError, PathNotFoundError
from lightning_fastdata.loading.atomic import atomic_path
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.segmentation.layouts import (
    CONVERTED_MASKS,
    MaskLayout,
    classes_of_layout,
    detect_layout,
)
from lightning_fastdata.segmentation.target import IGNORE_INDEX, MaskTarget, read_mask
from lightning_fastdata.sources.folder import PairedFolderDataset

__all__ = [
    "SEGMENTATION_FORMATS",
    "Sample",
    "SplitSource",
    "convert_segmentation",
    "write_segmentation_hdf5",
    "write_segmentation_parquet",
    "write_segmentation_shards",
]

#: What :func:`convert_segmentation` writes.
SEGMENTATION_FORMATS = ("tar", "parquet", "hdf5")
#: Samples read together (a bucket's requests in flight together).
_STEP = 16


class Sample(NamedTuple):
    """A converted sample: its position, image bytes and extension, mask classes and the mask file's bytes."""

    position: int
    image: bytes
    ext: str
    classes: np.ndarray
    mask: bytes


class SplitSource:
    """A split read for conversion: each sample's image bytes and its mask as classes (module docstring).

    Args:
        root: The data's root (folder or bucket URL) in a layout
            :func:`~lightning_fastdata.segmentation.layouts.find_pairs` reads.
        split: The split.
        num_classes: The classes; ``None``: the layout's (VOC 21, ADE20K 150, Cityscapes 19) or one more than
            ``label_map``'s largest class.
        ignore_index: What a value that means no class is written as.
        layout, images_dir, masks_dir, label_map, storage_options: As
            :class:`~lightning_fastdata.segmentation.layouts.MaskLayout` and
            :class:`~lightning_fastdata.segmentation.target.MaskTarget` take them.

    Raises:
        FileNotFoundError: If the split, or an image or mask it names, is missing (named).
        ValueError: If the classes cannot be told (a paired folder without ``num_classes``), or on a bad argument.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str,
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        layout: str = "auto",
        images_dir: str = "images",
        masks_dir: str = "annotations",
        label_map: Mapping[int, int] | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if num_classes is None:
            found = (
                detect_layout(os.fspath(root), storage_options) if layout == "auto" and label_map is None else layout
            )
            num_classes = classes_of_layout(
                found, label_map, ignore_index, f"Converting {os.fspath(root)}", " (--num-classes)"
            )
        target = MaskTarget(num_classes, ignore_index, label_map)
        self.data = PairedFolderDataset(
            root, split, target, MaskLayout(layout, images_dir, masks_dir), storage_options, train=False
        )
        self.split = split
        self._block: dict[int, Sample] = {}

    def __len__(self) -> int:
        return len(self.data)

    def read(self, start: int, stop: int) -> list[Sample]:
        """Samples ``start .. stop - 1``; read :data:`_STEP` or more at a time, their reads in flight together."""
        if start not in self._block or stop - 1 not in self._block:
            self._block = {s.position: s for s in self._read(start, min(len(self), max(stop, start + _STEP)))}
        return [self._block[i] for i in range(start, stop)]

    def _read(self, start: int, stop: int) -> list[Sample]:
        pairs = self.data.pairs
        samples = []
        for i, (image, mask) in zip(range(start, stop), self.data.read_fields(range(start, stop))):
            assert isinstance(image, bytes)  # a folder's files, read as they are
            values = read_mask(mask, self.data.name(i, 1))
            classes = self.data.target.decode(values, self.data.name(i, 1))  # the values, through the table
            if classes is not values and not np.array_equal(classes, values):
                mask = _png(classes)
            ext = pairs.images[i].rsplit(".", 1)[-1].lower() if "." in pairs.images[i] else "jpg"
            samples.append(Sample(i, image, ext, classes, mask))
        return samples


def _png(classes: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(classes, mode="L").save(out, format="PNG", optimize=False)
    return out.getvalue()


def _source_root(root: str | os.PathLike[str]) -> str | None:
    return None if is_url(os.fspath(root)) else os.fspath(root)


def write_segmentation_shards(
    root: str | os.PathLike[str],
    split: str,
    dst: str | os.PathLike[str],
    shard_bytes: int = 64 * 2**20,
    mask_ext: str = "seg.png",
    layout: str = "auto",
    overwrite: bool = False,
    progress: bool = False,
    **source: Any,
) -> list[Path]:
    """Write a segmentation split as tar shards (module docstring); returns the shards' paths.

    ``source``: :class:`SplitSource`'s other arguments (``num_classes``, ``label_map``, ``ignore_index``,
    ``storage_options``, ...).

    Raises:
        FileNotFoundError: If the split's images or masks are missing (named).
        FileExistsError: If ``dst`` already holds shards and not ``overwrite``.
        ValueError: If ``shard_bytes`` is not positive, ``dst`` is inside ``root``, or a mask holds a value that is no
            class (named).
    """
    return _tar(SplitSource(root, split, layout=layout, **source), dst, shard_bytes, mask_ext, overwrite, progress)


def _tar(
    data: SplitSource, dst: str | os.PathLike[str], shard_bytes: int, mask_ext: str, overwrite: bool, progress: bool
) -> list[Path]:
    if shard_bytes <= 0:
        raise InvalidValueError(f"shard_bytes should be a positive size in bytes, got {shard_bytes!r}.")
    name = "shard-%06d.tar"
    shard_destination(dst, name, overwrite, _source_root(data.data.root))

    def write(tf: tarfile.TarFile, rows: list[Sample]) -> None:
        for row in rows:
            for member, payload in (
                (f"{row.position:08d}.{row.ext}", row.image),
                (f"{row.position:08d}.{mask_ext}", row.mask),
            ):
                info = tarfile.TarInfo(member)
                info.size, info.mtime, info.mode = len(payload), 0, 0o644
                tf.addfile(info, io.BytesIO(payload))

    def open_tar(tmp: Path) -> tarfile.TarFile:
        return tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT)

    return pack_shards(
        len(data), data.read, lambda row: len(row.image) + len(row.mask) + 2048, dst, name, shard_bytes, 1,
        open_tar, write, f"tar shards ({data.split})" if progress else None,
    )  # fmt: skip


def write_segmentation_parquet(
    root: str | os.PathLike[str],
    split: str,
    dst: str | os.PathLike[str],
    shard_bytes: int = 256 * 2**20,
    rows_per_group: int = 100,
    layout: str = "auto",
    overwrite: bool = False,
    progress: bool = False,
    **source: Any,
) -> list[Path]:
    """Write a segmentation split as the hubs' Parquet files (module docstring); returns the files' paths.

    Files ``part-000000.parquet``, ... of about ``shard_bytes``, in row groups of ``rows_per_group`` rows.
    ``source``: :class:`SplitSource`'s other arguments.

    Raises:
        FileNotFoundError: If the split's images or masks are missing (named).
        FileExistsError: If ``dst`` already holds Parquet files and not ``overwrite``.
        ValueError: On a bad size, ``dst`` inside ``root``, or a mask value that is no class (named).
    """
    data = SplitSource(root, split, layout=layout, **source)
    return _parquet(data, dst, shard_bytes, rows_per_group, overwrite, progress)


def _parquet(
    data: SplitSource,
    dst: str | os.PathLike[str],
    shard_bytes: int,
    rows_per_group: int,
    overwrite: bool,
    progress: bool,
) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if shard_bytes <= 0 or rows_per_group <= 0:
        raise InvalidValueError(
            f"shard_bytes and rows_per_group should be positive, got {shard_bytes!r} and {rows_per_group!r}."
        )
    name = "part-%06d.parquet"
    shard_destination(dst, name, overwrite, _source_root(data.data.root))
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    features = {"image": {"_type": "Image"}, "annotation": {"_type": "Image"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode(), CONVERTED_MASKS.encode(): b"classes"}
    schema = pa.schema([("image", kind), ("annotation", kind)], metadata=meta)
    pairs = data.data.pairs

    def write(writer: Any, rows: list[Sample]) -> None:
        images = [{"bytes": r.image, "path": os.path.basename(pairs.images[r.position])} for r in rows]
        masks = [{"bytes": r.mask, "path": os.path.basename(pairs.payloads[r.position])} for r in rows]
        writer.write_table(pa.Table.from_arrays([pa.array(images, kind), pa.array(masks, kind)], schema=schema))

    def open_parquet(tmp: Path) -> Any:
        return pq.ParquetWriter(tmp, schema)

    return pack_shards(
        len(data), data.read, lambda row: len(row.image) + len(row.mask), dst, name, shard_bytes, rows_per_group,
        open_parquet, write, f"parquet ({data.split})" if progress else None,
    )  # fmt: skip


def write_segmentation_hdf5(
    root: str | os.PathLike[str],
    splits: Sequence[str],
    dst: str | os.PathLike[str],
    layout: str = "auto",
    overwrite: bool = False,
    progress: bool = False,
    **source: Any,
) -> Path:
    """Write segmentation splits as one HDF5 file, a group each (module docstring), atomically; returns ``dst``.

    ``source``: :class:`SplitSource`'s other arguments.

    Raises:
        FileNotFoundError: If a split's images or masks are missing (named).
        FileExistsError: If ``dst`` exists and not ``overwrite``.
        ValueError: If a split's masks differ in size (the first two named), ``dst`` is inside ``root``, or a mask
            value is no class (named).
    """
    return _hdf5([SplitSource(root, split, layout=layout, **source) for split in splits], dst, overwrite, progress)


def _hdf5(sources: Sequence[SplitSource], dst: str | os.PathLike[str], overwrite: bool, progress: bool) -> Path:
    import h5py

    dst = Path(dst)
    if dst.exists() and not overwrite:
        raise PathExistsError(f"{dst} exists: pass overwrite=True (--overwrite) to replace it.")
    refuse_inside_source(dst, _source_root(sources[0].data.root) if sources else None)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dst) as tmp, h5py.File(tmp, "w") as f:
        for data in sources:
            _write_split(f, data, progress)
    return dst


def _write_split(f: Any, data: SplitSource, progress: bool) -> None:
    import h5py

    images = f.create_dataset(f"{data.split}/images", (len(data),), dtype=h5py.vlen_dtype(np.uint8))
    masks = None
    with tqdm(total=len(data), desc=f"hdf5 ({data.split})", unit="img", disable=not progress) as bar:
        for start in range(0, len(data), _STEP):
            for row in data.read(start, min(len(data), start + _STEP)):
                if masks is None:
                    masks = f.create_dataset(f"{data.split}/masks", (len(data), *row.classes.shape), dtype=np.uint8)
                    masks.attrs[CONVERTED_MASKS] = "classes"
                    first = data.data.name(row.position, 1)
                if row.classes.shape != masks.shape[1:]:
                    raise InvalidValueError(
                        f"{data.data.name(row.position, 1)} is {row.classes.shape[1]}x{row.classes.shape[0]}, "
                        f"{first} {masks.shape[2]}x{masks.shape[1]}: one HDF5 split holds masks of one size. "
                        "Write tar shards or Parquet (format='tar'/'parquet') for images of many sizes."
                    )
                images[row.position] = np.frombuffer(row.image, np.uint8)
                masks[row.position] = row.classes
                bar.update(1)


def convert_segmentation(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    format: str = "tar",
    splits: Sequence[str] | None = None,
    shard_bytes: int | None = None,
    rows_per_group: int = 100,
    overwrite: bool = False,
    progress: bool = True,
    **source: Any,
) -> dict[str, list[Path]]:
    """Convert a segmentation dataset's splits (module docstring); what ``fastdata convert segmentation`` runs.

    ``tar`` and ``parquet`` write ``dst/<split>/`` (``SegmentationDataModule(root=dst)`` reads them by split name),
    ``hdf5`` the file ``dst`` with a group per split. ``splits``: ``None`` converts those of ``train``, ``val``,
    ``test``, ``training``, ``validation`` (ADE20K's) the source has. ``source``: :class:`SplitSource`'s arguments.
    Returns each split's written files.

    Raises:
        FileNotFoundError: If a split asked for is missing, or (``splits=None``) none of the usual ones exists.
        ValueError: If ``format`` is not one of :data:`SEGMENTATION_FORMATS`, or on a bad argument (named).
    """
    if format not in SEGMENTATION_FORMATS:
        raise InvalidValueError(f"format should be one of {', '.join(SEGMENTATION_FORMATS)}, got {format!r}.")
    usual = ("train", "val", "test", "training", "validation")
    sources = []
    for split in usual if splits is None else splits:
        try:
            sources.append(SplitSource(src, split, **source))
        except FileNotFoundError:
            if splits is not None:
                raise
    if not sources:
        raise PathNotFoundError(f"{os.fspath(src)} has none of the splits {', '.join(usual)}: give splits=.")
    if format == "hdf5":
        path = _hdf5(sources, dst, overwrite, progress)
        return {data.split: [path] for data in sources}
    size = shard_bytes or (64 * 2**20 if format == "tar" else 256 * 2**20)
    return {
        data.split: _tar(data, Path(dst, data.split), size, "seg.png", overwrite, progress)
        if format == "tar"
        else _parquet(data, Path(dst, data.split), size, rows_per_group, overwrite, progress)
        for data in sources
    }
