"""``SegmentationHDF5Dataset``: images and masks from one HDF5 file (a group per split, or the file's top level).

The layout of medical and scientific imaging files: an ``images`` dataset (decoded uint8 ``N x H x W x 3``,
``N x 3 x H x W`` or grey ``N x H x W``; or encoded files, one variable-length byte string each) and a ``masks``
dataset of the same ``N`` (``N x H x W`` or ``N x H x W x 1``, integers: the classes). A split is the group of its
name (``train/images``, ``val/masks``, ...) or, for a file without groups, the file's top level. The file is opened
lazily in each process that reads it (and again after a fork), never in ``__init__`` beyond a check, so any number
of workers and ranks read it. Each sample goes through the same window as the folder source's
(:class:`~lightning_fastdata.segmentation.dataset.WindowedSegmentation`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_fastdata.datasets.hdf5_file import open_hdf5
from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.segmentation.dataset import WindowedSegmentation, sample_key
from lightning_fastdata.segmentation.layouts import (
    CONVERTED_MASKS,
    map_mask,
    mask_table,
    refuse_named_table_on_classes,
)
from lightning_fastdata.segmentation.window import IGNORE_INDEX

__all__ = ["HDF5_SUFFIXES", "SegmentationHDF5Dataset", "hdf5_split_group", "pixel_kind"]

#: File names read as HDF5 files.
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf")


def hdf5_split_group(path: str, split: str, images_key: str = "images", top_level_split: str = "train") -> str:
    """The group of ``split`` in ``path``.

    ``split`` itself if the file has it; ``""`` (the top level) for ``top_level_split`` in a file whose top level holds
    ``images_key``.

    Raises:
        FileNotFoundError: If the file has neither (the groups found named).
    """
    with open_hdf5(path) as f:
        if split in f and hasattr(f[split], "keys"):
            return split
        if split == top_level_split and images_key in f:
            return ""
        groups = sorted(k for k in f if hasattr(f[k], "keys"))
    raise PathNotFoundError(
        f"{path} has no group {split!r} (its groups: {groups or 'none'}): a split is a group holding "
        f"{images_key!r} and its masks, or the file's top level for the training split."
    )


def pixel_kind(images: Any, name: str) -> str:
    """How an HDF5 images dataset holds its pixels: ``"encoded"``, ``"hwc"``, ``"chw"`` or grey (uint8 only).

    Raises:
        ValueError: For pixels that are not uint8 (named with ``name``).
    """
    if images.dtype.kind == "O" or images.dtype.metadata and "vlen" in images.dtype.metadata:
        return "encoded"
    if images.dtype != np.uint8:
        raise InvalidValueError(
            f"{name} holds {images.dtype} pixels: give uint8 images (0-255), decoded or encoded (JPEG/PNG bytes)."
        )
    if images.ndim == 4 and images.shape[3] == 3:
        return "hwc"
    if images.ndim == 4 and images.shape[1] == 3:
        return "chw"
    if images.ndim == 3:
        return "grey"
    raise InvalidValueError(
        f"{name} has shape {tuple(images.shape)}: images are N x H x W x 3, N x 3 x H x W, N x H x W (grey), or "
        "one encoded file each."
    )


class SegmentationHDF5Dataset(WindowedSegmentation):
    """A split of an HDF5 file's images and masks as whole batches (module docstring).

    Args:
        path: The HDF5 file.
        group: The split's group (``""``: the file's top level); see :func:`hdf5_split_group`.
        images_key: The images dataset in the group.
        masks_key: The masks dataset in the group.
        num_classes: The classes a mask holds.
        label_map: Mask value -> class (or -> ``ignore_index``), or ``"ade20k"``/``"cityscapes"`` (that layout's
            table); ``None``: the values are the classes.
        locking: h5py's file locking (``False`` on NFS and other network file systems).
        **kwargs: The window settings of :class:`~lightning_fastdata.segmentation.dataset.WindowedSegmentation`
            (``train``, ``base_size``, ``crop_size``, ``hflip_prob``, ``seed``, ``ignore_index``).

    Raises:
        FileNotFoundError: If the file, group or a dataset is missing (named).
        ValueError: If the images and masks differ in count or size, or are not images and masks (named).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        group: str = "",
        images_key: str = "images",
        masks_key: str = "masks",
        num_classes: int = 21,
        label_map: Mapping[int, int] | str | None = None,
        locking: bool | None = None,
        ignore_index: int = IGNORE_INDEX,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, ignore_index=ignore_index, **kwargs)
        self.path, self.group, self.locking = os.fspath(path), group, locking
        self.keys = tuple(f"{group}/{k}" if group else k for k in (images_key, masks_key))
        if not os.path.isfile(self.path):
            raise PathNotFoundError(f"HDF5 file {self.path!r} does not exist.")
        with open_hdf5(self.path, locking) as f:
            for key in self.keys:
                if key not in f:
                    raise PathNotFoundError(f"{self.path} has no dataset {key!r}: give images_key= and masks_key=.")
            images, masks = f[self.keys[0]], f[self.keys[1]]
            self.kind = pixel_kind(images, f"{self.path}:{self.keys[0]}")
            if masks.dtype.kind not in "iu" or not (masks.ndim == 3 or masks.ndim == 4 and masks.shape[3] == 1):
                raise InvalidValueError(
                    f"{self.path}:{self.keys[1]} is {masks.dtype} of shape {tuple(masks.shape)}: masks are integer "
                    "N x H x W (or N x H x W x 1) arrays of class indices."
                )
            if len(images) != len(masks):
                raise InvalidValueError(
                    f"{self.path} holds {len(images)} images ({self.keys[0]}) and {len(masks)} masks ({self.keys[1]})."
                )
            if self.kind != "encoded":
                size = images.shape[2:4] if self.kind == "chw" else images.shape[1:3]
                if tuple(size) != tuple(masks.shape[1:3]):
                    raise InvalidValueError(
                        f"{self.path}: the images ({self.keys[0]}) are {size[1]}x{size[0]}, the masks "
                        f"({self.keys[1]}) {masks.shape[2]}x{masks.shape[1]}: a mask must be its image's size."
                    )
            self.count = len(images)
            refuse_named_table_on_classes(label_map, masks.attrs.get(CONVERTED_MASKS), f"{self.path}:{self.keys[1]}")
        if label_map is not None:
            self.table = mask_table("", num_classes, ignore_index, label_map)
        self._file: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": -1}  # a handle never crosses a process

    def __len__(self) -> int:
        return self.count

    def _open(self) -> Any:
        if self._file is None or self._pid != os.getpid():  # first use here, or a forked copy of the parent's
            self._file = open_hdf5(self.path, self.locking)
            self._pid = os.getpid()
        return self._file

    def name(self, index: int, what: int = 0) -> str:
        """Sample ``index``'s image (``what=0``) or mask (``1``), as messages name it."""
        return f"{self.path}:{self.keys[what]}[{index}]"

    def _image(self, value: Any) -> bytes | torch.Tensor:
        if self.kind == "encoded":
            return value if isinstance(value, bytes) else np.asarray(value, dtype=np.uint8).tobytes()
        array = torch.from_numpy(np.ascontiguousarray(value))
        if self.kind == "hwc":
            return array.permute(2, 0, 1)
        if self.kind == "grey":
            return array.unsqueeze(0).expand(3, -1, -1)
        return array

    def _mask(self, value: np.ndarray, index: int) -> np.ndarray:
        return self.classes_of(self._values(value, index), self.name(index, 1))

    def _values(self, value: np.ndarray, index: int) -> np.ndarray:
        """A stored mask's values as uint8 (``H x W``), checked to be 0-255."""
        values = value[..., 0] if value.ndim == 3 else value
        if values.dtype != np.uint8:
            low, high = int(values.min()), int(values.max())
            if low < 0 or high > 255:
                raise DataError(
                    f"{self.name(index, 1)} holds the value {low if low < 0 else high}, which is no class of the "
                    f"{self.num_classes} (num_classes=) and not the ignore index {self.ignore_index}."
                )
            values = values.astype(np.uint8)
        return values

    def fingerprint(self) -> str:
        """The file, its size and modification time, and the datasets read."""
        st = os.stat(self.path)
        return f"{os.path.abspath(self.path)}|{st.st_size}|{st.st_mtime_ns}|{self.keys}"

    def masks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every sample's mask as the data's classes, read in slices of 64 rows."""
        masks = self._open()[self.keys[1]]
        for start in range(0, len(self), 64):
            block = masks[start : min(start + 64, len(self))]
            for k, value in enumerate(block):
                values = self._values(value, start + k)
                yield start + k, map_mask(values, self.table, self.name(start + k, 1), self.num_classes,
                                          self.ignore_index)  # fmt: skip

    def __getitems__(self, keys: Sequence[Any]) -> Any:
        """A batch, read in sorted row order (images and masks), rendered in the order asked."""
        full = [sample_key(k, len(self)) for k in keys]
        f = self._open()
        images, masks = f[self.keys[0]], f[self.keys[1]]
        rows = sorted({k[1] for k in full})
        read = {r: (images[r], masks[r]) for r in rows}  # h5py reads fastest in increasing order
        samples = []
        for key, draws in zip(full, self.draws_of(full)):
            image, mask = read[key[1]]
            names = (self.name(key[1]), self.name(key[1], 1))
            samples.append(self.render(key, self._image(image), self._mask(mask, key[1]), names, draws))
        return self.batch(samples, full)
