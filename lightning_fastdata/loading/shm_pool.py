"""Batch buffers in shared memory that workers reuse, and that cross to the main process without a file descriptor.

torch sends a worker's batch to the main process as a fresh shared-memory segment per tensor: the worker
allocates and zero-fills new pages, writes them, passes one file descriptor per tensor through a socket,
and the main process maps and unmaps the segment. On a 2-core machine that costs more than copying the
pixels out of a memory-mapped cache (measured: 11,500 img/s with fresh segments, 31,000 reusing segments
but still passing descriptors, 52,000 passing none; 64 x 224 x 224 batches, 2 workers).

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
  cached object). Labels and other small tensors travel by value.
- A buffer pickled for another process (a batch put on a ``torch.multiprocessing`` queue) is retired: the
  other process's references are invisible here, so it is dropped from the cache and never released; the
  worker replaces it.
- If no buffer is free (the user holds batches, a batch was never sent), the worker replaces one with a
  new buffer at a new generation: the old buffer is never written again and lives on as long as anyone
  references it. So the pool can only cost speed, never overwrite a batch someone still holds.
- The main process drops an incarnation's cache as soon as the worker exits (a reaper thread, alive only
  while workers are cached, sees end-of-file on a pipe whose write end only the worker holds) and every
  batch it sent has arrived, or 120 s after it exited (batches abandoned in a queue that will never be read).

Thread safety: the main process's cache is guarded by one lock (pin-memory threads, loaders in several
threads, the reaper); a worker's pool is used by that worker's one thread.

Shared memory held per worker: up to ``MAX_SLOTS`` batches (in practice the batches in flight plus one).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import select
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = ["MAX_SLOTS", "WorkerPool", "main_cache_stats", "pool_supported", "worker_pool"]

#: Buffers per worker at most.
MAX_SLOTS = 8
#: Tensors of at most this many bytes (labels, boxes, flips) travel by value inside the pickle.
_BY_VALUE_BYTES = 1 << 16
_DEAD_GRACE_S = 120.0


def pool_supported() -> bool:
    """Whether this torch exposes what the pool needs (else batches travel the usual way)."""
    return hasattr(torch.UntypedStorage, "_new_shared") and hasattr(torch._C, "_storage_Use_Count")


def _use_count(storage: torch.UntypedStorage) -> int:
    return int(torch._C._storage_Use_Count(storage._cdata))


def _new_buffer(nbytes: int) -> torch.UntypedStorage:
    """A new shared-memory buffer with its pages reserved, or a clear error if ``/dev/shm`` is too small.

    Recent torch reserves the pages itself and, when that fails, raises but leaves an empty
    ``/dev/shm/torch_<pid>_...`` file behind: it is removed here. Older torch (2.6) reserves nothing, so a full
    ``/dev/shm`` killed the worker with SIGBUS at the first write: the pages are reserved here (``posix_fallocate``).
    """
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)
        if hasattr(os, "posix_fallocate") and torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
            fd, size = storage._share_fd_cpu_()
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
            hello = (self.flags, DupFd(self._alive_r))
            os.close(self._alive_r)  # DupFd holds its own duplicate until the main process takes it
            self._alive_r = None
        storage = None if slot.known else slot.storage
        slot.known = True
        self._flags[MAX_SLOTS] += 1
        meta = (images.dtype, images.storage_offset(), tuple(images.shape), images.stride())
        rest = tuple(_by_value(x) for x in batch[1:])
        return _PooledBatch((self.nonce, index, slot.gen, hello, storage, meta, rest))


def _by_value(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.nbytes <= _BY_VALUE_BYTES:
        return np.ascontiguousarray(x.numpy())  # pickled inline: no descriptor, no shared segment
    return x


class _PooledBatch:
    """What crosses the queue; unpickles (in the main process) into the plain tuple of tensors."""

    __slots__ = ("args",)

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self.args)


_POOL: WorkerPool | None = None


def worker_pool() -> WorkerPool | None:
    """This worker process's pool; ``None`` in the main process or when unsupported."""
    global _POOL
    if get_worker_info() is None or not pool_supported():
        return None
    if _POOL is None or _POOL.pid != os.getpid():  # first use, or inherited through fork
        _POOL = WorkerPool()
    return _POOL


# -- main process ----------------------------------------------------------------------------------------------
@dataclass
class _Incarnation:
    flags: np.ndarray  # view of the worker's shared flags (keeps the mapping alive)
    alive_fd: int
    storages: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    outstanding: dict[int, int] = field(default_factory=dict)  # slot -> generation not yet released
    received: int = 0
    dead_since: float | None = None


_MAIN: dict[int, _Incarnation] = {}
# Every place the main process's state is read or changed holds this lock: the pin-memory thread of one loader
# and the main thread of another both unpickle, and the reaper thread forgets exited workers.
_LOCK = threading.RLock()
_ESCAPED: set[int] = set()  # data_ptr of cached buffers that were shared with another process (never reused)
_REAPER: threading.Thread | None = None
_WAKE_R, _WAKE_W = -1, -1  # the reaper's wake-up pipe (a new worker to watch)


def _after_fork_in_child() -> None:
    """A forked child starts with no cache, a free lock and no reaper (the parent's own are not ours)."""
    global _LOCK, _REAPER, _WAKE_R, _WAKE_W
    _LOCK = threading.RLock()
    _MAIN.clear()
    _ESCAPED.clear()
    _REAPER, _WAKE_R, _WAKE_W = None, -1, -1


os.register_at_fork(after_in_child=_after_fork_in_child)


def _rebuild(
    nonce: int,
    index: int,
    gen: int,
    hello: tuple[torch.Tensor, Any] | None,
    storage: torch.UntypedStorage | None,
    meta: tuple[torch.dtype, int, tuple[int, ...], tuple[int, ...]],
    rest: tuple[Any, ...],
) -> tuple[Any, ...]:
    with _LOCK:
        if hello is not None:
            _MAIN[nonce] = _Incarnation(hello[0].numpy(), hello[1].detach())
            _install_share_hook()
            _watch_exits()
        inc = _MAIN.get(nonce)
        if inc is not None and storage is not None:
            inc.storages[index] = storage
        cached = None if inc is None else inc.storages.get(index)
        if inc is None or cached is None:
            raise RuntimeError(
                f"lightning_fastdata: a batch refers to shared buffer {index} of worker {nonce:x}, which this process "
                "never received (batches of one worker must be unpickled in order, by one process)."
            )
        dtype, offset, shape, stride = meta
        images = torch.empty(0, dtype=dtype).set_(cached, offset, shape, stride)
        inc.received += 1
        inc.outstanding[index] = gen
        _collect(_exited(0))
    return (images, *(torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in rest))


def _only_cached(storages: dict[int, torch.UntypedStorage], index: int) -> bool:
    """Whether nothing but our cache can reach the memory of ``storages[index]`` in this process.

    The storage's use count counts tensors and views (a pinned copy, a batch the user kept); the Python
    refcount of the storage object counts references to the object itself (``images.untyped_storage()``
    returns this very object, not a new one): our dict's entry and ``getrefcount``'s argument make 2.
    """
    return _use_count(storages[index]) == 1 and sys.getrefcount(storages[index]) == 2


def _exited(timeout_ms: int | None) -> set[int]:
    """Alive-pipe descriptors at end-of-file (their worker exited); waits up to ``timeout_ms`` for one."""
    poller = select.poll()  # not select.select: that fails for descriptors >= 1024 (FD_SETSIZE)
    for inc in _MAIN.values():
        if inc.dead_since is None:
            poller.register(inc.alive_fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(timeout_ms)}


def _collect(exited: set[int]) -> None:
    """Release buffers nobody references any more; forget workers that exited (called under the lock)."""
    now = time.monotonic()
    for nonce, inc in list(_MAIN.items()):
        flags = inc.flags
        for index, gen in list(inc.outstanding.items()):
            ptr = inc.storages[index].data_ptr()
            if ptr in _ESCAPED:  # shared with another process: we cannot know when it is done with it
                _ESCAPED.discard(ptr)
                del inc.storages[index], inc.outstanding[index]  # never released: the worker replaces it
            elif _only_cached(inc.storages, index):
                flags[index] = gen
                del inc.outstanding[index]
        if inc.alive_fd in exited:  # the worker never writes: readable means end-of-file, it exited
            inc.dead_since = now
        if inc.dead_since is not None and (inc.received >= flags[MAX_SLOTS] or now - inc.dead_since > _DEAD_GRACE_S):
            os.close(inc.alive_fd)
            del _MAIN[nonce]


def _watch_exits() -> None:
    """Start the reaper thread if none runs, else wake it to watch the new worker (called under the lock)."""
    global _REAPER, _WAKE_R, _WAKE_W
    if _REAPER is not None and _REAPER.is_alive():
        os.write(_WAKE_W, b"w")
        return
    if _WAKE_R < 0:
        _WAKE_R, _WAKE_W = os.pipe()
        os.set_blocking(_WAKE_R, False)
    _REAPER = threading.Thread(target=_reap, name="fastdata-shm-reaper", daemon=True)
    _REAPER.start()


def _reap() -> None:
    """Forget workers as soon as they exit, so their buffers are freed without waiting for another batch.

    Runs while any worker is cached (then exits: no idle thread when a later ``fork`` starts new workers).
    """
    global _REAPER
    while True:
        with _LOCK:
            if not _MAIN:
                _REAPER = None
                return
            fds = {inc.alive_fd for inc in _MAIN.values() if inc.dead_since is None}
            pending_dead = len(fds) < len(_MAIN)
        poller = select.poll()
        poller.register(_WAKE_R, select.POLLIN)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        # A worker that exited with batches still in a queue is forgotten after a grace period: look again then.
        events = poller.poll(1000 if pending_dead else None)
        try:
            os.read(_WAKE_R, 4096)
        except BlockingIOError:
            pass
        with _LOCK:
            _collect({fd for fd, _ in events if fd in fds})


def _note_shared(storage: torch.UntypedStorage) -> None:
    """Called when ``storage`` is pickled for another process: if it is one of our buffers, retire it."""
    with _LOCK:
        ptr = storage.data_ptr()
        if any(s.data_ptr() == ptr for inc in _MAIN.values() for s in inc.storages.values()):
            _ESCAPED.add(ptr)


def _install_share_hook() -> None:
    """Wrap torch's reducer for shared CPU storages, so that a pooled batch sent onward is never reused.

    A batch put on a ``torch.multiprocessing`` queue crosses as its shared-memory segment; the receiving
    process's references are invisible here, so such a buffer is dropped from the cache (the worker replaces
    it) instead of being written again.
    """
    from torch.multiprocessing import reductions  # noqa: F401 - registers torch's reducers first

    reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
    original = reducers.get(torch.UntypedStorage)
    if original is None or getattr(original, "_fastdata_hook", False):
        return

    def reduce_storage(storage: torch.UntypedStorage) -> Any:
        if _MAIN and storage.device.type == "cpu":
            _note_shared(storage)
        return original(storage)

    reduce_storage._fastdata_hook = True  # type: ignore[attr-defined]
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)


def main_cache_stats() -> dict[str, int]:
    """Workers and buffers the main process currently caches (for tests and diagnostics)."""
    with _LOCK:
        return {
            "workers": len(_MAIN),
            "buffers": sum(len(inc.storages) for inc in _MAIN.values()),
            "outstanding": sum(len(inc.outstanding) for inc in _MAIN.values()),
        }
