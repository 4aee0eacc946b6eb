"""Write an image folder into one HDF5 file: in parallel, with a progress bar, atomically."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image
from tqdm import tqdm

from lightning_fastdata.datasets.hdf5_file import (
    ENTROPY_ATTR,
    ENTROPY_BLOB,
    ENTROPY_OFFSETS,
    FORMAT_VERSION,
    inspect_hdf5,
)
from lightning_fastdata.errors import DataError, InvalidValueError, PathExistsError
from lightning_fastdata.loading.atomic import atomic_path, side_path
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.index.table import LabelTable, labelled_indexes, read_label_table
from lightning_fastdata.loading.jpeg.decode import decode_center_crop_bytes
from lightning_fastdata.loading.jpeg.entropy_index import FORMAT as ENTROPY_FORMAT
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_available, index_file
from lightning_fastdata.loading.storage.base import Storage, is_url
from lightning_fastdata.loading.storage.local import LocalStorage
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.loading.storage.source_reads import init_source_process, map_sources
from lightning_fastdata.loading.workers import CpuBudget

__all__ = ["convert_folder_to_hdf5"]


def _read_verified(data: bytes, path: str) -> bytes:
    """The file's bytes, after checking that it decodes (so a corrupt image fails the conversion, named)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception as err:  # PIL raises several types for broken files
        raise DataError(f"Cannot convert {path!r}: {err}. Replace or remove the file, then run again.") from err
    return data


def _reencode(data: bytes, path: str, max_side: int, quality: int) -> bytes:
    """The image ``data`` (read from ``path``) as a JPEG whose shorter side is at most ``max_side``, at ``quality``.

    Decoded at the smallest DCT scale that still covers the target (``draft``), resized with antialiasing,
    encoded once with 4:2:0 chroma subsampling (libjpeg's default, what photos use). Never upscaled.
    """
    try:
        with Image.open(io.BytesIO(data)) as img:
            short = min(img.size)
            if short > max_side:
                img.draft("RGB", (img.size[0] * max_side // short, img.size[1] * max_side // short))
            rgb = img.convert("RGB")
    except Exception as err:  # PIL raises several types for broken files
        raise DataError(f"Cannot convert {path!r}: {err}. Replace or remove the file, then run again.") from err
    short = min(rgb.size)
    if short > max_side:
        w, h = rgb.size
        target = (max(1, round(w * max_side / short)), max(1, round(h * max_side / short)))
        rgb = rgb.resize(target, Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    rgb.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _read_indexed(data: bytes, path: str) -> tuple[bytes, bytes]:
    """The verified bytes and their entropy index (``b""``: none, not a JPEG the index serves)."""
    data = _read_verified(data, path)
    return data, index_file(data, path)


def _reencode_indexed(data: bytes, path: str, max_side: int, quality: int) -> tuple[bytes, bytes]:
    """The re-encoded bytes and their entropy index."""
    data = _reencode(data, path, max_side, quality)
    return data, index_file(data, path)


def _decode_square(data: bytes, path: str, size: int) -> np.ndarray:
    return decode_center_crop_bytes(data, path, size)


class _SideBlob:
    """Byte strings appended to a side file, then stored as one uint8 dataset and its ``N + 1`` offsets.

    A contiguous (memory-mappable) dataset needs its size up front, and these sizes are known only at the end.
    """

    def __init__(self, side: Path) -> None:
        self.side, self.sizes = side, list[int]()
        self.out = open(side, "wb")  # noqa: SIM115 - closed in store() or discard()

    def append(self, data: bytes) -> None:
        self.out.write(data)
        self.sizes.append(len(data))

    def store(self, f: Any, name: str, offsets_name: str) -> None:
        self.out.close()
        offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=offsets[1:])
        f.create_dataset(offsets_name, data=offsets)
        blob = f.create_dataset(name, shape=(int(offsets[-1]),), dtype=np.uint8)
        step = 64 << 20
        with open(self.side, "rb") as src:
            for start in range(0, int(offsets[-1]), step):
                chunk = src.read(step)
                blob[start : start + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)

    def discard(self) -> None:
        self.out.close()
        self.side.unlink(missing_ok=True)


def _write_reencoded(f: Any, results: Iterator[tuple[bytes, bytes]], dst: Path, bar: tqdm) -> None:
    """Store images and their entropy indexes (``images`` + ``offsets``, ``entropy_index`` + its offsets)."""
    images, indexes = _SideBlob(side_path(dst, "bytes")), _SideBlob(side_path(dst, "entropy"))
    try:
        for data, index in results:
            images.append(data)
            indexes.append(index)
            bar.update()
        images.store(f, "images", "offsets")
        _store_entropy_index(f, indexes)
    finally:
        images.discard()
        indexes.discard()


def _store_entropy_index(f: Any, indexes: _SideBlob) -> None:
    """The images' entropy indexes as ``entropy_index`` + ``entropy_index_offsets`` (none where it is not built)."""
    if entropy_index_available():
        indexes.store(f, ENTROPY_BLOB, ENTROPY_OFFSETS)
        f.attrs[ENTROPY_ATTR] = ENTROPY_FORMAT


def convert_folder_to_hdf5(
    src: str | os.PathLike[str] | FileIndex,
    dst: str | os.PathLike[str],
    mode: Literal["encoded", "raw"] = "encoded",
    size: int = 256,
    processes: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    max_side: int | None = None,
    quality: int = 90,
    storage_options: dict[str, Any] | None = None,
    storage: Storage | None = None,
    labels: str | os.PathLike[str] | None = None,
    multi_label: bool = False,
    class_names: list[str] | None = None,
    label_separator: str = " ",
    id_column: str | None = None,
    label_column: str | None = None,
) -> Path:
    """Convert ``src/<class>/<image>`` into the HDF5 layout that :class:`~lightning_fastdata.HDF5Dataset` reads fastest.

    Layout (format version 1): ``images`` is contiguous and uncompressed (so readers memory-map it): in
    ``encoded`` mode a 1-D uint8 blob of the original files' bytes with ``offsets`` (``N + 1`` int64), in
    ``raw`` mode ``N x size x size x 3`` uint8 (the central square of each image, resized); ``labels`` int64 (uint8
    multi-hot rows ``N x C`` with several labels per image);
    attributes ``fastdata_format``, ``mode``, ``classes`` (JSON list), ``size`` (raw) and ``source``. In
    ``encoded`` mode, where the compiled decoder is installed, also each image's entropy index
    (:mod:`~lightning_fastdata.loading.jpeg.entropy_index`, at most 1.5% of its bytes): ``entropy_index`` (a uint8
    blob, empty for an image it cannot serve) with ``entropy_index_offsets`` (``N + 1``) and the attribute
    ``entropy_index_format``; :class:`~lightning_fastdata.HDF5Dataset` decodes each crop with it.

    The file is written under a hidden temporary name beside ``dst`` (:mod:`~lightning_fastdata.loading.atomic`),
    re-opened and checked, and only then renamed to ``dst``: an interrupted or killed conversion never leaves a
    file at ``dst``.

    Args:
        src: Image folder (torchvision ``ImageFolder`` layout and class order), a bucket URL of one
            (``s3://bucket/train``: listed, then read by the conversion processes, a chunk of objects at a time
            fetched concurrently), or an index of (part of) one.
        dst: Output file.
        mode: ``"encoded"`` keeps the JPEG bytes (small file, decode per epoch); ``"raw"`` stores decoded pixels
            (no decode per epoch, ~150 KB per 224-px image).
        size: Side of the stored square in ``raw`` mode.
        max_side: ``encoded`` mode only: re-encode each image once with its shorter side at most this (e.g. 256
            for 224 crops) at ``quality``, instead of keeping the original bytes: the compact cache of data that
            does not fit in RAM (~4-6x smaller than ImageNet's originals, ~7x smaller than a 256 px raw file),
            decoded at train time by the same region-of-interest path. ``None``: keep the files as they are.
        quality: JPEG quality of the re-encoded images (``max_side`` only).
        storage_options: Object-store settings for a URL ``src`` (see
            :class:`~lightning_fastdata.loading.storage.object_store.ObjectStorage`); default: the standard environment.
        storage: Where an index ``src``'s files are read from (default: its local root).
        labels: A label table (``.csv``/``.parquet``, :mod:`~lightning_fastdata.loading.index.table`) naming every
            image under ``src`` (found at any depth, not by class sub-folder); ``None``: class sub-folders.
        multi_label: With ``labels``: several labels per image, written as ``uint8`` multi-hot rows (``N x C``),
            which :class:`~lightning_fastdata.HDF5Dataset` reads back as they are.
        class_names: With ``labels``: the class list in label order (default: the table's).
        label_separator: With ``multi_label``: what separates a cell's labels (``" "``: spaces; ``"|"``).
        id_column: With ``labels``: the table's column of image ids (default: its first).
        label_column: With ``labels``: the table's column of labels, the others left out (default: all but the ids').
        processes: Reading/decoding processes; default: usable CPUs.
        overwrite: Replace an existing ``dst``.
        progress: Show a progress bar.

    Returns:
        ``dst`` as a ``Path``.

    Raises:
        FileExistsError: If ``dst`` exists and ``overwrite`` is false.
        FileNotFoundError: If ``src`` is not an image folder.
        OSError: If an image is corrupt (the message names it); nothing is written at ``dst``.
        ValueError: On an impossible argument.
    """
    import h5py

    _check_conversion(mode, size, max_side, quality)
    dst = Path(dst)
    if dst.exists() and not overwrite:
        raise PathExistsError(f"{str(dst)!r} exists; pass overwrite=True (--overwrite) to replace it.")
    if (multi_label or class_names is not None or id_column or label_column) and labels is None:
        raise InvalidValueError(
            "multi_label, class_names, id_column and label_column describe a label table: pass labels= (--labels)."
        )
    table = None if labels is None else read_label_table(labels, label_separator, id_column, label_column)
    index, storage = _source_listing(src, storage, storage_options, table, multi_label, class_names)
    processes = processes or CpuBudget.detect().usable
    dst.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic_path(dst) as tmp,
        tqdm(total=len(index), desc=f"hdf5 ({mode})", unit="img", disable=not progress) as bar,
    ):
        context = get_context("fork" if os.name == "posix" else "spawn")
        with context.Pool(processes, initializer=init_source_process) as pool:
            with h5py.File(tmp, "w", libver="latest") as f:
                f.attrs.update(
                    fastdata_format=FORMAT_VERSION,
                    mode=mode,
                    classes=json.dumps(list(index.classes)),
                    source=storage.location(),
                )
                stored = index.labels.astype(np.uint8 if index.labels.ndim == 2 else np.int64)  # multi-hot: uint8
                f.create_dataset("labels", data=stored)
                if max_side is not None:
                    f.attrs.update(max_side=max_side, quality=quality)
                    reencoded = map_sources(pool, storage, index, _reencode_indexed, (max_side, quality))
                    _write_reencoded(f, reencoded, dst, bar)
                elif mode == "encoded" and storage.remote:  # no sizes up front: through the side file
                    _write_reencoded(f, map_sources(pool, storage, index, _read_indexed), dst, bar)
                elif mode == "encoded":
                    _write_encoded_files(f, map_sources(pool, storage, index, _read_indexed), index, dst, bar)
                else:
                    f.attrs["size"] = size
                    images = f.create_dataset("images", shape=(len(index), size, size, 3), dtype=np.uint8)
                    for i, arr in enumerate(map_sources(pool, storage, index, _decode_square, (size,))):
                        images[i] = arr
                        bar.update()
        check = inspect_hdf5(str(tmp))  # re-open and validate before the file gets its real name
        if len(check.labels) != len(index) or check.mmap_offset is None:
            raise DataError(f"Verification of {str(tmp)!r} failed; nothing was written to {str(dst)!r}.")
    return dst


def _check_conversion(mode: str, size: int, max_side: int | None, quality: int) -> None:
    """Refuse an impossible conversion argument, naming it.

    Raises:
        ValueError: On an unknown ``mode``, a size or quality out of range, ``max_side`` without ``"encoded"``.
    """
    if mode not in ("encoded", "raw"):
        raise InvalidValueError(f"mode should be 'encoded' or 'raw', got {mode!r}.")
    if size <= 0:
        raise InvalidValueError(f"size should be a positive int, got {size!r}.")
    if max_side is not None and (mode != "encoded" or max_side <= 0):
        raise InvalidValueError(f"max_side={max_side!r} needs mode='encoded' and a positive int (the shorter side).")
    if not 1 <= quality <= 100:
        raise InvalidValueError(f"quality should be 1..100 (JPEG quality), got {quality!r}.")


def _source_listing(
    src: Any,
    storage: Storage | None,
    storage_options: dict[str, Any] | None,
    table: LabelTable | None,
    multi_label: bool,
    class_names: list[str] | None,
) -> tuple[FileIndex, Storage]:
    """The files to convert, with their labels (class sub-folders, or a label table), and where they are read."""
    if isinstance(src, FileIndex):
        return src, storage or LocalStorage(src.root)
    root = src if isinstance(src, str) and is_url(src) else os.fspath(src)
    storage = open_storage(root, storage_options)
    if table is None:
        return storage.list_files(), storage
    return labelled_indexes([storage.list_images()], table, multi_label, class_names)[0], storage


def _write_encoded_files(f: Any, results: Iterator, index: FileIndex, dst: Path, bar: Any) -> None:
    """A local folder's files as they are, into one ``images`` blob (their sizes known up front).

    Each file's entropy index (made by the process that read it) goes beside it.

    Raises:
        DataError: If a file changed size between its listing and its read.
    """
    paths = [index.path(i) for i in range(len(index))]
    sizes = np.array([os.path.getsize(p) for p in paths], dtype=np.int64)
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    f.create_dataset("offsets", data=offsets)
    blob = f.create_dataset("images", shape=(int(offsets[-1]),), dtype=np.uint8)
    indexes = _SideBlob(side_path(dst, "entropy"))
    try:
        for i, (data, entry) in enumerate(results):
            if len(data) != sizes[i]:
                raise DataError(f"{paths[i]!r} changed size during the conversion; run it again.")
            blob[offsets[i] : offsets[i + 1]] = np.frombuffer(data, dtype=np.uint8)
            indexes.append(entry)
            bar.update()
        _store_entropy_index(f, indexes)
    finally:
        indexes.discard()
