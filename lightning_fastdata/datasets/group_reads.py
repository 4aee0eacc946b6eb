"""Samples read a group at a time: a Parquet row group, or a run of a tar shard's members in a bucket.

Where one read serves many samples (Parquet compresses a row group's column chunk as a whole; a bucket answers a
ranged request with per-request costs, so a run of members is cheaper read at once), a dataset numbers groups of
consecutive samples (:attr:`GroupReads._group_of`) and this mixin reads a batch's samples from their groups: the
groups it keeps (the last :attr:`GroupReads.cache_groups` read by this process, or as many as
:attr:`GroupReads.cache_bytes` holds), those requested ahead while the previous batch decoded (a bucket), and the rest
requested together. :meth:`GroupReads.group_windows` is the training order that makes that pay: the groups shuffled
in windows (:class:`~lightning_fastdata.loading.sampler.ShuffleWindows`), each process keeping a window's groups. A
training order without windows (a full shuffle, sampling's draws, a mix) draws each batch from nearly every group:
kept up to :data:`FULL_SHUFFLE_CACHE_BYTES` a process (:func:`keep_for_random_reads`), data that fits is read once a
process and epoch (once a run with persistent workers), not a group per sample.

A subclass gives the groups' reads (:meth:`GroupReads.group_calls` for a bucket, :meth:`GroupReads.read_group` for a
local file) and how a sample's bytes are cut from its group's (:meth:`GroupReads.sample_bytes`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.sampler import ShuffleWindows

__all__ = ["FULL_SHUFFLE_CACHE_BYTES", "GroupReads", "cut_runs", "keep_for_random_reads"]

#: The bytes of groups a process keeps in a training order without windows (512 MiB).
FULL_SHUFFLE_CACHE_BYTES = 512 * 2**20


def keep_for_random_reads(dataset: Any) -> None:
    """Give ``dataset`` (or each source of a mix) read in a random order the full shuffle's budget of kept groups.

    Called by the loader that reads a training dataset without windows (a full shuffle, sampling draws, a mix): the
    dataset is the DataModule's training one, so the budget stays with it (each worker's copy keeps its own groups).
    """
    for d in [dataset, *getattr(dataset, "sources", [])]:
        if isinstance(d, GroupReads):
            d.cache_bytes = max(d.cache_bytes, FULL_SHUFFLE_CACHE_BYTES)


def cut_runs(spans: Iterable[np.ndarray], block_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut each shard's samples into runs of consecutive samples of about ``block_bytes`` (a tar shard read in runs).

    ``spans``: each shard's samples' byte ranges ``[start, end)`` (``n x 2``, in offset order). Returns each sample's
    run (numbered over all shards, shard after shard) and each run's first byte and end (int64).
    """
    group_of, starts, ends, first = [], [], [], 0
    for span in spans:
        if not len(span):
            continue
        cut = (span[:, 0] - span[0, 0]) // block_bytes  # samples lie in offset order: runs ascend
        heads = np.flatnonzero(np.concatenate([[True], np.diff(cut) != 0]))
        group_of.append(first + np.searchsorted(heads, np.arange(len(span)), side="right") - 1)
        starts.append(np.minimum.reduceat(span[:, 0], heads))
        ends.append(np.maximum.reduceat(span[:, 1], heads))
        first += len(heads)
    return tuple(np.concatenate(parts).astype(np.int64) for parts in (group_of, starts, ends))  # type: ignore[return-value]


def _nbytes(values: Any) -> int:
    """The bytes a kept group holds (Arrow arrays, bytes, or tuples of them)."""
    if isinstance(values, tuple | list):
        return sum(_nbytes(v) for v in values)
    if isinstance(values, bytes | bytearray | memoryview):
        return len(values)
    return int(getattr(values, "nbytes", 0))


class GroupReads:
    """The group reads of a dataset (module docstring); its ``_storage`` is an object store, or ``None`` (local).

    Attributes:
        cache_groups: How many groups each process keeps at least.
        cache_bytes: How many bytes of groups each process keeps beyond ``cache_groups`` (0: none).
    """

    _group_of: np.ndarray
    _storage: Any
    cache_groups: int = 4
    cache_bytes: int = 0
    _groups: OrderedDict[int, Any] | None = None
    _kept_bytes: dict[int, int] | None = None
    _pending: dict[int, Any] | None = None
    #: A window's groups are requested this many batches ahead (the first batch of a window needs most of them).
    read_ahead_batches = 4

    # -- what a subclass gives ----------------------------------------------------------------------------------
    def group_calls(self, firsts: Sequence[int]) -> tuple[Callable[..., Any], list[tuple[Any, ...]]]:
        """The function and arguments that read, from a bucket, the groups of samples ``firsts`` (one each)."""
        raise NotImplementedError

    def read_group(self, index: int) -> Any:
        """Sample ``index``'s group read from a local file (an ``OSError`` in its place if that fails)."""
        raise NotImplementedError

    def sample_bytes(self, group: Any, index: int) -> bytes:
        """Sample ``index``'s encoded bytes, from its group's (``b""`` for a missing image: a corrupt sample)."""
        raise NotImplementedError

    def reset_groups(self) -> None:
        """Forget the kept and pending groups (a process of its own: after a fork, or when first used)."""
        self._groups, self._pending, self._kept_bytes = OrderedDict(), {}, {}

    # -- the reads ------------------------------------------------------------------------------------------
    def group_windows(self, samples: int) -> ShuffleWindows:
        """Windows of groups holding about ``samples`` samples; each process then keeps a window's (and two more).

        Raises:
            ValueError: If ``samples`` is not a positive number.
        """
        if not isinstance(samples, int) or samples < 1:
            raise InvalidValueError(f"shuffle_buffer should be a positive number of samples or None, got {samples!r}.")
        starts = np.flatnonzero(np.concatenate([[True], np.diff(self._group_of) != 0]))
        window = max(1, round(samples / (len(self._group_of) / len(starts))))
        self.cache_groups = max(self.cache_groups, window + 2)
        return ShuffleWindows(starts, window)

    def _kept(self) -> OrderedDict[int, Any]:
        if not self._handles_open() or self._groups is None:  # type: ignore[attr-defined]
            self.reset_groups()  # (a forked worker never waits on its parent's request threads)
            self._mark_handles_open()  # type: ignore[attr-defined]
        assert self._groups is not None
        return self._groups

    def _keep(self, g: int, values: Any) -> None:
        groups = self._kept()
        sizes = self._kept_bytes
        assert sizes is not None
        groups[g] = values
        sizes[g] = _nbytes(values) if self.cache_bytes else 0
        total = sum(sizes.values())
        while len(groups) > self.cache_groups and (not self.cache_bytes or total > self.cache_bytes):
            total -= sizes.pop(groups.popitem(last=False)[0])

    def _missing(self, indices: np.ndarray) -> dict[int, int]:
        """The groups of ``indices`` neither kept nor requested ahead, each named by one of its samples."""
        groups, pending = self._kept(), self._pending or {}
        missing: dict[int, int] = {}
        for i in indices.tolist():
            g = int(self._group_of[i])
            if g not in groups and g not in pending and g not in missing:
                missing[g] = i
        return missing

    def read_groups_ahead(self, indices: np.ndarray) -> None:
        """Start the requests of the groups ``indices`` (this worker's next batches) lacks (a bucket).

        Requests already under way for them go on; those for groups no longer wanted are cancelled.
        """
        if self._storage is None:
            return
        groups = self._kept()
        assert self._pending is not None
        wanted = {int(g) for g in np.unique(self._group_of[indices])} - set(groups)
        for g in [g for g in self._pending if g not in wanted]:
            self._pending.pop(g).cancel()  # a guess not read: the batches since took what they needed
        missing = self._missing(indices)
        if missing:
            fn, calls = self.group_calls(list(missing.values()))
            futures = self._storage.start_many(fn, calls)
            if futures is not None:
                self._pending.update(zip(missing, futures))

    def _fetch(self, firsts: dict[int, int]) -> dict[int, Any]:
        """Groups (each named by one of its samples) from a bucket: read ahead already, or requested together now.

        An ``OSError`` in place of one that failed.
        """
        pending = self._pending if self._pending is not None else {}
        results: dict[int, Any] = {}
        for g in [g for g in firsts if g in pending]:
            try:
                results[g] = pending.pop(g).result()
            except Exception as err:  # noqa: BLE001 - handled below as run_many's are
                results[g] = err
        rest = {g: i for g, i in firsts.items() if g not in results}
        if rest:
            fn, calls = self.group_calls(list(rest.values()))
            results.update(zip(rest, self._storage.run_many(fn, calls)))
        out: dict[int, Any] = {}
        for g, i in firsts.items():
            values = results[g]
            if isinstance(values, DataError):
                raise values  # an object that changed after it was indexed: never read
            if isinstance(values, BaseException) and not isinstance(values, OSError):
                values = OSError(f"{self.describe(i)}: its group cannot be read ({values})")  # type: ignore[attr-defined]
            out[g] = values
        return out

    def read_grouped(self, indices: np.ndarray) -> list[bytes | OSError]:
        """Each sample's bytes from its group (an ``OSError`` in its place where its group's read failed)."""
        groups = self._kept()
        batch: dict[int, Any] = {}  # the batch's groups: kept ones, then the others read
        missing: dict[int, int] = {}
        for i in indices.tolist():
            g = int(self._group_of[i])
            if g in batch or g in missing:
                continue
            if g in groups:
                groups.move_to_end(g)
                batch[g] = groups[g]
            else:
                missing[g] = i
        if self._storage is not None:
            read = self._fetch(missing) if missing else {}
        else:
            read = {g: self.read_group(i) for g, i in missing.items()}
        for g, values in read.items():
            if not isinstance(values, OSError):
                self._keep(g, values)
        batch.update(read)
        out: list[bytes | OSError] = []
        for i in indices.tolist():
            values = batch[int(self._group_of[i])]
            out.append(values if isinstance(values, OSError) else self.sample_bytes(values, i))
        return out
