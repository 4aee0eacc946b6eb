"""HDF5 files inspected: what one holds (images, labels, classes, its layout) and how it is opened read-only.

:func:`inspect_hdf5` opens a file once, checks it and returns its :class:`HDF5Layout` (closed again: an
``h5py.File`` must not cross a ``fork``); :class:`~lightning_fastdata.datasets.hdf5.HDF5Dataset` reads by that
layout in each process; :func:`~lightning_fastdata.convert_folder_to_hdf5` writes the layout this reads best.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lightning_fastdata.datasets.arrays import MappedFile
from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError

__all__ = [
    "ENTROPY_ATTR",
    "ENTROPY_BLOB",
    "ENTROPY_OFFSETS",
    "FORMAT_VERSION",
    "HDF5Layout",
    "Layout",
    "entropy_index_of_file",
    "inspect_hdf5",
    "open_hdf5",
]

#: Version of the layout written by :func:`~lightning_fastdata.convert_folder_to_hdf5`.
FORMAT_VERSION = 1

Layout = Literal["auto", "encoded", "hwc", "chw"]


def _h5py() -> Any:
    import h5py

    return h5py


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _is_hdf5(path: str) -> bool:
    """Whether ``path`` starts an HDF5 superblock at 0, 512, 1024, 2048, ... (read directly: no lock taken)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        offset = 0
        while offset + 8 <= size:
            f.seek(offset)
            if f.read(8) == _HDF5_SIGNATURE:
                return True
            offset = 512 if offset == 0 else offset * 2
    return False


def open_hdf5(path: str, locking: bool | None = None, **kwargs: Any) -> Any:
    """Open ``path`` read-only with h5py, honouring ``locking``; errors name the file and the fix.

    A file another process is writing in SWMR mode is opened for SWMR reading.

    Raises:
        OSError: If the file is truncated, locked or open for writing by another process, or otherwise unreadable.
    """
    h5py = _h5py()
    try:
        try:
            return h5py.File(path, "r", locking=locking, **kwargs)
        except OSError as first:
            if "already open for write" not in str(first) or kwargs.get("swmr"):
                raise
            try:
                return h5py.File(path, "r", locking=locking, swmr=True, **kwargs)  # a SWMR writer: read alongside
            except OSError:
                raise first from None
    except OSError as err:
        text = str(err)
        if "truncated" in text or "eof" in text.lower():
            hint = "it was not completely written or copied: copy or convert it again"
        elif "lock" in text:
            hint = (
                "another process holds a lock on it (a writer may still have it open); wait until it closes the "
                "file, or pass locking=False (HDF5DataModule/HDF5Dataset; needed on NFS/Lustre) to read without locks"
            )
        elif "open for write" in text or "SWMR" in text:
            hint = (
                "another process has it open for writing, or a writer crashed and left it marked open: close the "
                "writer before training (or write in SWMR mode to read alongside it); after a crash, clear the mark "
                "with `h5clear -s FILE`"
            )
        else:
            hint = "check that it is a complete, readable HDF5 file"
        raise DataError(f"Cannot open HDF5 file {path!r}: {text}; {hint}.") from err


@dataclass(frozen=True)
class HDF5Layout:
    """What :func:`inspect_hdf5` found in a file; plain values, cheap to pickle.

    Args:
        path: The file.
        images_key: Dataset holding the images.
        labels_key: Dataset holding the labels.
        kind: ``"encoded"`` (encoded file bytes), ``"hwc"`` or ``"chw"`` (decoded arrays).
        offsets_key: For encoded images stored as one byte blob: the ``N + 1`` offsets dataset.
        vlen: Encoded images stored as a variable-length dataset (one heap object per image).
        mmap_offset: Byte offset of a contiguous, uncompressed images dataset (read by memory map), else None.
        shape: Shape of the images dataset.
        dtype: Numpy dtype name of the images dataset (or of its elements, for vlen).
        chunk_rows: Rows per chunk along axis 0 for a chunked dataset, else None.
        classes: Class names from the file's ``classes`` attribute, else ``("0", "1", ...)``.
        labels: All labels: int64 class positions, or uint8 multi-hot rows (``N x C``).
        signature: ``(size, mtime_ns)`` of the file when inspected (a reader refuses a file changed since).
        offsets: The ``N + 1`` byte offsets (int64) of a blob of encoded images, read once here, else None.
        entropy_offsets: The ``N + 1`` offsets of each image's entropy index in the file's ``entropy_index``
            blob (written by :func:`~lightning_fastdata.convert_folder_to_hdf5`), else None.
        entropy_mmap_offset: Byte offset of that blob in the file (it is read by memory map).
    """

    path: str
    images_key: str
    labels_key: str
    kind: Literal["encoded", "hwc", "chw"]
    offsets_key: str | None
    vlen: bool
    mmap_offset: int | None
    shape: tuple[int, ...]
    dtype: str
    chunk_rows: int | None
    classes: tuple[str, ...]
    labels: np.ndarray
    signature: tuple[int, int] = (0, 0)
    offsets: np.ndarray | None = None
    entropy_offsets: np.ndarray | None = None
    entropy_mmap_offset: int | None = None


def _labels_of(path: str, key: str, labels_ds: Any) -> np.ndarray:
    """The labels: ``int64`` class positions, or ``uint8`` multi-hot rows (several labels per sample).

    Class positions come as ``(N,)`` or with size-1 dimensions after the first (PCam's ``N x 1 x 1 x 1``),
    multi-hot rows as ``N x C`` of 0/1 (``C > 1``).

    Raises:
        ValueError: On another shape or dtype, or a multi-hot value other than 0/1 (named).
    """
    if labels_ds.ndim == 2 and labels_ds.shape[1] > 1 and labels_ds.dtype.kind in "iub":
        rows = labels_ds[()]
        bad = np.argwhere((rows != 0) & (rows != 1))
        if bad.size:
            r, c = (int(v) for v in bad[0])
            raise InvalidValueError(
                f"{path!r}[{key!r}] has shape {labels_ds.shape}: multi-hot rows (one column per class) take 0 or 1, "
                f"but [{r}, {c}] = {rows[r, c]} ({len(bad)} such values)."
            )
        return rows.astype(np.uint8)
    # one integer label per sample; trailing size-1 dimensions (PCam's N x 1 x 1 x 1) are that too
    if labels_ds.ndim < 1 or any(d != 1 for d in labels_ds.shape[1:]) or labels_ds.dtype.kind not in "iu":
        raise InvalidValueError(
            f"{path!r}[{key!r}] should hold one integer label per sample (shape (N,), or (N, 1, ...) with size-1 "
            f"dimensions after the first) or multi-hot rows (N x C of 0/1), got shape {labels_ds.shape} dtype "
            f"{labels_ds.dtype}."
        )
    return labels_ds[()].astype(np.int64).reshape(-1)


def _layout_kind(path: str, images_key: str, images: Any, vlen_base: Any, has_offsets: bool, f: Any) -> str:
    """``"encoded"``, ``"hwc"`` or ``"chw"``: the images' layout told from their dtype, shape and the file's marks."""
    if vlen_base is not None or has_offsets or f.attrs.get("mode", None) == "encoded":
        return "encoded"
    if images.ndim == 4 and images.shape[-1] == 3:
        return "hwc"
    if images.ndim == 4 and images.shape[1] == 3:
        return "chw"
    raise InvalidValueError(
        f"Cannot tell the layout of {path!r}[{images_key!r}] (shape {images.shape}, dtype {images.dtype}); "
        "expected encoded bytes (vlen uint8, or a uint8 blob plus an offsets dataset) or a 4-D array "
        "N x H x W x 3 or N x 3 x H x W. Pass layout= explicitly."
    )


def _image_count(
    path: str, images_key: str, images: Any, kind: str, vlen_base: Any, offsets: tuple[str, bool], f: Any
) -> tuple[int, str | None]:
    """How many images the dataset holds in layout ``kind``, and its offsets dataset (a blob's), checked.

    ``offsets``: the offsets dataset's name, and whether the file holds it beside a 1-D uint8 blob.
    """
    if kind != "encoded":
        channel_axis = -1 if kind == "hwc" else 1
        if images.ndim != 4 or images.shape[channel_axis] != 3:
            raise InvalidValueError(
                f"{path!r}[{images_key!r}] has shape {images.shape}; layout={kind!r} expects "
                f"{'N x H x W x 3' if kind == 'hwc' else 'N x 3 x H x W'}."
            )
        if images.dtype not in (np.uint8, np.float32, np.float16, np.float64):
            raise InvalidValueError(f"{path!r}[{images_key!r}] has dtype {images.dtype}; expected uint8 or float.")
        return int(images.shape[0]), None
    if vlen_base is not None:
        if vlen_base != np.uint8 or images.ndim != 1:
            raise InvalidValueError(f"{path!r}[{images_key!r}]: encoded images should be vlen uint8, got {vlen_base}.")
        return int(images.shape[0]), None
    offsets_key, has_offsets = offsets
    if has_offsets:
        found = f[offsets_key]
        if found.ndim != 1 or found.shape[0] < 1:
            raise InvalidValueError(f"{path!r}[{offsets_key!r}] should be a 1-D array of N + 1 byte offsets.")
        return int(found.shape[0]) - 1, offsets_key
    raise InvalidValueError(
        f"{path!r}[{images_key!r}] (shape {images.shape}, dtype {images.dtype}) is not encoded bytes: "
        f"expected vlen uint8, or a 1-D uint8 blob with an {offsets_key!r} dataset."
    )


def _checked_classes(
    path: str, labels_key: str, labels: np.ndarray, classes_attr: Any
) -> tuple[tuple[str, ...] | None, int]:
    """The file's class names (its ``classes`` attribute, or ``None``) and their number, the labels checked in it."""
    classes = tuple(json.loads(classes_attr)) if classes_attr is not None else None
    if labels.ndim == 2:  # multi-hot rows: one column per class
        num_classes = labels.shape[1]
        if classes is not None and len(classes) != num_classes:
            raise InvalidValueError(
                f"{path!r}: {len(classes)} names in its classes attribute but {num_classes} columns in "
                f"{labels_key!r}; they should match (one column per class)."
            )
    else:
        num_classes = len(classes) if classes is not None else int(labels.max(initial=-1)) + 1
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes)) if labels.ndim == 1 else np.zeros(0, np.int64)
    if bad.size:
        raise InvalidValueError(
            f"{path!r}[{labels_key!r}][{bad[0]}] = {labels[bad[0]]} is out of range [0, {num_classes}) "
            f"({bad.size} such labels)."
        )
    return classes, int(num_classes)


def inspect_hdf5(
    path: str,
    images_key: str = "images",
    labels_key: str = "labels",
    layout: Layout = "auto",
    offsets_key: str = "offsets",
    locking: bool | None = None,
) -> HDF5Layout:
    """Open ``path`` read-only, validate its layout, and return what readers need. The file is closed again.

    Args:
        path: The HDF5 file.
        images_key: Dataset of the images (or of the encoded bytes).
        labels_key: Dataset of the integer labels.
        layout: ``"auto"`` (from dtype and shape), or the layout the images are stored in.
        offsets_key: Dataset of the byte offsets (encoded files written by the converter).
        locking: h5py's file locking; ``None``: h5py's default (see
            :func:`~lightning_fastdata.datasets.hdf5_file.open_hdf5`).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        OSError: If the file is truncated or locked (see :func:`~lightning_fastdata.datasets.hdf5_file.open_hdf5`).
        ValueError: If it is not an HDF5 file, a key is missing, the format version is newer than this
            package, images and labels differ in length, a dtype or rank is wrong, or a label is out of range.
    """
    h5py = _h5py()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise PathNotFoundError(f"HDF5 file {path!r} does not exist.")
    if not _is_hdf5(path):
        raise InvalidValueError(
            f"{path!r} is not an HDF5 file. Convert an image folder with `fastdata convert hdf5 --src DIR --dst FILE`."
        )
    signature = MappedFile.signature(path)
    with open_hdf5(path, locking) as f:
        version = int(f.attrs.get("fastdata_format", 0))
        if version > FORMAT_VERSION:
            raise InvalidValueError(
                f"{path!r} has fastdata_format={version}, newer than this package reads ({FORMAT_VERSION}); "
                "upgrade lightning-fastdata."
            )
        for key in (images_key, labels_key):
            if key not in f or not isinstance(f[key], h5py.Dataset):
                raise InvalidValueError(
                    f"{path!r} has no dataset {key!r} (found: {sorted(f.keys())}); name yours with images_key= and "
                    "labels_key=."
                )
        images, labels_ds = f[images_key], f[labels_key]
        labels = _labels_of(path, labels_key, labels_ds)
        vlen_base = h5py.check_vlen_dtype(images.dtype)
        has_offsets = offsets_key in f and images.ndim == 1 and images.dtype == np.uint8
        kind = layout if layout != "auto" else _layout_kind(path, images_key, images, vlen_base, has_offsets, f)
        n, offsets_name = _image_count(path, images_key, images, kind, vlen_base, (offsets_key, has_offsets), f)
        if n != len(labels):
            raise InvalidValueError(
                f"{path!r}: {n} images but {len(labels)} labels in {labels_key!r}; they must have the same length."
            )
        classes, num_classes = _checked_classes(path, labels_key, labels, f.attrs.get("classes", None))
        mmap_offset = None
        if vlen_base is None and images.chunks is None and images.compression is None:
            mmap_offset = images.id.get_offset()
        entropy = entropy_index_of_file(f, n) if kind == "encoded" else None
        return HDF5Layout(
            path=path,
            images_key=images_key,
            labels_key=labels_key,
            kind=kind,  # type: ignore[arg-type]
            offsets_key=offsets_name,
            offsets=None if offsets_name is None else f[offsets_name][()].astype(np.int64),
            vlen=vlen_base is not None,
            mmap_offset=None if mmap_offset is None else int(mmap_offset),
            shape=tuple(images.shape),
            dtype=str(np.dtype(vlen_base if vlen_base is not None else images.dtype)),
            chunk_rows=None if images.chunks is None else int(images.chunks[0]),
            classes=classes if classes is not None else tuple(str(i) for i in range(num_classes)),
            labels=labels,
            signature=signature,
            entropy_offsets=None if entropy is None else entropy[0],
            entropy_mmap_offset=None if entropy is None else entropy[1],
        )


#: The datasets and attribute of the entropy index in a file (:func:`~lightning_fastdata.convert_folder_to_hdf5`)
ENTROPY_BLOB, ENTROPY_OFFSETS, ENTROPY_ATTR = "entropy_index", "entropy_index_offsets", "entropy_index_format"


def entropy_index_of_file(f: Any, n: int) -> tuple[np.ndarray, int] | None:
    """``(offsets, byte offset of the blob)`` of the file's entropy index, or ``None``.

    ``None``: no index, another format, or not one entry per image (decoded without it: the same pixels).
    """
    from lightning_fastdata.loading.jpeg.entropy_index import FORMAT

    if ENTROPY_BLOB not in f or ENTROPY_OFFSETS not in f or f.attrs.get(ENTROPY_ATTR) != FORMAT:
        return None
    blob, offsets = f[ENTROPY_BLOB], f[ENTROPY_OFFSETS][()].astype(np.int64)
    where = blob.id.get_offset() if blob.chunks is None and blob.compression is None else None
    whole = offsets.shape == (n + 1,) and offsets[0] == 0 and bool((np.diff(offsets) >= 0).all())
    if where is None or not whole or int(offsets[-1]) != blob.shape[0] or blob.dtype != np.uint8:
        return None
    return offsets, int(where)
