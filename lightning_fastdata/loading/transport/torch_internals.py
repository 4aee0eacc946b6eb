"""Every private torch and ``multiprocessing`` API the shared-memory batch pool uses, checked once at import.

The pool (:mod:`lightning_fastdata.loading.transport.shm_pool`) and the loaders
(:mod:`lightning_fastdata.loading.transport.loaders`) reach below torch's public API in these places, and nowhere
else:

- ``_MultiProcessingDataLoaderIter._shutdown_workers()``: ask a loader iterator's workers to exit (the loaders call it
  at interpreter exit, before multiprocessing would kill them; :func:`has_workers_to_shut_down`,
  :func:`shut_down_workers`), and its ``_workers`` (the processes, whose CPU time ``DataWaitMonitor`` reads:
  :func:`worker_pids`);

- ``torch.UntypedStorage._new_shared(nbytes)``: allocate a storage directly in shared memory (the allocator
  torch's own ``default_collate`` uses in workers);
- ``UntypedStorage._share_fd_cpu_()``: the file descriptor of such a storage, to reserve its pages;
- ``torch._C._storage_Use_Count(storage._cdata)``: how many tensors and views hold a storage;
- ``multiprocessing.reduction.DupFd``: pass a descriptor along with a pickled object;
- ``ForkingPickler._extra_reducers``: torch's registered reducer for ``UntypedStorage``, which the pool wraps
  while it caches buffers (to see a pooled buffer sent on to another process);
- ``sys.getrefcount``: CPython's count of references to the storage object itself (the pool frees a buffer only
  when its own cache entry is the last one). Checked here on a real storage, not assumed: an interpreter that
  counts otherwise (another implementation, a future CPython) gets torch's transport.

:data:`MISSING` names those that this torch or Python lacks; when it is not empty the pool is not used and
batches travel torch's own way (one warning, from
:func:`lightning_fastdata.loading.transport.shm_pool.resolve_transport`).
Each behaviour the pool relies on is pinned by a test in ``tests/loading/test_torch_internals.py``.
"""

from __future__ import annotations

import multiprocessing.reduction
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing import reductions as _torch_reductions  # noqa: F401 - registers torch's reducers

__all__ = [
    "MISSING",
    "DupFd",
    "ForkingPickler",
    "has_workers_to_shut_down",
    "held_only_by",
    "keeps_started_workers",
    "new_shared_storage",
    "reserve_pages",
    "set_storage_reducer",
    "shut_down_workers",
    "worker_pids",
    "storage_reducer",
    "storage_use_count",
]

ForkingPickler = multiprocessing.reduction.ForkingPickler
DupFd: Any = getattr(multiprocessing.reduction, "DupFd", None)


def _refcount_holds() -> bool:
    """Whether :func:`held_only_by` can tell a storage held by one dict entry alone from one held twice."""
    if not hasattr(sys, "getrefcount"):
        return False
    holder = {0: torch.UntypedStorage(1)}
    alone = held_only_by(holder, 0)
    kept = holder[0]  # a user's reference to the storage object (as ``images.untyped_storage()`` returns it)
    shared = not held_only_by(holder, 0)
    del kept
    return alone and shared and held_only_by(holder, 0)


def held_only_by(holder: dict[int, Any], key: int) -> bool:
    """Whether ``holder[key]`` has no Python reference but ``holder``'s entry (CPython's count: entry + argument)."""
    return sys.getrefcount(holder[key]) == 2


def _missing() -> list[str]:
    checks = {
        "torch.UntypedStorage._new_shared": hasattr(torch.UntypedStorage, "_new_shared"),
        "torch.UntypedStorage._share_fd_cpu_": hasattr(torch.UntypedStorage, "_share_fd_cpu_"),
        "torch._C._storage_Use_Count": hasattr(torch._C, "_storage_Use_Count"),
        "multiprocessing.reduction.DupFd": DupFd is not None,
        "ForkingPickler._extra_reducers[torch.UntypedStorage]": isinstance(
            getattr(ForkingPickler, "_extra_reducers", None), dict
        )
        and torch.UntypedStorage in ForkingPickler._extra_reducers,  # type: ignore[attr-defined]
        "sys.getrefcount (a storage held by one dict entry alone counts 2, one more reference 3)": _refcount_holds(),
    }
    return [name for name, present in checks.items() if not present]


#: The private APIs above that this torch or Python lacks; empty when the pool can be used.
MISSING: list[str] = _missing()


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """A new ``nbytes`` storage in shared memory (torch's allocator for worker batches)."""
    return torch.UntypedStorage._new_shared(nbytes)


def reserve_pages(storage: torch.UntypedStorage) -> tuple[int, int]:
    """The ``(fd, size)`` of a shared storage (``file_descriptor`` strategy), to reserve its pages up front."""
    fd, size = storage._share_fd_cpu_()
    return int(fd), int(size)


def storage_use_count(storage: torch.UntypedStorage) -> int:
    """Tensors and views that hold ``storage`` (a pinned copy or a user's view counts too)."""
    return int(torch._C._storage_Use_Count(storage._cdata))


def storage_reducer() -> Callable[[torch.UntypedStorage], Any] | None:
    """The reducer ``ForkingPickler`` uses for CPU storages now (torch's, unless wrapped)."""
    return ForkingPickler._extra_reducers.get(torch.UntypedStorage)  # type: ignore[attr-defined]


def set_storage_reducer(reduce: Callable[[torch.UntypedStorage], Any]) -> None:
    """Make ``ForkingPickler`` (queues of ``multiprocessing`` and ``torch.multiprocessing``) use ``reduce``."""
    ForkingPickler.register(torch.UntypedStorage, reduce)


def has_workers_to_shut_down(iterator: Any) -> bool:
    """Whether ``iterator`` (a ``DataLoader``'s) has worker processes torch shuts down itself."""
    return callable(getattr(iterator, "_shutdown_workers", None))


def shut_down_workers(iterator: Any) -> None:
    """Ask ``iterator``'s workers to exit now (torch's own clean-up of an iterator it is done with)."""
    iterator._shutdown_workers()


def keeps_started_workers(loader: Any) -> bool:
    """Whether ``loader``'s next ``iter()`` reuses workers already started (persistent, with a live iterator)."""
    return bool(loader.persistent_workers) and getattr(loader, "_iterator", None) is not None


def worker_pids(iterator: Any) -> list[int]:
    """The process ids of ``iterator``'s workers (a ``DataLoader`` iterator's; none without workers)."""
    return [int(w.pid) for w in getattr(iterator, "_workers", None) or [] if getattr(w, "pid", None)]
