"""Batches are built whole inside the dataset's ``__getitems__``; collation only passes them through."""

from __future__ import annotations

from typing import Any

import torch

from lightning_fastdata.loading.transport.shm_pool import new_worker_buffer, worker_pool

__all__ = ["collate_prebatched", "empty_image_and_mask_batch", "empty_image_batch"]


def empty_image_batch(n: int, height: int, width: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Allocate an ``n x 3 x H x W`` batch (uint8 unless the source is float) laid out channels-last.

    Channels-last is what the resize kernel writes fastest and what convolutions on GPU prefer; the float
    conversion on the device keeps the layout. In a worker the storage is in shared memory from the start (a
    reused buffer when the loader chose ``batch_transport="shm_pool"``), so sending it copies nothing.
    """
    storage = new_worker_buffer(n * height * width * 3 * torch.empty((), dtype=dtype).element_size())
    if storage is None:
        return torch.empty((n, height, width, 3), dtype=dtype).permute(0, 3, 1, 2)
    return _channels_last(storage, n, height, width, dtype)


def _channels_last(
    storage: torch.UntypedStorage, n: int, height: int, width: int, dtype: torch.dtype = torch.uint8
) -> torch.Tensor:
    """An ``n x 3 x H x W`` channels-last view of ``storage`` from its start."""
    shape, strides = (n, height, width, 3), (height * width * 3, width * 3, 3, 1)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides).permute(0, 3, 1, 2)


def empty_image_and_mask_batch(n: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate a uint8 ``n x 3 x H x W`` channels-last image batch and an ``n x H x W`` mask batch in one buffer.

    As :func:`empty_image_batch`, in a worker the buffer is in shared memory (pooled where the loader pools them), and
    the masks travel with the images as a view of the same buffer: nothing is copied on the way.
    """
    pixels = n * height * width
    storage = new_worker_buffer(4 * pixels)
    if storage is None:
        storage = torch.empty(4 * pixels, dtype=torch.uint8).untyped_storage()
    masks = torch.empty(0, dtype=torch.uint8).set_(storage, 3 * pixels, (n, height, width), (height * width, width, 1))
    return _channels_last(storage, n, height, width), masks


def collate_prebatched(batch: Any) -> Any:
    """Return a batch that ``__getitems__`` already collated (a tuple of tensors) as it is.

    In a worker whose loader chose ``batch_transport="shm_pool"``, a batch whose images live in a pooled buffer
    is wrapped for sending (it unpickles into the same plain tuple in the main process).

    Raises:
        TypeError: If ``batch`` is not a tuple (the dataset has no batched ``__getitems__``).
    """
    if isinstance(batch, tuple):
        pool = worker_pool()
        packed = pool.pack(batch) if pool is not None and batch else None
        return batch if packed is None else packed
    raise TypeError(
        f"collate_prebatched expects the tuple a fastdata dataset's __getitems__ returns, got {type(batch).__name__}."
    )
