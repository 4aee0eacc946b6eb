"""Loaders that prefetch to a device: a ``DataLoader`` and a ``StatefulDataLoader`` that own their prefetcher.

The path of one batch: the loader's own iterator (workers, shared-memory batch) -> :class:`PrefetchIterator`
(started on the device one step ahead, on a side CUDA stream) -> the training step. Each loader creates its
:class:`DevicePrefetcher` (one CUDA stream) once, in ``__init__``; ``prefetch_device=None`` means no look-ahead.
``prefetch_device`` is a constructor argument, so a copy Lightning re-instantiates (to inject a
``DistributedSampler``) prefetches too.

:func:`with_prefetch` rebuilds a plain ``DataLoader``/``StatefulDataLoader`` that someone else made (a foreign
DataModule's) as its prefetching twin over the same dataset, sampler and settings.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.loading.prefetch import DevicePrefetcher, PrefetchIterator

__all__ = ["PrefetchingDataLoader", "PrefetchingStatefulDataLoader", "with_prefetch"]


def _prefetcher(device: torch.device | str | None) -> DevicePrefetcher | None:
    return None if device is None else DevicePrefetcher(device)


class PrefetchingDataLoader(DataLoader):
    """A ``DataLoader`` whose iterator keeps the next batch in flight to ``prefetch_device``.

    Args:
        dataset: As ``DataLoader``'s.
        prefetch_device: Copy the next batch to this device while the current one is used; ``None``: no look-ahead.
        **kwargs: ``DataLoader``'s other arguments.
    """

    def __init__(self, dataset: Dataset, prefetch_device: torch.device | str | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.prefetch_device = prefetch_device
        self._prefetcher = _prefetcher(prefetch_device)

    def __iter__(self) -> Any:
        inner = super().__iter__()
        return inner if self._prefetcher is None else PrefetchIterator(inner, self._prefetcher)


class PrefetchingStatefulDataLoader(StatefulDataLoader):
    """A torchdata ``StatefulDataLoader`` that prefetches, and whose state is what was really handed out.

    :meth:`state_dict` is the state after the batch last returned (the look-ahead batch left out, so a resume
    replays it); :meth:`state_before_current_batch` the state before it (a resume from it trains that batch
    again: what a checkpoint saved because the step failed needs).

    Args:
        dataset: As ``StatefulDataLoader``'s.
        prefetch_device: Copy the next batch to this device while the current one trains; ``None``: no look-ahead.
        **kwargs: ``StatefulDataLoader``'s other arguments.
    """

    def __init__(self, dataset: Dataset, prefetch_device: torch.device | str | None = None, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            # torchdata's constructor calls torch.set_vital, which torch >= 2.10 deprecates: a warning about
            # torchdata's own call at every loader we build, that no user can act on.
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            super().__init__(dataset, **kwargs)
        self.prefetch_device = prefetch_device
        self._prefetcher = _prefetcher(prefetch_device)
        self._current: weakref.ref[PrefetchIterator] | None = None

    @property
    def exact_state(self) -> bool:
        """Whether torchdata keeps an exact state (not with workers and ``in_order=False``)."""
        return self.in_order or self.num_workers == 0

    def __iter__(self) -> PrefetchIterator:  # type: ignore[override]
        state_fn = super().state_dict if self.exact_state else None  # out of order: no state worth tracking
        it = PrefetchIterator(super().__iter__(), self._prefetcher, state_fn)
        self._current = weakref.ref(it)
        return it

    def _iterator_now(self) -> PrefetchIterator | None:
        return None if self._current is None else self._current()

    def state_dict(self) -> dict[str, Any]:
        """The state after the batch last returned (a look-ahead batch is left out, so a resume replays it)."""
        it = self._iterator_now()
        if it is not None and it.state_after is not None:
            return it.state_after
        return super().state_dict()

    def state_before_current_batch(self) -> dict[str, Any]:
        """The state before the batch last returned: resuming from it trains that batch again."""
        it = self._iterator_now()
        if it is not None and it.state_before is not None:
            return it.state_before
        return self.state_dict()

    def batches_done(self, before_current_batch: bool = False) -> int | None:
        """Batches of the current epoch already handed out (``None``: no epoch in progress)."""
        it = self._iterator_now()
        if it is None:
            return None
        return it.returned - (1 if before_current_batch and it.returned else 0)


_TWINS: dict[type, type] = {DataLoader: PrefetchingDataLoader, StatefulDataLoader: PrefetchingStatefulDataLoader}


def with_prefetch(
    loader: DataLoader, device: torch.device | str | None, pin_memory: bool | None = None
) -> DataLoader | None:
    """The prefetching twin of a plain ``DataLoader``/``StatefulDataLoader``, built from its public attributes.

    Same dataset, sampler (or batch sampler), workers and settings; ``pin_memory`` overrides the loader's if
    given. Returns ``None`` for any other loader class: its constructor is unknown, so it cannot be rebuilt.
    """
    twin = _TWINS.get(type(loader))
    if twin is None:
        return None
    kwargs: dict[str, Any] = dict(
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory if pin_memory is None else pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True),
    )
    if isinstance(loader, StatefulDataLoader):
        kwargs["snapshot_every_n_steps"] = loader.snapshot_every_n_steps
    if loader.batch_size is None:  # a batch sampler of the user's (or no batching at all)
        kwargs["batch_sampler"] = loader.batch_sampler
        if loader.batch_sampler is None:
            kwargs["batch_size"] = None
    else:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
        if not isinstance(loader.dataset, IterableDataset):
            kwargs["sampler"] = loader.sampler
    return twin(loader.dataset, prefetch_device=device, **kwargs)
