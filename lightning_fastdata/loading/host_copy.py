"""A small tensor moved to the device keeps its host values: a batch's keys, read on the host without waiting.

The prefetcher (``loading/transport/prefetch.py``) moves whole batches before the DataModule's hooks see them; the
device augmentation (``loading/augment/batch.py``) draws its parameters from the batch's keys on the host. Reading
the keys back from the device would wait for all the work queued there (the previous training step).
"""

from __future__ import annotations

import torch

__all__ = ["host_original", "to_device_keeping_host"]

#: int64 tensors up to this many elements keep their host copy when moved (a batch's sample keys: 3 per sample).
_KEEP_HOST_ELEMENTS = 3 << 16
_HOST_ATTR = "_fastdata_host"


def to_device_keeping_host(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t.to(device, non_blocking=True)``; a small int64 tensor (a batch's keys) keeps a copy of its host values.

    :func:`host_original` reads it: the device augmentation draws its parameters from the keys on the host, and
    reading them back from the device would wait for the work queued before (the previous training step). The
    copy is taken now (the loader may reuse the host buffer for a later batch) and lives as long as the moved
    tensor.
    """
    moved = t.to(device, non_blocking=True)
    if moved is not t and t.device.type == "cpu" and t.dtype == torch.int64 and t.numel() <= _KEEP_HOST_ELEMENTS:
        setattr(moved, _HOST_ATTR, t.clone())
    return moved


def host_original(t: torch.Tensor) -> torch.Tensor | None:
    """The host values of ``t`` kept by :func:`to_device_keeping_host`, or ``None``."""
    return getattr(t, _HOST_ATTR, None)
