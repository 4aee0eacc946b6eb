"""Batch buffers in shared memory that workers reuse, and that cross to the main process without a file descriptor.

torch sends a worker's batch to the main process as a fresh shared-memory segment per tensor: the worker
allocates and zero-fills new pages, writes them, passes one file descriptor per tensor through a socket,
and the main process maps and unmaps the segment: for a loader that only copies pixels (a tensor cache) that
costs more than the copy (the docs' Architecture page has the figures).

Protocol (each worker process is one *incarnation*, named by a random nonce):

- A worker keeps up to :data:`MAX_SLOTS` buffers. Slot ``i`` carries a generation ``gen`` that grows each
  time the slot is handed out; the worker writes into a buffer only when the main process has written
  that same generation into ``flags[i]`` (a small shared array of the incarnation), i.e. released it.
- The first batch from a slot's buffer carries the buffer itself (one descriptor, as torch sends it); the
  main process keeps it in a cache. Later batches from that buffer carry only ``(nonce, slot, gen)``; the
  main process rebuilds the tensors as views of the cached buffer. A worker's batches reach the main
  process in the order they were sent, so the buffer always arrives before its first reference.
- The main process releases ``(slot, gen)`` when nothing but its cache references the buffer, checked
  whenever a batch arrives: the storage's use count (views, pinned copies, tensors a user kept) is 1 and the
  storage object's Python refcount says nobody holds it either (``images.untyped_storage()`` returns our
  cached object). Labels and other small tensors travel by value; a tensor that lives in the same buffer as the
  images (a segmentation batch's masks) travels as its place in it and is rebuilt as a view of the cached buffer,
  which it then holds as the images do.
- A buffer pickled for another process (a batch put on a ``torch.multiprocessing`` queue) is retired: the
  other process's references are invisible here, so it is dropped from the cache and never released; the
  worker replaces it.
- If no buffer is free (the user holds batches, a batch was never sent), the worker replaces one with a
  new buffer at a new generation: the old buffer is never written again and lives on as long as anyone
  references it. So the pool can only cost speed, never overwrite a batch someone still holds.
- The main process drops an incarnation's cache once the worker has exited (end-of-file on a pipe whose write
  end only the worker holds) and every batch it sent has arrived, or, whatever arrived, once the loader
  iterator that owned the worker is freed (the batches still in its queue will never be read).

Lifetime (nothing runs or stays installed beyond the loaders that need it):

- The pool is an explicit choice of the loader (``batch_transport="shm_pool"``, see
  :mod:`lightning_fastdata.loading.transport.loaders`): its ``worker_init_fn`` turns the pool on in each worker
  (:class:`PoolWorkerInit`). Any other loader's workers send batches torch's own way.
- The main process has no thread of its own: buffers are released when a batch arrives, and exited workers are
  forgotten when a batch arrives, when a loader's epoch ends and when a loader's worker iterator is freed (its
  workers have been joined then). So at interpreter exit no thread of ours can be freeing a tensor (a daemon
  thread doing so while Python finalises aborted the process: ``terminate called without an active exception``).
- While any worker is cached, torch's ``ForkingPickler`` reducer for storages is wrapped (to see a pooled buffer
  sent on to another process); the wrapper is removed when the last cached worker is forgotten.
- A forked child starts with an empty cache and a lock of its own (checked by process id at each use, so a
  fork while another thread held the parent's lock cannot block the child).

Every private torch API used here lives in :mod:`lightning_fastdata.loading.transport.torch_internals`; where one is
missing, :func:`resolve_transport` falls back to ``"torch"`` with one warning.

Thread safety: the main process's cache is guarded by one lock (pin-memory threads, loaders in several
threads); a worker's pool is used by that worker's one thread.

Shared memory held per worker: up to ``MAX_SLOTS`` batches (in practice the batches in flight plus one).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import select
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

from lightning_fastdata.loading.transport import torch_internals as internals

__all__ = [
    "MAX_SLOTS",
    "BatchTransport",
    "PoolWorkerInit",
    "WorkerPool",
    "collect",
    "enable_in_worker",
    "main_cache_stats",
    "new_worker_buffer",
    "resolve_transport",
    "worker_pool",
]

#: How batches travel from worker processes to the main process. ``"shm_pool"`` reuses this module's buffers,
#: ``"torch"`` is torch's own transport (a new shared segment and descriptor per tensor).
BatchTransport = Literal["shm_pool", "torch"]

#: Buffers per worker at most.
MAX_SLOTS = 8
#: Tensors of at most this many bytes (labels, boxes, flips) travel by value inside the pickle.
_BY_VALUE_BYTES = 1 << 16
_warned_missing = False


def resolve_transport(requested: str) -> BatchTransport:
    """The transport a loader uses for ``requested``: ``"torch"`` when the pool's private APIs are missing.

    Raises:
        ValueError: If ``requested`` is neither ``"shm_pool"`` nor ``"torch"``.
    """
    global _warned_missing
    if requested not in ("shm_pool", "torch"):
        raise ValueError(f"batch_transport should be 'shm_pool' or 'torch', got {requested!r}.")
    if requested == "torch" or not internals.MISSING:
        return requested  # type: ignore[return-value]
    if not _warned_missing:
        _warned_missing = True
        warnings.warn(
            f"lightning_fastdata: this torch lacks {', '.join(internals.MISSING)}, which the reused shared-memory "
            "batch buffers need; batches travel torch's own way instead (batch_transport='torch'), correct but slower.",
            RuntimeWarning,
            stacklevel=2,
        )
    return "torch"


def _new_buffer(nbytes: int) -> torch.UntypedStorage:
    """A new shared-memory buffer with its pages reserved, or a clear error if ``/dev/shm`` is too small.

    Recent torch reserves the pages itself and, when that fails, raises but leaves an empty
    ``/dev/shm/torch_<pid>_...`` file behind: it is removed here. Older torch (2.6) reserves nothing, so a full
    ``/dev/shm`` killed the worker with SIGBUS at the first write: the pages are reserved here (``posix_fallocate``).
    """
    try:
        storage = internals.new_shared_storage(nbytes)
        if hasattr(os, "posix_fallocate") and torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
            fd, size = internals.reserve_pages(storage)
            os.posix_fallocate(fd, 0, size)
        return storage
    except (RuntimeError, OSError) as err:
        # torch names the file it created: /dev/shm/torch_<pid>_...; remove it if it is still there.
        match = re.search(rf"<(/torch_{os.getpid()}_[^>/]*)>", str(err))
        if match is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("/dev/shm" + match.group(1))
        raise RuntimeError(
            f"{err}. lightning_fastdata: a worker could not allocate a {nbytes / 2**20:.1f} MiB batch buffer in "
            "/dev/shm (No space left on device); give the container more shared memory (docker run --shm-size=2g) "
            "or lower batch_size or prefetch_factor."
        ) from err


def new_worker_buffer(nbytes: int) -> torch.UntypedStorage | None:
    """A storage for a batch built in a worker: a pooled buffer, else a fresh shared one; ``None`` outside workers.

    Either way the batch is written in shared memory directly, so sending it copies nothing (``None``: the caller
    allocates ordinary memory; also when this torch lacks ``_new_shared``, then torch copies it when sending).
    """
    if get_worker_info() is None:
        return None
    pool = worker_pool()
    if pool is not None:
        return pool.acquire(nbytes)
    if "torch.UntypedStorage._new_shared" in internals.MISSING:
        return None
    return internals.new_shared_storage(nbytes)  # the allocator default_collate uses


# -- worker process ----------------------------------------------------------------------------------------------
@dataclass
class _Slot:
    storage: torch.UntypedStorage
    nbytes: int
    gen: int = 0
    known: bool = False  # the main process has this buffer (sent in an earlier batch)


class WorkerPool:
    """The buffers of one worker process (one incarnation)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.nonce = secrets.randbits(62)
        self.flags = torch.zeros(MAX_SLOTS + 1, dtype=torch.int64).share_memory_()  # [released gens..., sent]
        self._flags = self.flags.numpy()
        self._alive_r: int | None
        self._alive_r, self._alive_w = os.pipe()  # the main process sees EOF on its copy of _alive_r when we exit
        self.slots: list[_Slot] = []
        self._by_ptr: dict[int, int] = {}
        self._victim = 0

    def acquire(self, nbytes: int) -> torch.UntypedStorage:
        """A buffer of at least ``nbytes`` that nobody else references; in flight from now on."""
        flags = self._flags
        index = next((i for i, s in enumerate(self.slots) if s.nbytes >= nbytes and flags[i] == s.gen), None)
        if index is None:
            if len(self.slots) < MAX_SLOTS:
                index = len(self.slots)
                self.slots.append(_Slot(_new_buffer(nbytes), nbytes))
            else:
                # Replace a released-but-too-small buffer, else (round robin) one still in flight: that one is
                # abandoned, never written again, and freed by whoever holds it last.
                free = [i for i, s in enumerate(self.slots) if flags[i] == s.gen]
                index = free[0] if free else self._victim
                self._victim = (self._victim + 1) % MAX_SLOTS
                slot = self.slots[index]
                del self._by_ptr[slot.storage.data_ptr()]
                slot.storage, slot.nbytes, slot.known = _new_buffer(nbytes), nbytes, False
            self._by_ptr[self.slots[index].storage.data_ptr()] = index
        slot = self.slots[index]
        slot.gen += 1
        return slot.storage

    def pack(self, batch: tuple[Any, ...]) -> _PooledBatch | None:
        """Wrap a batch whose first tensor lives in one of our buffers for sending; ``None`` if it does not."""
        images = batch[0]
        if not isinstance(images, torch.Tensor) or images.device.type != "cpu":
            return None
        index = self._by_ptr.get(images.untyped_storage().data_ptr())
        if index is None:
            return None
        slot = self.slots[index]
        hello = None
        if self._alive_r is not None:  # the first batch of this incarnation introduces it
            hello = (self.flags, internals.DupFd(self._alive_r))
            os.close(self._alive_r)  # DupFd holds its own duplicate until the main process takes it
            self._alive_r = None
        storage = None if slot.known else slot.storage
        slot.known = True
        self._flags[MAX_SLOTS] += 1
        meta = (images.dtype, images.storage_offset(), tuple(images.shape), images.stride())
        ptr = slot.storage.data_ptr()
        rest = tuple(_view_of(x) if _in_buffer(x, ptr) else _by_value(x) for x in batch[1:])
        kind = type(batch) if hasattr(batch, "_fields") else None  # a named tuple (DeviceBatch) keeps its class
        return _PooledBatch((self.nonce, index, slot.gen, hello, storage, meta, rest, kind))


class _ViewOf(NamedTuple):
    """A tensor of the batch that lives in the images' buffer too (a segmentation batch's masks): sent as its place."""

    dtype: torch.dtype
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _in_buffer(x: Any, ptr: int) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.untyped_storage().data_ptr() == ptr


def _view_of(x: torch.Tensor) -> _ViewOf:
    return _ViewOf(x.dtype, int(x.storage_offset()), tuple(x.shape), x.stride())


def _by_value(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.nbytes <= _BY_VALUE_BYTES:
        return np.ascontiguousarray(x.numpy())  # pickled inline: no descriptor, no shared segment
    return x


class _PooledBatch:
    """What crosses the queue; unpickles (in the main process) into the tuple of tensors (of the batch's class)."""

    __slots__ = ("args",)

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self.args)


_POOL: WorkerPool | None = None


def enable_in_worker() -> WorkerPool:
    """Turn the pool on in this worker process (what :class:`PoolWorkerInit` does); returns it."""
    global _POOL
    if _POOL is None or _POOL.pid != os.getpid():  # first use, or inherited through fork
        _POOL = WorkerPool()
    return _POOL


def worker_pool() -> WorkerPool | None:
    """This worker process's pool if its loader chose ``batch_transport="shm_pool"``, else ``None``."""
    if _POOL is None or _POOL.pid != os.getpid() or get_worker_info() is None:
        return None
    return _POOL


class PoolWorkerInit:
    """A loader's ``worker_init_fn`` with the pool turned on first (picklable, so it works under ``spawn``).

    Args:
        inner: The loader's own ``worker_init_fn`` (called after), or ``None``.
    """

    def __init__(self, inner: Callable[[int], None] | None = None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        """Turn the pool on, then run the loader's own initialiser."""
        enable_in_worker()
        if self.inner is not None:
            self.inner(worker_id)

    def __repr__(self) -> str:
        return f"PoolWorkerInit({self.inner!r})"


# -- main process ----------------------------------------------------------------------------------------------
@dataclass
class _Incarnation:
    flags: np.ndarray  # view of the worker's shared flags (keeps the mapping alive)
    alive_fd: int
    storages: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    outstanding: dict[int, int] = field(default_factory=dict)  # slot -> generation not yet released
    received: int = 0
    exited: bool = False


class _MainCache:
    """The main process's view of its pooled workers: their buffers, what is in use, what escaped.

    One per process (:func:`_main`); every method takes the lock. A pin-memory thread of one loader and the main
    thread of another may both unpickle batches.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.incarnations: dict[int, _Incarnation] = {}
        self.escaped: set[int] = set()  # data_ptr of cached buffers shared with another process (never reused)

    def rebuild(self, nonce: int, index: int, gen: int, hello: Any, storage: Any, meta: tuple[Any, ...]) -> Any:
        with self.lock:
            if hello is not None:
                self.incarnations[nonce] = _Incarnation(hello[0].numpy(), hello[1].detach())
                _wrap_storage_reducer()
            inc = self.incarnations.get(nonce)
            if inc is not None and storage is not None:
                inc.storages[index] = storage
            cached = None if inc is None else inc.storages.get(index)
            if inc is None or cached is None:
                raise RuntimeError(
                    f"lightning_fastdata: a batch refers to shared buffer {index} of worker {nonce:x}, which this "
                    "process never received (batches of one worker must be unpickled in order, by one process)."
                )
            dtype, offset, shape, stride = meta
            images = torch.empty(0, dtype=dtype).set_(cached, offset, shape, stride)
            inc.received += 1
            inc.outstanding[index] = gen
            self.collect()
            return images

    def collect(self, forget_exited: bool = False) -> None:
        """Release buffers nobody references any more; forget workers that exited.

        A worker that exited is forgotten once every batch it sent has arrived, or with ``forget_exited`` (its
        loader iterator was freed, so the rest will never be read).
        """
        with self.lock:
            exited = self._exited()
            for nonce, inc in list(self.incarnations.items()):
                flags = inc.flags
                for index, gen in list(inc.outstanding.items()):
                    ptr = inc.storages[index].data_ptr()
                    if ptr in self.escaped:  # shared with another process: we cannot know when it is done with it
                        self.escaped.discard(ptr)
                        del inc.storages[index], inc.outstanding[index]  # never released: the worker replaces it
                    elif self._only_cached(inc.storages, index):
                        flags[index] = gen
                        del inc.outstanding[index]
                inc.exited = inc.exited or inc.alive_fd in exited
                if inc.exited and (forget_exited or inc.received >= flags[MAX_SLOTS]):
                    os.close(inc.alive_fd)
                    del self.incarnations[nonce]
            if not self.incarnations:
                _unwrap_storage_reducer()

    def _exited(self) -> set[int]:
        """Alive-pipe descriptors at end-of-file: the worker never writes, so readable means it exited."""
        poller = select.poll()  # not select.select: that fails for descriptors >= 1024 (FD_SETSIZE)
        for inc in self.incarnations.values():
            if not inc.exited:
                poller.register(inc.alive_fd, select.POLLIN)
        return {fd for fd, _ in poller.poll(0)}

    @staticmethod
    def _only_cached(storages: dict[int, torch.UntypedStorage], index: int) -> bool:
        """Whether nothing but our cache can reach the memory of ``storages[index]`` in this process.

        The storage's use count counts tensors and views (a pinned copy, a batch the user kept); the Python
        refcount of the storage object counts references to the object itself (``images.untyped_storage()``
        returns this very object, not a new one): ``held_only_by``, checked at import like the other internals
        (:mod:`~lightning_fastdata.loading.transport.torch_internals`).
        """
        return internals.storage_use_count(storages[index]) == 1 and internals.held_only_by(storages, index)

    def note_shared(self, storage: torch.UntypedStorage) -> None:
        """``storage`` is being pickled for another process: if it is one of our buffers, retire it."""
        with self.lock:
            ptr = storage.data_ptr()
            if any(s.data_ptr() == ptr for inc in self.incarnations.values() for s in inc.storages.values()):
                self.escaped.add(ptr)

    def stats(self) -> dict[str, int]:
        with self.lock:
            incs = self.incarnations.values()
            return {
                "workers": len(incs),
                "buffers": sum(len(inc.storages) for inc in incs),
                "outstanding": sum(len(inc.outstanding) for inc in incs),
            }


_CACHE = _MainCache()


def _main() -> _MainCache:
    """This process's cache; a forked child gets a new, empty one (never the parent's lock, maybe held at fork)."""
    global _CACHE
    if _CACHE.pid != os.getpid():
        _CACHE = _MainCache()
    return _CACHE


def _rebuild(
    nonce: int,
    index: int,
    gen: int,
    hello: tuple[torch.Tensor, Any] | None,
    storage: torch.UntypedStorage | None,
    meta: tuple[torch.dtype, int, tuple[int, ...], tuple[int, ...]],
    rest: tuple[Any, ...],
    kind: type | None = None,
) -> tuple[Any, ...]:
    images = _main().rebuild(nonce, index, gen, hello, storage, meta)
    values = (images, *(_rebuilt(x, images) for x in rest))
    return values if kind is None else kind(*values)


def _rebuilt(x: Any, images: torch.Tensor) -> Any:
    if isinstance(x, _ViewOf):  # a view of the same buffer: it holds the buffer as the images do
        return torch.empty(0, dtype=x.dtype).set_(images.untyped_storage(), x.offset, x.shape, x.stride)
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def collect(forget_exited: bool = False) -> None:
    """Release free buffers and forget exited workers now (loaders call this when an epoch or an iterator ends)."""
    _main().collect(forget_exited)


def main_cache_stats() -> dict[str, int]:
    """Workers and buffers the main process currently caches (for tests and diagnostics)."""
    return _main().stats()


# torch's reducer while ours wraps it (the same function in a forked child, which inherits the wrapper).
_torch_reducer: Callable[[torch.UntypedStorage], Any] | None = None


def _reduce_storage(storage: torch.UntypedStorage) -> Any:
    """Torch's reducer for storages, after retiring ``storage`` if it is a pooled buffer (see the protocol)."""
    if storage.device.type == "cpu":
        _main().note_shared(storage)
    assert _torch_reducer is not None
    return _torch_reducer(storage)


def _wrap_storage_reducer() -> None:
    """Wrap torch's reducer while workers are cached (called under the cache's lock)."""
    global _torch_reducer
    current = internals.storage_reducer()
    if current is _reduce_storage or current is None:
        return
    _torch_reducer = current
    internals.set_storage_reducer(_reduce_storage)


def _unwrap_storage_reducer() -> None:
    """Put torch's reducer back (unless someone wrapped ours since: then ours stays, a pass-through when empty)."""
    if _torch_reducer is not None and internals.storage_reducer() is _reduce_storage:
        internals.set_storage_reducer(_torch_reducer)
