"""Loaders that prefetch to a device: a ``DataLoader`` and a ``StatefulDataLoader`` that own their prefetcher.

The path of one batch: a worker builds it (``__getitems__``) in shared memory -> it crosses to the main process by
the loader's ``batch_transport`` -> the loader's own iterator ->
:class:`~lightning_fastdata.loading.transport.prefetch.PrefetchIterator` (started on the device one step ahead,
on a side CUDA stream) -> the training step. Each loader creates its :class:`~lightning_fastdata.DevicePrefetcher`
(one CUDA stream) once, in ``__init__``; ``prefetch_device=None`` means no look-ahead. Both choices are
constructor arguments, so a copy Lightning re-instantiates (to inject a ``DistributedSampler``) keeps them.

``batch_transport``: ``"torch"`` (the default of these classes, as a plain ``DataLoader``) sends each batch as a
new shared-memory segment; ``"shm_pool"`` (what the package's DataModules choose) reuses a few buffers per worker
(:mod:`~lightning_fastdata.loading.transport.shm_pool`), for datasets that build their batches with
:func:`~lightning_fastdata.loading.transport.collate.empty_image_batch`. Other datasets' batches travel torch's
way either way.

:func:`with_prefetch` rebuilds a plain ``DataLoader``/``StatefulDataLoader`` that someone else made (a foreign
DataModule's) as its prefetching twin over the same dataset, sampler and settings.
"""

from __future__ import annotations

import atexit
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.loading.transport import shm_pool
from lightning_fastdata.loading.transport.prefetch import DevicePrefetcher, PrefetchIterator
from lightning_fastdata.loading.transport.shm_pool import BatchTransport, PoolWorkerInit
from lightning_fastdata.loading.transport.torch_internals import (
    has_workers_to_shut_down,
    keeps_started_workers,
    shut_down_workers,
    worker_pids,
)
from lightning_fastdata.loading.transport.torchdata_internals import batches_yielded, sampler_state
from lightning_fastdata.loading.transport.worker_start import StartedWorkerInit, StartWatch, raise_cause

__all__ = ["SETTINGS_KEY", "PrefetchingDataLoader", "PrefetchingStatefulDataLoader", "with_prefetch"]

#: Where a :class:`PrefetchingStatefulDataLoader` state keeps the settings its positions are in (beside torchdata's).
SETTINGS_KEY = "fastdata_settings"


# Every live iterator with worker processes. At interpreter exit, torch leaves the workers of an iterator still
# alive (persistent workers of a loader a DataModule holds, say) to multiprocessing, which kills them (SIGTERM):
# they never run their own exit clean-up, and each leaves its ``pymp-*`` folder in the temporary directory. This
# handler, registered after torch's and multiprocessing's and so run before them, asks them to exit instead.
_LIVE_ITERATORS: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _shut_down_workers_at_exit() -> None:
    for iterator in list(_LIVE_ITERATORS):
        try:
            shut_down_workers(iterator)
        except Exception:  # noqa: BLE001,S110 - the interpreter is exiting; multiprocessing still ends them
            pass


def _with_cause(start: Callable[[], Any], watch: StartWatch | None) -> Any:
    """``start()`` (a loader's ``iter()``, which may wait for its workers), raising why a worker did not start."""
    try:
        return start()
    except (RuntimeError, KeyboardInterrupt) as err:
        raise_cause(err, watch)
        raise


def _prefetcher(device: torch.device | str | None) -> DevicePrefetcher | None:
    return None if device is None else DevicePrefetcher(device)


class _TransportMixin:
    """What both loaders share: the batch transport (chosen in ``__init__``), its clean-up hooks, and the repr.

    Each loader class keeps its own ``__init__`` with the same explicit signature, not one here: Lightning records
    a loader's constructor arguments (to rebuild it with a ``DistributedSampler``) only for ``DataLoader``
    subclasses that define ``__init__`` themselves, and this mixin is not one.
    """

    batch_transport: BatchTransport
    prefetch_device: torch.device | str | None
    num_workers: int
    batch_size: int | None
    _watched: weakref.ref[Any] | None = None
    _inner: weakref.ref[Any] | None = None

    @staticmethod
    def _transport_kwargs(batch_transport: str, kwargs: dict[str, Any]) -> tuple[BatchTransport, dict[str, Any]]:
        """Resolve the transport; wrap ``worker_init_fn`` so that each worker records that it started.

        With the pool, the wrapped initialiser turns it on first (:mod:`~lightning_fastdata.loading.transport.shm_pool`,
        :mod:`~lightning_fastdata.loading.transport.worker_start`).
        """
        transport = shm_pool.resolve_transport(batch_transport)
        init = kwargs.get("worker_init_fn")
        if isinstance(init, StartedWorkerInit):  # a re-instantiated copy (Lightning passes our own attribute back)
            init = init.inner
        if isinstance(init, PoolWorkerInit):
            init = init.inner
        workers = kwargs.get("num_workers", 0)
        if transport == "shm_pool" and workers > 0:
            init = PoolWorkerInit(init)
        if workers > 0:
            init = StartedWorkerInit(init, workers, kwargs.get("multiprocessing_context"))
        return transport, {**kwargs, "worker_init_fn": init}

    def _pooled(self) -> bool:
        return self.batch_transport == "shm_pool" and self.num_workers > 0

    def _watch_start(self) -> StartWatch | None:
        """Before an ``iter()`` that forks workers (not a persistent loader's later epochs): watch them start."""
        init = getattr(self, "worker_init_fn", None)
        if not isinstance(init, StartedWorkerInit) or keeps_started_workers(self):
            return None
        return StartWatch(init, self.num_workers)

    def _watch(self, inner: Any, watch: StartWatch | None = None) -> None:
        """Forget this iterator's workers' buffers once it is freed (its workers are joined by then)."""
        self._inner = weakref.ref(inner)
        if watch is not None:
            weakref.finalize(inner, watch.stop).atexit = False
        if has_workers_to_shut_down(inner):
            _LIVE_ITERATORS.add(inner)
        if self._pooled() and (self._watched is None or self._watched() is not inner):
            weakref.finalize(inner, shm_pool.collect, True).atexit = False
            self._watched = weakref.ref(inner)

    def worker_pids(self) -> list[int]:
        """The process ids of the workers of this loader's latest iterator (none before one, or without workers)."""
        inner = None if self._inner is None else self._inner()
        return [] if inner is None else worker_pids(inner)

    def _on_exhausted(self) -> Any:
        """End of an epoch: workers that were not persistent have exited; forget their buffers now."""
        return shm_pool.collect if self._pooled() else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={self.batch_size}, num_workers={self.num_workers}, "
            f"batch_transport={self.batch_transport!r}, prefetch_device={self.prefetch_device!r})"
        )


class PrefetchingDataLoader(_TransportMixin, DataLoader):
    """A ``DataLoader`` whose iterator keeps the next batch in flight to ``prefetch_device``.

    Args:
        dataset: As ``DataLoader``'s.
        prefetch_device: Copy the next batch to this device while the current one is used; ``None``: no look-ahead.
        batch_transport: ``"torch"``: batches cross from workers as torch sends them; ``"shm_pool"``: in reused
            shared-memory buffers (for the package's datasets; falls back to ``"torch"``, warned, where this torch
            lacks what the pool needs).
        **kwargs: ``DataLoader``'s other arguments.

    Raises:
        ValueError: If ``batch_transport`` is neither ``"shm_pool"`` nor ``"torch"``.
    """

    def __init__(
        self,
        dataset: Dataset,
        prefetch_device: torch.device | str | None = None,
        batch_transport: BatchTransport = "torch",
        **kwargs: Any,
    ) -> None:
        self.batch_transport, kwargs = self._transport_kwargs(batch_transport, kwargs)
        super().__init__(dataset, **kwargs)
        self.prefetch_device = prefetch_device
        self._prefetcher = _prefetcher(prefetch_device)

    def __iter__(self) -> Any:
        watch = self._watch_start()
        inner = _with_cause(super().__iter__, watch)
        self._watch(inner, watch)
        on_exhausted = self._on_exhausted()
        if self._prefetcher is None and on_exhausted is None and watch is None:
            return inner
        return PrefetchIterator(inner, self._prefetcher, on_exhausted=on_exhausted, watch=watch)


class PrefetchingStatefulDataLoader(_TransportMixin, StatefulDataLoader):
    """A torchdata ``StatefulDataLoader`` that prefetches, and whose state is what was really handed out.

    :meth:`state_dict` is the state after the batch last returned (the look-ahead batch left out, so a resume
    replays it); :meth:`state_before_current_batch` the state before it (a resume from it trains that batch
    again: what a checkpoint saved because the step failed needs).

    Args:
        dataset: As ``StatefulDataLoader``'s.
        prefetch_device: Copy the next batch to this device while the current one trains; ``None``: no look-ahead.
        batch_transport: As :class:`PrefetchingDataLoader`'s.
        **kwargs: ``StatefulDataLoader``'s other arguments.

    Raises:
        ValueError: If ``batch_transport`` is neither ``"shm_pool"`` nor ``"torch"``.
    """

    def __init__(
        self,
        dataset: Dataset,
        prefetch_device: torch.device | str | None = None,
        batch_transport: BatchTransport = "torch",
        **kwargs: Any,
    ) -> None:
        self.batch_transport, kwargs = self._transport_kwargs(batch_transport, kwargs)
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

    def __iter__(self) -> PrefetchIterator:
        state_fn = super().state_dict if self.exact_state else None  # out of order: no state worth tracking
        watch = self._watch_start()
        inner = _with_cause(super().__iter__, watch)
        self._watch(inner, watch)
        it = PrefetchIterator(inner, self._prefetcher, state_fn, self._on_exhausted(), watch)
        it.returned = self._batches_done_before(inner)
        self._current = weakref.ref(it)
        return it

    def _batches_done_before(self, inner: Any) -> int:
        """Batches of this epoch handed out before ``inner`` began.

        Those of the state it was restored from (torchdata's count), plus those an epoch continued on another world
        or batch size leaves out (its sampler's
        :meth:`~lightning_fastdata.loading.sampler.EpochSampler.epoch_length` is shorter than a whole epoch's).
        """
        done = batches_yielded(inner)
        epoch_length = getattr(self.sampler, "epoch_length", None)
        if callable(epoch_length) and self.batch_size:
            left = int(epoch_length())
            batches_left = left // self.batch_size if self.drop_last else -(-left // self.batch_size)
            done += max(0, len(self) - batches_left)
        return done

    def _iterator_now(self) -> PrefetchIterator | None:
        return None if self._current is None else self._current()

    def state_dict(self) -> dict[str, Any]:
        """The loader's exact state after the batch last returned (:meth:`state_after_current_batch`).

        torchdata's state, and under ``SETTINGS_KEY`` the settings it describes positions in (``batch_size``,
        ``num_workers``, ``drop_last``, the sampler's ranks), which :meth:`load_state_dict` checks.
        """
        return self.state_after_current_batch()

    def state_after_current_batch(self) -> dict[str, Any]:
        """The state after the batch last returned (a look-ahead batch is left out, so a resume replays it)."""
        it = self._iterator_now()
        if it is not None and it.state_after is not None:
            return self._stamped(it.state_after)
        return self._stamped(super().state_dict())

    def state_before_current_batch(self) -> dict[str, Any]:
        """The state before the batch last returned: resuming from it trains that batch again."""
        it = self._iterator_now()
        if it is not None and it.state_before is not None:
            return self._stamped(it.state_before)
        return self.state_after_current_batch()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict`: the next iteration continues exactly where it was taken.

        An empty state loads nothing (torchdata's meaning: no state). A state taken on other settings is refused
        before anything changes, naming what differs: its position would describe other batches.

        Raises:
            ValueError: If the state was saved with another ``batch_size``, ``num_workers``, ``drop_last`` or number
                of ranks, or its sampler with another seed, dataset length or sampling settings.
        """
        if not state_dict:
            super().load_state_dict(state_dict)
            return
        state = dict(state_dict)
        saved = state.pop(SETTINGS_KEY, None)
        if saved is not None:
            now = self._settings()
            changed = [f"{k}={saved[k]!r} -> {now[k]!r}" for k in now if k in saved and saved[k] != now[k]]
            if changed:
                raise ValueError(
                    f"This loader state was saved with other settings ({', '.join(changed)}): its position describes "
                    "other batches. Load it into a loader with the saved settings; a DataModule's checkpoint "
                    "(Trainer.fit(ckpt_path=...)) continues an epoch on another world size, batch size or worker "
                    "count by samples."
                )
        found = sampler_state(state)
        check = getattr(self.sampler, "check_compatible", None)
        if found is not None and callable(check):
            check(found[0])
        super().load_state_dict(state)

    def _settings(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "drop_last": self.drop_last,
            "num_replicas": getattr(self.sampler, "num_replicas", 1),
        }

    def _stamped(self, state: dict[str, Any]) -> dict[str, Any]:
        return {**state, SETTINGS_KEY: self._settings()}

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

    Args:
        loader: The loader to rebuild.
        device: Where batches are prefetched to (a CUDA device), or ``None`` for no look-ahead.
        pin_memory: Overrides the loader's ``pin_memory`` if not ``None``.
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
