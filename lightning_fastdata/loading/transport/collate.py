"""Batches are built whole inside the dataset's ``__getitems__``; collation only passes them through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lightning_fastdata.loading.batch import EncodedBatch
from lightning_fastdata.loading.transport.shm_pool import new_worker_buffer, worker_pool

__all__ = ["EncodedRows", "collate_prebatched", "empty_image_and_mask_batch", "empty_image_batch"]


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


@dataclass
class EncodedRows:
    """A batch's rows as a worker plans them for the device decode, before :meth:`pack` (``decode_on="device"``).

    Per row: the JPEG's bytes with its crop box and flip, or (``None`` bytes) its pixels decoded here in
    :attr:`rendered`; and every row's label, dataset index, name and key. A mix joins its sources' rows (:meth:`join`)
    and packs once.
    """

    size: int
    data: list[bytes | None] = field(default_factory=list)
    boxes: list[tuple[int, int, int, int]] = field(default_factory=list)
    flips: list[bool] = field(default_factory=list)
    rendered: dict[int, torch.Tensor] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    labels: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    indices: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    full_keys: list[tuple[int, int, int]] = field(default_factory=list)

    def add(self, data: bytes | None, box: tuple[int, int, int, int], flip: bool, name: str) -> None:
        """The next row: a JPEG to decode on the device (``data``), or ``None`` (its pixels in :attr:`rendered`)."""
        self.data.append(data)
        self.boxes.append(box)
        self.flips.append(flip)
        self.names.append(name)

    @property
    def kept(self) -> np.ndarray:
        """Which of the planned samples have a row (a corrupt image skipped in the worker has none)."""
        return np.array([d is not None or i in self.rendered for i, d in enumerate(self.data)], dtype=bool)

    @staticmethod
    def join(parts: list[EncodedRows]) -> EncodedRows:
        """One batch of ``parts``' rows, in order (a mix's sources)."""
        out = EncodedRows(parts[0].size)
        for part in parts:
            base = len(out.data)
            out.data += part.data
            out.boxes += part.boxes
            out.flips += part.flips
            out.names += part.names
            out.rendered.update({base + i: t for i, t in part.rendered.items()})
            out.full_keys += part.full_keys
        out.labels = torch.cat([p.labels for p in parts])
        out.indices = np.concatenate([p.indices for p in parts])
        return out

    def pack(self, return_keys: bool, predicting: bool) -> EncodedBatch:
        """The kept rows as one :class:`~lightning_fastdata.loading.batch.EncodedBatch`, bytes and pixels in one buffer.

        In a worker the buffer is shared memory (pooled where the loader pools), so the batch crosses to the main
        process without a copy; ``return_keys``: it carries the keys (device policies); ``predicting``: the labels are
        the images' indices.
        """
        keep = np.flatnonzero(self.kept)
        data = [self.data[i] for i in keep]
        lengths = [0 if d is None else len(d) for d in data]
        offsets = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rendered_rows = [r for r, i in enumerate(keep) if data[r] is None]
        start = -(-int(offsets[-1]) // 64) * 64  # the pixels after the bytes, aligned
        pixels = len(rendered_rows) * 3 * self.size * self.size
        storage = new_worker_buffer(max(start + pixels, 64))
        if storage is None:
            storage = torch.empty(max(start + pixels, 64), dtype=torch.uint8).untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (int(offsets[-1]),), (1,))
        view = flat.numpy()
        for r, d in enumerate(data):
            if d is not None:
                view[offsets[r] : offsets[r + 1]] = np.frombuffer(d, dtype=np.uint8)
        s = self.size
        rendered = (
            torch.empty(0, dtype=torch.uint8)
            .set_(storage, start, (len(rendered_rows), s, s, 3), (3 * s * s, 3 * s, 3, 1))
            .permute(0, 3, 1, 2)
        )
        for slot, r in enumerate(rendered_rows):
            rendered[slot] = self.rendered[int(keep[r])]
        keys = torch.tensor([self.full_keys[i] for i in keep], dtype=torch.int64).view(-1, 3)
        return EncodedBatch(
            data=flat,
            offsets=torch.from_numpy(offsets),
            boxes=torch.tensor([self.boxes[i] for i in keep], dtype=torch.int64).view(-1, 4),
            flips=torch.tensor([self.flips[i] for i in keep], dtype=torch.bool),
            labels=self.labels[torch.from_numpy(keep)],
            indices=torch.from_numpy(self.indices[keep]),
            rendered=rendered,
            rendered_rows=torch.tensor(rendered_rows, dtype=torch.int64),
            keys=keys if return_keys else None,
            predicting=predicting,
            names=tuple(self.names[i] for i in keep),
        )


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
