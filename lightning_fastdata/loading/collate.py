"""Batches are built whole inside the dataset's ``__getitems__``; collation only passes them through."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import get_worker_info

__all__ = ["collate_prebatched", "empty_image_batch"]


def empty_image_batch(n: int, height: int, width: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Allocate an ``n x 3 x H x W`` batch (uint8 unless the source is float) laid out channels-last.

    Channels-last is what the resize kernel writes fastest and what convolutions on GPU prefer; the float
    conversion on the device keeps the layout. In a worker the storage is put in shared memory up front, as
    ``default_collate`` does, so sending it to the main process copies nothing.
    """
    nhwc = torch.empty((n, height, width, 3), dtype=dtype)
    if get_worker_info() is not None:
        nhwc.share_memory_()
    return nhwc.permute(0, 3, 1, 2)


def collate_prebatched(batch: Any) -> Any:
    """Return a batch that ``__getitems__`` already collated (a tuple of tensors) unchanged."""
    if isinstance(batch, tuple):
        return batch
    raise TypeError(
        f"collate_prebatched expects the tuple a fastdata dataset's __getitems__ returns, got {type(batch).__name__}."
    )
