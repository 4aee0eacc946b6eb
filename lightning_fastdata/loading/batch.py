"""A training batch whose device half runs in the DataModule's hooks: its pixels move to the device, its keys stay.

The datasets return :class:`DeviceBatch` when the training device has work to do on the batch: the policies and
batch transforms (``device_transforms``/``batch_transforms``), which draw their parameters from the samples' keys,
and the tensor cache's crop on the device (``augment_on="device"``, with each sample's box and flip). Any other
batch is a :class:`Batch` ``(images, labels)``, or in ``trainer.predict`` a :class:`PredictBatch`
``(images, indices)``: named tuples, so ``images, labels = batch`` and ``batch[1]`` work as on a plain tuple, and
``batch.labels`` / ``batch.indices`` say which the second field is.

:meth:`DeviceBatch.to` moves its pixels, labels, boxes and flips and leaves its keys on the host, where the
augmentation draws from them without reading anything back from the device (which would wait for the previous
training step's queued work): the DataModules' ``transfer_batch_to_device`` moves a ``DeviceBatch`` so (any other
batch as Lightning does), and :func:`move_to_device`, the prefetcher's move
(:class:`~lightning_fastdata.loading.transport.prefetch.DevicePrefetcher` takes it as a callable), does too.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from lightning_utilities.core.apply_func import apply_to_collection

__all__ = ["Batch", "DeviceBatch", "EncodedBatch", "PredictBatch", "move_to_device"]

#: Device types whose host-to-device copies are made blocking (as Lightning's own move does).
_BLOCKING = ("cpu", "mps")


class Batch(NamedTuple):
    """A training or evaluation batch: uint8 ``images`` (``N x 3 x H x W``) and their ``labels``.

    The labels are class positions (``int64``), or multi-hot rows (``uint8`` ``N x C``) with several labels each.
    """

    images: torch.Tensor
    labels: torch.Tensor


class PredictBatch(NamedTuple):
    """A ``trainer.predict`` batch: uint8 ``images`` and each one's ``indices`` in the input list.

    ``datamodule.predict_path(i)`` names input ``i``.
    """

    images: torch.Tensor
    indices: torch.Tensor


class DeviceBatch(NamedTuple):
    """A training batch with the keys and crops its device half needs.

    ``images`` (uint8 ``N x 3 x H x W``), ``labels``, the samples' ``keys`` (host int64 ``N x 3``: epoch, index,
    repeat; ``None`` without device policies), and the tensor cache's device crop (``boxes`` ``N x 4``, ``flips``).
    A tuple, so it pickles, pins and collates as one; indexing by position reads the fields in this order.
    """

    images: torch.Tensor
    labels: torch.Tensor
    keys: torch.Tensor | None = None
    boxes: torch.Tensor | None = None
    flips: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> DeviceBatch:
        """The batch with everything but ``keys`` on ``device``."""
        device = torch.device(device)
        return self._replace(
            images=_move(self.images, device),
            labels=_move(self.labels, device),
            boxes=None if self.boxes is None else _move(self.boxes, device),
            flips=None if self.flips is None else _move(self.flips, device),
        )


class EncodedBatch(NamedTuple):
    """A batch whose JPEGs the training device decodes (``decode_on="device"``): bytes, crop boxes and flips.

    Row ``i``'s JPEG is ``data[offsets[i]:offsets[i + 1]]``, its crop ``boxes[i]`` (``top, left, height, width`` in
    the full image) and ``flips[i]``; a row with no bytes was decoded and cropped by its worker (a PNG, a CMYK JPEG)
    and is in ``rendered`` (uint8 ``M x 3 x S x S``) at ``rendered_rows``. ``labels`` are the labels (or in
    ``trainer.predict``, ``predicting``, each image's index in the input list), ``indices`` the samples' dataset
    indices and ``names`` their files (for one that does not decode), ``keys`` as in :class:`DeviceBatch`.

    The second field is the labels, as in every batch of this package (``batch[1]``). :meth:`to` moves the labels and
    the pixels; the bytes stay on the host (nvJPEG reads host memory, pinned when the loader pins), as do the boxes,
    flips, keys and indices (read on the host: no wait on the device).
    :func:`~lightning_fastdata.loading.jpeg.device.decode_encoded` makes the uint8 batch.
    """

    data: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    boxes: torch.Tensor
    flips: torch.Tensor
    indices: torch.Tensor
    rendered: torch.Tensor
    rendered_rows: torch.Tensor
    keys: torch.Tensor | None = None
    predicting: bool = False
    names: tuple[str, ...] = ()

    def to(self, device: torch.device | str) -> EncodedBatch:
        """The batch with its labels and pixels on ``device``, the rest on the host."""
        device = torch.device(device)
        return self._replace(labels=_move(self.labels, device), rendered=_move(self.rendered, device))


def _move(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device, non_blocking=device.type not in _BLOCKING)


def move_to_device(batch: Any, device: torch.device | str) -> Any:
    """``batch``'s tensors on ``device``, but a :class:`DeviceBatch`'s keys and an :class:`EncodedBatch`'s bytes."""
    device = torch.device(device)
    if isinstance(batch, (DeviceBatch, EncodedBatch)):
        return batch.to(device)
    return apply_to_collection(batch, torch.Tensor, _move, device)
