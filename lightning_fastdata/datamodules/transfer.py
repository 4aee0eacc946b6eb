"""How a DataModule's batches reach the training device and what happens there, as one object it owns.

:class:`DeviceTransfer` holds the transfer settings (the DataModule's own ``pin_memory``/``num_workers`` and what a
callback offered through ``configure_transfer``: pinned memory, workers, prefetch, the memory format) and does the
device side of a batch: uint8 batches cross to the device (a :class:`~lightning_fastdata.loading.batch.DeviceBatch`'s
keys stay on the host), are augmented there when the DataModule has device or batch transforms (eagerly, or in
static shapes, or as a replayed CUDA graph: ``device_half``), and become normalised float in the output memory
format. :class:`~lightning_fastdata.FastDataModule`'s Lightning hooks
(``transfer_batch_to_device``, ``on_after_batch_transfer``) call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_fastdata.augment.normalize import Normalizer
from lightning_fastdata.augment.pipeline import DeviceAugment
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.batch import Batch, DeviceBatch, EncodedBatch, PredictBatch
from lightning_fastdata.loading.jpeg.device import decode_encoded
from lightning_fastdata.loading.workers import resolve_num_workers

__all__ = ["DeviceHalf", "DeviceTransfer"]

#: How the device half of a recipe runs (``FastDataCallback(device_half=...)``): ``"eager"`` (torchvision's ops as
#: drawn, the default and the fallback), ``"static"`` (every parameter drawn on the host into one buffer, then one
#: fixed sequence of ops: the same pixels), ``"graphed"`` (the static half captured once as a CUDA graph and replayed
#: per batch; CUDA only, eager elsewhere).
DeviceHalf = Literal["eager", "static", "graphed"]


class DeviceTransfer:
    """The transfer settings of one DataModule and the device side of its batches.

    Args:
        normalizer: uint8 to normalised float, on whatever device the batch is on.
        device_augment: ``device_transforms``, normalisation and ``batch_transforms`` of a training batch.
        pin_memory: The DataModule's ``pin_memory`` (``None``: the callback's offer, else pinned on CUDA).
        num_workers: The DataModule's ``num_workers`` (``"auto"``: the callback's offer, else the CPUs' share).
        decode_on: Where JPEGs are decoded (``"workers"``, or ``"device"``: batches arrive as
            :class:`~lightning_fastdata.loading.batch.EncodedBatch`, decoded here).
    """

    def __init__(
        self,
        normalizer: Normalizer,
        device_augment: DeviceAugment,
        pin_memory: bool | None,
        num_workers: int | Literal["auto"],
        decode_on: Literal["workers", "device"] = "workers",
    ) -> None:
        self.decode_on = decode_on
        self.normalizer = normalizer
        self.device_augment = device_augment
        self.pin_memory = pin_memory
        self.num_workers = num_workers
        #: Output images in channels-last memory format (else contiguous NCHW).
        self.channels_last = True
        self.prefetch = False
        self.prefetch_to: torch.device | str | None = None
        self.offered_pin_memory: bool | None = None
        self.offered_workers: int | Literal["auto"] | None = None
        self._resolved_workers: int | None = None
        #: Host seconds the training batches' device side took (``on_after_batch_transfer``), over the run.
        self.train_hook_s = 0.0
        #: How the device half runs (:data:`DeviceHalf`): a callback's offer, applied at the first batch.
        self.device_half: DeviceHalf = "eager"
        self._eager = device_augment
        self._half_on: str | None = None  # the device type the device half was set up for

    # -- the device side of a batch ---------------------------------------------------------------------------
    @staticmethod
    def moved(batch: Any, device: torch.device) -> Any:
        """``batch`` on ``device`` if it is a ``DeviceBatch`` or ``EncodedBatch`` (part of it left on the host).

        ``None`` for any other batch (Lightning moves it).
        """
        return batch.to(device) if isinstance(batch, (DeviceBatch, EncodedBatch)) else None

    def augment(
        self, images: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor, num_classes: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``device_transforms``, normalisation and ``batch_transforms`` of one training batch (uint8 in)."""
        if self.device_half != "eager" and self._half_on != images.device.type:
            self._set_up_half(images.device.type)
        images, targets = self.device_augment(images, labels, keys, self.normalizer, num_classes)
        return self.format_images(images), targets

    def after_transfer(
        self, batch: Any, num_classes: int | None, on_corrupt: Callable[[int, int, OSError], None] | None = None
    ) -> Any:
        """The uint8 images of ``batch`` as normalised float; a batch that carries its keys augmented first.

        An ``EncodedBatch`` is decoded here first (``on_corrupt``: what an image the device cannot decode becomes,
        :func:`~lightning_fastdata.loading.jpeg.device.decode_encoded`'s argument).
        """
        if isinstance(batch, EncodedBatch):
            batch = self._decoded(batch, on_corrupt)
        if isinstance(batch, DeviceBatch) and batch.keys is not None and batch.images.dtype == torch.uint8:
            return self.augment(batch.images, batch.labels, batch.keys, num_classes)
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            if batch[0].dtype == torch.uint8:
                images = self.format_images(self.normalizer(batch[0]))
                return type(batch)(images, *batch[1:]) if hasattr(batch, "_fields") else (images, *batch[1:])
        return batch

    @staticmethod
    def _decoded(
        batch: EncodedBatch, on_corrupt: Callable[[int, int, OSError], None] | None
    ) -> Batch | PredictBatch | DeviceBatch:
        """An encoded batch decoded, cropped and flipped on its device: the batch the workers' decode would give."""
        images, kept = decode_encoded(batch, on_corrupt)
        labels, keys = batch.labels, batch.keys
        if not bool(kept.all()):
            labels, keys = labels[kept.to(labels.device)], None if keys is None else keys[kept]
        if batch.predicting:
            return PredictBatch(images, labels)
        return Batch(images, labels) if keys is None else DeviceBatch(images, labels, keys)

    def _set_up_half(self, device_type: str) -> None:
        """Put the device half :attr:`device_half` asks for in place, for batches on ``device_type``."""
        from lightning_fastdata.augment.graphed.captured import CapturedDeviceHalf
        from lightning_fastdata.augment.graphed.half import StaticDeviceHalf

        self._half_on, kind = device_type, self.device_half
        if kind == "graphed" and device_type != "cuda":
            rank_zero_info(f"lightning_fastdata: device_half='graphed' captures CUDA graphs; on {device_type} eager.")
            kind = "eager"
        if kind == "eager" or not self._eager:
            self.device_augment = self._eager
            return
        half = StaticDeviceHalf(self._eager)
        self.device_augment = half if kind == "static" else CapturedDeviceHalf(half)  # type: ignore[assignment]
        rank_zero_info(f"lightning_fastdata: the device half runs {kind} ({device_type}).")

    def format_images(self, images: torch.Tensor) -> torch.Tensor:
        """Apply the output memory format (``channels_last``, the default, or contiguous NCHW)."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return images.contiguous(memory_format=fmt)

    # -- settings ---------------------------------------------------------------------------------------------
    def offer(
        self,
        prefetch: bool | None = None,
        pin_memory: bool | None = None,
        num_workers: int | Literal["auto"] | None = None,
        channels_last: bool | None = None,
        prefetch_device: torch.device | str | None = None,
        device_half: DeviceHalf | None = None,
    ) -> dict[str, str]:
        """Take a callback's offer (``FastDataModule.configure_transfer``); returns whose value each setting uses.

        ``None`` means no opinion. ``pin_memory`` and ``num_workers`` are used only where the DataModule's own value
        was left at its default (``None`` / ``"auto"``): a value given to the DataModule always wins.

        Args:
            prefetch: Copy the next batch to the device one step ahead (the Trainer's device, or ``prefetch_device``).
            pin_memory: Pinned host batches (where the module's ``pin_memory`` is ``None``).
            num_workers: Worker processes (where the module's ``num_workers`` is ``"auto"``).
            channels_last: Output images in channels-last memory format after transfer.
            prefetch_device: Prefetch to this device instead of the Trainer's (e.g. without a Trainer).
            device_half: How the device half of the recipe runs (:data:`DeviceHalf`).

        Raises:
            ValueError: If ``device_half`` is unknown, or ``"static"``/``"graphed"`` for transforms without a static
                form (naming them).

        Returns:
            ``{"pin_memory": "DataModule" | "callback" | "default", "num_workers": ..., ...}``.
        """
        if num_workers is not None:
            resolve_num_workers(num_workers)  # validates
        source: dict[str, str] = {}
        if prefetch is not None:
            self.prefetch, source["prefetch"] = prefetch, "callback"
        if prefetch_device is not None:
            self.prefetch_to = prefetch_device
        if channels_last is not None:
            self.channels_last, source["channels_last"] = channels_last, "callback"
        if device_half is not None:
            self._check_half(device_half)
            self.device_half, self._half_on, source["device_half"] = device_half, None, "callback"
            self.device_augment = self._eager  # the other halves are put in place at the first batch
        self.offered_pin_memory = pin_memory
        source["pin_memory"] = (
            "DataModule" if self.pin_memory is not None else "callback" if pin_memory is not None else "default"
        )
        self.offered_workers = num_workers
        self._resolved_workers = None
        source["num_workers"] = (
            "DataModule" if self.num_workers != "auto" else "callback" if num_workers is not None else "default"
        )
        return source

    def _check_half(self, kind: str) -> None:
        from lightning_fastdata.augment.graphed.half import static_capable

        if kind not in ("eager", "static", "graphed"):
            raise InvalidValueError(f"device_half should be 'eager', 'static' or 'graphed', got {kind!r}.")
        if kind != "eager" and self._eager and not static_capable(self._eager):
            names = [type(t).__name__ for t in (*self._eager.device_transforms, *self._eager.batch_transforms)]
            raise InvalidValueError(
                f"device_half={kind!r} runs TrivialAugmentWide, RandAugment, RandomErasing, MixUp and CutMix in static "
                f"shapes; these transforms are {names}: leave device_half='eager'."
            )

    def workers(self, devices_per_node: int) -> int:
        """The loader workers per rank: the DataModule's count, else the callback's, else ``"auto"`` resolved once."""
        if self._resolved_workers is None:
            offered = self.offered_workers
            wanted = offered if self.num_workers == "auto" and offered is not None else self.num_workers
            self._resolved_workers = resolve_num_workers(wanted, devices_per_node)
            if wanted == "auto":
                rank_zero_info(f"lightning_fastdata: num_workers='auto' resolved to {self._resolved_workers}.")
        return self._resolved_workers

    def use_pin_memory(self, trainer: Any) -> bool:
        """Pinned host batches: the DataModule's choice, else the callback's, else on a CUDA Trainer."""
        if self.pin_memory is not None:
            return self.pin_memory
        if self.offered_pin_memory is not None:
            return self.offered_pin_memory
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def prefetch_device(self, trainer: Any) -> torch.device | str | None:
        """Where the next batch is copied one step ahead (``None``: no look-ahead)."""
        if not self.prefetch:
            return None
        if self.prefetch_to is not None:
            return self.prefetch_to
        return None if trainer is None else trainer.strategy.root_device
