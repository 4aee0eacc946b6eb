"""Batched reads from ``N x H x W x 3`` image arrays (memory maps of the HDF5 raw mode and the tensor cache)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["gather_hwc"]


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
