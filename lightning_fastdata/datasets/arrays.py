"""Batched reads from ``N x H x W x 3`` image arrays (memory maps of the HDF5 raw mode and the tensor cache)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch

from lightning_fastdata.errors import DataError

__all__ = ["MappedFile", "gather_hwc"]


class MappedFile:
    """A file this process memory-maps, with a check that it was not changed under the map.

    Reading a memory map of a file that another process truncates or rewrites in place kills the reader with
    SIGBUS (no Python error, no file name) or returns silently mixed data. The file's size and mtime are
    recorded when the dataset is built (:meth:`signature`); :meth:`open` maps it only if it is still that file,
    and :meth:`check` (one ``fstat``, call it before each batch) raises an ``OSError`` naming the file if the
    mapped file changed since. A file *replaced* by a rename (how this package rewrites files) is not an
    error: the map keeps reading the old, complete file until the dataset is rebuilt.

    Args:
        path: The file.
        signature: ``(size, mtime_ns)`` recorded when the layout was read.
        what: How to name the file in messages (e.g. ``"HDF5 file"``).
    """

    def __init__(self, path: str, signature: tuple[int, int], what: str = "file") -> None:
        self.path = path
        self.expected = signature
        self.what = what
        self.fd = os.open(path, os.O_RDONLY)
        self.check()

    @staticmethod
    def signature(path: str) -> tuple[int, int]:
        """``(size, mtime_ns)`` of ``path`` now."""
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns

    def check(self) -> None:
        """Raise ``OSError`` if the mapped file was truncated or rewritten since its signature was taken."""
        st = os.fstat(self.fd)
        if (st.st_size, st.st_mtime_ns) != self.expected:
            raise DataError(
                f"{self.what} {self.path!r} changed on disk while it is being read (size {self.expected[0]} -> "
                f"{st.st_size} bytes, or rewritten in place). Reading on would crash the process (SIGBUS) or mix old "
                "and new data. Do not modify it during training: write a new file and rename it over the old one, "
                "then restart the run."
            )

    def __del__(self) -> None:
        fd = getattr(self, "fd", -1)
        if fd >= 0:
            os.close(fd)
            self.fd = -1


def gather_hwc(read: Callable[[np.ndarray], np.ndarray], rows: np.ndarray) -> list[torch.Tensor]:
    """Read ``rows`` of an ``N x H x W x 3`` array in one sorted gather; return ``3 x H x W`` views in ``rows`` order.

    ``read`` takes sorted unique row numbers and returns those rows (``memmap.__getitem__``, or a chunk-aware
    HDF5 reader). Sorting makes the reads of a memory map sequential within the batch (page-cache and
    readahead friendly, and it still works when the array is larger than RAM); duplicates are read once.
    """
    uniq, inverse = np.unique(rows, return_inverse=True)
    block = torch.from_numpy(np.ascontiguousarray(read(uniq)))
    chw = block.permute(0, 3, 1, 2)  # channels-last views: what the resize kernel reads fastest
    return [chw[i] for i in inverse]
