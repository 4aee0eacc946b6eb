"""Copy the next batch to the device on a side CUDA stream while the current one trains.

Framework-free: :class:`DevicePrefetcher` moves batches; :class:`PrefetchIterator` keeps one batch in flight
and the loader state before and after the current batch. The loaders of
:mod:`lightning_fastdata.loading.transport.loaders` iterate through it. On CPU the same code path runs with no
stream (the batch stays where it is), so its order and state logic are tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_fastdata.loading.batch import move_to_device
from lightning_fastdata.loading.transport.worker_start import StartWatch, raise_cause

__all__ = ["DevicePrefetcher", "PrefetchIterator"]

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
        move: ``move(batch, device)`` returns the batch on the device (the DataModules' own move by default:
            :func:`~lightning_fastdata.loading.batch.move_to_device`, which leaves a batch's keys on the host).
    """

    def __init__(self, device: torch.device | str, move: Callable[[Any, torch.device], Any] = move_to_device) -> None:
        self.device = torch.device(device)
        self.move = move
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def start(self, batch: Any) -> Any:
        """Begin moving ``batch``; returns the (possibly not yet ready) moved batch."""
        if self.stream is None:
            return batch
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            return self.move(batch, self.device)

    def ready(self, batch: Any) -> Any:
        """Make the current stream wait for ``batch``'s copy; return it, safe to use on the current stream."""
        if self.stream is None:
            return batch
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)

        def mark(t: torch.Tensor) -> torch.Tensor:
            if t.device.type == self.device.type:  # what the move left on the host (a batch's keys) is not the stream's
                t.record_stream(current)
            return t

        return apply_to_collection(batch, torch.Tensor, mark)


class PrefetchIterator:
    """Iterates ``inner``, one batch ahead on ``prefetcher``'s device if given; tracks the loader's state.

    Two states are kept, so that a checkpoint holds what was really trained:

    - :attr:`state_after`: everything up to the batch last returned, nothing ahead (``None``: the loader's live
      state is already that, as without look-ahead). A checkpoint taken after that batch's step holds this.
    - :attr:`state_before`: everything before the batch last returned. A checkpoint saved because that batch's
      step failed (an exception, an out-of-memory error) holds this, so the failed batch is trained after resume.

    Args:
        inner: The loader's own iterator.
        prefetcher: Moves batches to the device one step ahead; ``None`` for no look-ahead.
        state_fn: Returns the loader's live state (``None``: a loader without state).
        on_exhausted: Called once when ``inner`` is exhausted (the loader's end-of-epoch clean-up).
        watch: Watches ``inner``'s workers start: if one did not in time, its error (torch's, or the interrupt it
            sent) is raised as :class:`~lightning_fastdata.loading.transport.worker_start.WorkerStartError`.
    """

    def __init__(
        self,
        inner: Iterator[Any],
        prefetcher: DevicePrefetcher | None = None,
        state_fn: Callable[[], dict[str, Any]] | None = None,
        on_exhausted: Callable[[], None] | None = None,
        watch: StartWatch | None = None,
    ) -> None:
        self.inner = inner
        self.watch = watch
        self.on_exhausted = on_exhausted
        self.prefetcher = prefetcher
        self.state_fn = state_fn
        self.state_after: dict[str, Any] | None = self._state()
        self.state_before: dict[str, Any] | None = self.state_after
        self.returned = 0  # batches handed out so far in this epoch
        self.pending: Any = self._fetch() if prefetcher is not None else None

    def _state(self) -> dict[str, Any] | None:
        return None if self.state_fn is None else self.state_fn()

    def _next_inner(self) -> Any:
        try:
            return next(self.inner)
        except (RuntimeError, KeyboardInterrupt) as err:
            raise_cause(err, self.watch)
            raise
        except StopIteration:
            if self.on_exhausted is not None:
                self.on_exhausted()
                self.on_exhausted = None
            raise

    def _fetch(self) -> Any:
        assert self.prefetcher is not None
        try:
            return self.prefetcher.start(self._next_inner())
        except StopIteration:
            return _END

    def __iter__(self) -> PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self.prefetcher is None:
            self.state_before = self._state()
            batch = self._next_inner()
            self.state_after = None  # the live state: no look-ahead to leave out
            self.returned += 1
            return batch
        if self.pending is _END:
            raise StopIteration
        batch = self.pending
        self.state_before = self.state_after
        self.state_after = self._state()  # before the look-ahead: what a checkpoint after this step must hold
        self.pending = self._fetch()
        self.returned += 1
        return self.prefetcher.ready(batch)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]
