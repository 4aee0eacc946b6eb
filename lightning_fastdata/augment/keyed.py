"""Random numbers that are a function of ``(seed, epoch, index, repeat)``, never of a generator's history.

A sample's augmentation must not depend on which worker made it, on the prefetch depth, on the device, or on where
a run was resumed: everything random about a sample is drawn from its key. Two forms, one hash:

* :func:`sample_seed`: a 63-bit seed for a sample (Python ints), to seed torch's generator around a user's
  transform in a worker (:class:`~lightning_fastdata.augment.sample.SampleTransform`);
* :func:`uniforms`: ``N x count`` floats in ``[0, 1)`` for a whole batch of keys at once, on the keys' device, for
  the batched device ops (no generator, no synchronisation, the same numbers on a CPU and a GPU).

The hash is Chris Wellons' ``lowbias32`` (xor-shift-multiply), with the 32-bit products split into 16-bit halves so
that no int64 product overflows (torch has no unsigned 64-bit arithmetic on every device). Keys on the CPU (where the
device ops draw their parameters) are hashed with numpy's uint64 arithmetic instead: the same numbers, in ~20 array
operations instead of ~200 torch ops (each a few microseconds of dispatch: most of a GPU batch's augmentation time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["batch_seed", "sample_seed", "uniforms"]

_MASK = 0xFFFFFFFF


def _mul32(x: torch.Tensor | int, c: int) -> torch.Tensor | int:
    """``x * c mod 2**32`` for ``0 <= x < 2**32`` without overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK


def _hash32(x: torch.Tensor | int) -> torch.Tensor | int:
    x = x & _MASK
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _hash32_int(x: Any) -> Any:
    """:func:`_hash32` for a Python int or a uint64 numpy array: its products of two 32-bit numbers need no splitting.

    (A per-sample seed in half the time; a batch of CPU keys in ~20 array operations.) ``x`` itself is not changed.
    """
    x = x & _MASK
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK
    return x ^ (x >> 16)


def _chain(values: Sequence[Any], hash32: Callable[[Any], Any] = _hash32) -> Any:
    """The hash of ``values`` (tensors, ints or uint64 arrays; ``hash32``: :func:`_hash32` or :func:`_hash32_int`)."""
    h = 0x9E3779B9
    for v in values:
        # fold 64-bit inputs (an epoch, a large seed) in two halves
        h = hash32(h ^ hash32(v & _MASK))
        h = hash32(h ^ ((v >> 32) & _MASK))
    return h


def sample_seed(seed: int, key: Sequence[int], stream: int = 0) -> int:
    """A 63-bit seed for one sample: a function of ``seed``, its key (``(epoch, index[, repeat])``) and ``stream``."""
    parts = [int(seed), *(int(k) for k in key), int(stream)]
    lo = _chain(parts, _hash32_int)
    hi = _chain([*parts, 1], _hash32_int)
    return ((hi & 0x7FFFFFFF) << 32) | lo


def batch_seed(seed: int, keys: torch.Tensor, stream: int = 0) -> int:
    """A seed for a whole batch (MixUp/CutMix draw one ``lambda`` per batch): its first and last keys and length."""
    first, last = keys[0].tolist(), keys[-1].tolist()
    return sample_seed(seed, [*first, *last, len(keys)], stream)


def uniforms(seed: int, keys: torch.Tensor, stream: int, count: int = 1) -> torch.Tensor:
    """``len(keys) x count`` float64 numbers in ``[0, 1)``, each a function of ``(seed, key, stream, column)``.

    Args:
        seed: The DataModule's seed.
        keys: int64 ``N x K`` sample keys (``(epoch, index, repeat)``), on any device.
        stream: Which draw this is (each op uses its own, so adding an op changes no other op's numbers).
        count: Numbers per sample.
    """
    if keys.device.type == "cpu":
        return _uniforms_np(seed, keys, stream, count)
    return _uniforms_torch(seed, keys, stream, count)


def _uniforms_torch(seed: int, keys: torch.Tensor, stream: int, count: int) -> torch.Tensor:
    """:func:`uniforms` with torch's ops, on the keys' device."""
    keys = keys.to(torch.int64)
    base = _chain([int(seed), *(keys[:, k : k + 1] for k in range(keys.shape[1])), int(stream)])
    columns = torch.arange(count, device=keys.device, dtype=torch.int64).view(1, count)
    bits = _hash32(base ^ _hash32(columns + 0x632BE5AB))
    return bits.to(torch.float64) / 4294967296.0  # type: ignore[union-attr]


def _uniforms_np(seed: int, keys: torch.Tensor, stream: int, count: int) -> torch.Tensor:
    """:func:`uniforms` of CPU keys, with numpy: the same numbers (int64 keys read as their 64-bit patterns)."""
    k = keys.to(torch.int64).numpy().astype(np.uint64)  # two's complement: the low 32 bits and the next 32 kept
    base = _chain([int(seed), *(k[:, j : j + 1] for j in range(k.shape[1])), int(stream)], _hash32_int)
    columns = np.arange(count, dtype=np.uint64).reshape(1, count)
    bits = _hash32_int(base ^ _hash32_int(columns + 0x632BE5AB))
    return torch.from_numpy(bits.astype(np.float64) / 4294967296.0)
