"""The DataModules' transfer hooks and settings: how a batch reaches the training device and what happens there."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from typing_extensions import override

from lightning_fastdata.augment.normalize import Normalizer
from lightning_fastdata.augment.pipeline import DeviceAugment
from lightning_fastdata.loading.batch import DeviceBatch
from lightning_fastdata.loading.workers import resolve_num_workers

__all__ = ["DeviceTransferHooks"]


class DeviceTransferHooks(LightningDataModule):
    """Lightning's transfer hooks of :class:`~lightning_fastdata.FastDataModule`.

    uint8 batches cross to the device (a :class:`~lightning_fastdata.loading.batch.DeviceBatch`'s keys stay on the
    host), are augmented there when the DataModule has device or batch transforms, and become normalised float in
    the output memory format.
    """

    # set by the DataModule: device_transforms, normalisation and batch_transforms; uint8 to normalised float on
    # whatever device the batch is on; the output memory format (channels-last by default, else contiguous NCHW)
    device_augment: DeviceAugment
    normalizer: Normalizer
    channels_last: bool
    # the DataModule's own transfer settings, and what a callback offered (configure_transfer)
    pin_memory: bool | None
    num_workers: int | Literal["auto"]
    _prefetch: bool
    _prefetch_to: torch.device | str | None
    _offered_pin_memory: bool | None
    _offered_workers: int | Literal["auto"] | None
    _resolved_workers: int | None

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``; a ``DeviceBatch`` keeps its keys on the host.

        A ``DeviceBatch`` moves by ``DeviceBatch.to`` (the prefetcher's move too); any other batch as Lightning's.
        """
        if isinstance(batch, DeviceBatch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def augment_on_device(self, images: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor) -> tuple[Any, Any]:
        """``device_transforms``, normalisation and ``batch_transforms`` of one training batch (uint8 in)."""
        num_classes = getattr(self, "num_classes", None)
        images, targets = self.device_augment(images, labels, keys, self.normalizer, num_classes)
        return self.format_images(images), targets

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Convert the uint8 images of ``(images, labels, ...)`` to normalised float on the device.

        A training batch that carries its keys (a ``DeviceBatch``: ``device_transforms``/``batch_transforms``
        given) is augmented here first and returned as ``(images, targets)``; the augmentation draws its
        parameters from the keys, which :meth:`transfer_batch_to_device` left on the host.
        """
        if isinstance(batch, DeviceBatch) and batch.keys is not None and batch.images.dtype == torch.uint8:
            return self.augment_on_device(batch.images, batch.labels, batch.keys)
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            if batch[0].dtype == torch.uint8:
                return (self.format_images(self.normalizer(batch[0])), *batch[1:])
        return batch

    def format_images(self, images: torch.Tensor) -> torch.Tensor:
        """Apply the output memory format (``channels_last``, the default, or contiguous NCHW)."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return images.contiguous(memory_format=fmt)

    def configure_transfer(
        self,
        prefetch: bool | None = None,
        pin_memory: bool | None = None,
        num_workers: int | Literal["auto"] | None = None,
        channels_last: bool | None = None,
        prefetch_device: torch.device | str | None = None,
    ) -> dict[str, str]:
        """Take the transfer settings a callback offers (``FastDataCallback`` calls this in its ``setup``).

        Call before the loaders are built. ``None`` means no opinion. ``pin_memory`` and ``num_workers`` are used
        only where this DataModule's own value was left at its default (``None`` / ``"auto"``): a value given to
        the DataModule always wins, and the returned mapping says, per setting, whose value is used.

        Args:
            prefetch: Copy the next batch to the device one step ahead (the Trainer's device, or ``prefetch_device``).
            pin_memory: Pinned host batches (where this module's ``pin_memory`` is ``None``).
            num_workers: Worker processes (where this module's ``num_workers`` is ``"auto"``).
            channels_last: Output images in channels-last memory format after transfer.
            prefetch_device: Prefetch to this device instead of the Trainer's (e.g. without a Trainer).

        Returns:
            ``{"pin_memory": "DataModule" | "callback" | "default", "num_workers": ..., ...}``.
        """
        if num_workers is not None:
            resolve_num_workers(num_workers)  # validates
        source: dict[str, str] = {}
        if prefetch is not None:
            self._prefetch, source["prefetch"] = prefetch, "callback"
        if prefetch_device is not None:
            self._prefetch_to = prefetch_device
        if channels_last is not None:
            self.channels_last, source["channels_last"] = channels_last, "callback"
        self._offered_pin_memory = pin_memory
        source["pin_memory"] = (
            "DataModule" if self.pin_memory is not None else "callback" if pin_memory is not None else "default"
        )
        self._offered_workers = num_workers
        self._resolved_workers = None
        source["num_workers"] = (
            "DataModule" if self.num_workers != "auto" else "callback" if num_workers is not None else "default"
        )
        return source
