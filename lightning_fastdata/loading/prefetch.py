"""Copy the next batch to the device on a side CUDA stream while the current one trains.

Framework-free: :class:`DevicePrefetcher` moves batches; :func:`enable_device_prefetch` turns any
``DataLoader`` (or subclass, e.g. ``StatefulDataLoader``) into one whose iterator keeps one batch in flight.
On CPU the same code path runs with no stream (the batch stays where it is), so its order and state logic
are tested without a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import DataLoader

__all__ = ["DevicePrefetcher", "enable_device_prefetch"]

_END = object()


class DevicePrefetcher:
    """Moves batches (any nesting of tensors) to ``device``, asynchronously on a side stream for CUDA.

    The stream is created once, here, not per epoch (timm #2781: a stream per ``__iter__`` grew reserved
    memory). Before each copy the side stream waits for the consumer stream, so memory the consumer freed is
    not overwritten early; after it, :meth:`ready` makes the consumer wait for the copy and marks each tensor
    as used by the consumer stream (``record_stream``), so the caching allocator does not hand the memory out
    while the step still reads it.

    Args:
        device: Target device; CPU means no copy at all.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def start(self, batch: Any) -> Any:
        """Begin moving ``batch``; returns the (possibly not yet ready) moved batch."""
        if self.stream is None:
            return batch
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            return apply_to_collection(batch, torch.Tensor, lambda t: t.to(self.device, non_blocking=True))

    def ready(self, batch: Any) -> Any:
        """Make the current stream wait for ``batch``'s copy; return it, safe to use on the current stream."""
        if self.stream is None:
            return batch
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)

        def mark(t: torch.Tensor) -> torch.Tensor:
            t.record_stream(current)
            return t

        return apply_to_collection(batch, torch.Tensor, mark)


class _PrefetchIterator:
    """Iterates a loader's own iterator one batch ahead; remembers the loader state before the look-ahead."""

    def __init__(self, loader: DataLoader, inner: Iterator[Any], prefetcher: DevicePrefetcher) -> None:
        self.loader = loader
        self.inner = inner
        self.prefetcher = prefetcher
        self.saved_state: dict[str, Any] | None = self._inner_state()
        self.pending: Any = self._fetch()

    def _inner_state(self) -> dict[str, Any] | None:
        base_state = getattr(type(self.loader)._fastdata_base, "state_dict", None)  # type: ignore[attr-defined]
        return None if base_state is None else base_state(self.loader)

    def _fetch(self) -> Any:
        try:
            return self.prefetcher.start(next(self.inner))
        except StopIteration:
            return _END

    def __iter__(self) -> _PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self.pending is _END:
            raise StopIteration
        batch = self.pending
        # What a checkpoint taken after this batch's step must hold: everything up to this batch, nothing ahead.
        self.saved_state = self._inner_state()
        self.pending = self._fetch()
        return self.prefetcher.ready(batch)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]


def _prefetching_iter(self: DataLoader) -> Iterator[Any]:
    cls = type(self)
    prefetcher = self.__dict__.get("_fastdata_prefetcher")
    if prefetcher is None or prefetcher.device != cls._fastdata_device:  # type: ignore[attr-defined]
        # One stream per loader for its whole life (not per epoch); also for copies Lightning re-instantiates.
        prefetcher = self.__dict__["_fastdata_prefetcher"] = DevicePrefetcher(cls._fastdata_device)  # type: ignore[attr-defined]
    it = _PrefetchIterator(self, cls._fastdata_base.__iter__(self), prefetcher)  # type: ignore[attr-defined]
    self.__dict__["_fastdata_iter"] = weakref.ref(it)
    return it


def _prefetching_state_dict(self: DataLoader) -> dict[str, Any]:
    """The loader state without the look-ahead batch (so a resume does not skip it)."""
    ref = self.__dict__.get("_fastdata_iter")
    it = ref() if ref is not None else None
    if it is not None and it.saved_state is not None:
        return it.saved_state
    return type(self)._fastdata_base.state_dict(self)  # type: ignore[attr-defined]


def enable_device_prefetch(loader: DataLoader, device: torch.device | str) -> DataLoader:
    """Make ``loader`` prefetch to ``device``, in place; returns it (still an instance of its own class).

    The loader's class is swapped for a plain subclass of it that adds the prefetching ``__iter__`` (and a
    ``state_dict`` without the look-ahead batch, if the loader has one), so Lightning still sees a
    ``DataLoader``/``StatefulDataLoader`` and everything else about it is unchanged. Calling it again only
    updates the device. The look-ahead batch is the only extra memory: one batch on the device.
    """
    cls = type(loader)
    if not hasattr(cls, "_fastdata_base"):
        # A plain subclass (a mixin base would change the instance layout and forbid the __class__ swap).
        namespace: dict[str, Any] = {"_fastdata_base": cls, "__iter__": _prefetching_iter}
        if hasattr(cls, "state_dict"):
            namespace["state_dict"] = _prefetching_state_dict
        loader.__class__ = type(f"Prefetching{cls.__name__}", (cls,), namespace)
    # On the class, so that a copy Lightning re-instantiates (e.g. to inject a DistributedSampler) prefetches too.
    type(loader)._fastdata_device = torch.device(device)  # type: ignore[attr-defined]
    return loader
