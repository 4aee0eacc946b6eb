"""``PairedHDF5Dataset``: images and their targets from one HDF5 file (a group per split, or the file's top level).

The layout of medical and scientific imaging files: an ``images`` dataset (decoded uint8 ``N x H x W x 3``, ``N x 3 x H
x W`` or grey ``N x H x W``; or encoded files, one variable-length byte string each) and the target's dataset of the
same ``N`` beside it (segmentation: ``masks``, ``N x H x W`` integers, checked by the target kind). A split is the group
of its name (``train/images``, ``val/masks``, ...) or, for a file without groups, the file's top level. The file is
opened lazily in each process that reads it (and again after a fork), never in ``__init__`` beyond a check, so any
number of workers and ranks read it. Each sample goes through the same window as the folder source's
(:class:`~lightning_fastdata.sources.windowed.WindowedDataset`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lightning_fastdata.datasets.hdf5_file import open_hdf5
from lightning_fastdata.errors import InvalidValueError, PathNotFoundError
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["HDF5_SUFFIXES", "PairedHDF5Dataset", "hdf5_split_group", "pixel_kind"]

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


class PairedHDF5Dataset(WindowedDataset):
    """A split of an HDF5 file's images and targets as whole batches (module docstring).

    Args:
        path: The HDF5 file.
        group: The split's group (``""``: the file's top level); see :func:`hdf5_split_group`.
        target: What rides with each image (:class:`~lightning_fastdata.sources.target.TargetKind`), checked against
            the stored dataset and bound to its attributes.
        images_key: The images dataset in the group.
        targets_key: The targets' dataset beside it (segmentation: ``masks``).
        locking: h5py's file locking (``False`` on NFS and other network file systems).
        **kwargs: The window settings of :class:`~lightning_fastdata.sources.windowed.WindowedDataset`
            (``train``, ``base_size``, ``crop_size``, ``hflip_prob``, ``seed``).

    Raises:
        FileNotFoundError: If the file, group or a dataset is missing (named).
        ValueError: If the images and targets differ in count, or the target refuses its dataset (named).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        group: str,
        target: TargetKind,
        images_key: str = "images",
        targets_key: str = "masks",
        locking: bool | None = None,
        **kwargs: Any,
    ) -> None:
        self.path, self.group, self.locking = os.fspath(path), group, locking
        self.keys = tuple(f"{group}/{k}" if group else k for k in (images_key, targets_key))
        if not os.path.isfile(self.path):
            raise PathNotFoundError(f"HDF5 file {self.path!r} does not exist.")
        with open_hdf5(self.path, locking) as f:
            for key in self.keys:
                if key not in f:
                    raise PathNotFoundError(
                        f"{self.path} has no dataset {key!r}: give images_key= and {target.what}s_key=."
                    )
            images, stored = f[self.keys[0]], f[self.keys[1]]
            self.kind = pixel_kind(images, f"{self.path}:{self.keys[0]}")
            size = None if self.kind == "encoded" else images.shape[2:4] if self.kind == "chw" else images.shape[1:3]
            target.check_arrays(stored.dtype, tuple(stored.shape), size, self.path, (self.keys[0], self.keys[1]))
            if len(images) != len(stored):
                raise InvalidValueError(
                    f"{self.path} holds {len(images)} images ({self.keys[0]}) and {len(stored)} {target.what}s "
                    f"({self.keys[1]})."
                )
            self.count = len(images)
            attrs = dict(stored.attrs)
        super().__init__(target.bound("", attrs, f"{self.path}:{self.keys[1]}"), **kwargs)
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
        """Sample ``index``'s image (``what=0``) or target (``1``), as messages name it."""
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

    def fingerprint(self) -> str:
        """The file, its size and modification time, and the datasets read."""
        st = os.stat(self.path)
        return f"{os.path.abspath(self.path)}|{st.st_size}|{st.st_mtime_ns}|{self.keys}"

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each sample's image and stored target, the rows read in increasing order (h5py's fastest)."""
        f = self._open()
        images, stored = f[self.keys[0]], f[self.keys[1]]
        read = {r: (images[r], stored[r]) for r in sorted(set(indices))}
        return [(self._image(read[i][0]), read[i][1]) for i in indices]

    def read_payloads(self, indices: Sequence[int]) -> list[Any]:
        """The stored targets alone (consecutive ``indices``: one slice)."""
        stored = self._open()[self.keys[1]]
        if len(indices) and list(indices) == list(range(indices[0], indices[0] + len(indices))):
            return list(stored[indices[0] : indices[0] + len(indices)])
        return [stored[i] for i in indices]
