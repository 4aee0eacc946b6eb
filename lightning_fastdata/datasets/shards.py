"""``TarShardDataset``: the samples of WebDataset tar shards, read by random access and decoded as files are.

Each sample's image is read with one ``pread`` at the offset its shard's index gives
(:mod:`~lightning_fastdata.loading.index.tar_index`), or, for a shard in a bucket, one ranged request (several in
flight, the next batch's started ahead: :mod:`~lightning_fastdata.loading.storage.ranged`), and then goes through
the same path as a file of an image folder: the decode of the crop only, the batch built in shared memory, corrupt
images by ``on_corrupt``. Samples are numbered shard after shard, in member order, so a sampler's epoch is a global
shuffle of all of them. Each process opens the shards itself (after a ``fork`` too) and checks, when it opens one
(a bucket: each answer), that it is the shard that was indexed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.datasets.base import AugmentedImageDataset, Source
from lightning_fastdata.datasets.group_reads import GroupReads, cut_runs
from lightning_fastdata.datasets.shard_sources import ShardEntropy, shard_targets
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix, string_hash
from lightning_fastdata.loading.index.tar_index import TarIndex
from lightning_fastdata.loading.storage.ranged import RemoteShard, bucket_storage, read_remote_range, split_url

__all__ = ["TarShardDataset"]


class TarShardDataset(ShardEntropy, GroupReads, AugmentedImageDataset):
    """The samples of tar shards (in the order given, each in member order), as whole uint8 batches.

    Args:
        shards: Each shard's :class:`~lightning_fastdata.loading.index.tar_index.TarIndex`.
        classes: The class names, in label order (a label ``k`` is ``classes[k]``).
        indices: The samples (numbered shard after shard) this dataset holds, in order; ``None``: all (a split).
        entropy_indexes: The entropy indexes of every sample of these shards
            (:func:`~lightning_fastdata.datasets.shard_sources.shard_file_index`'s list), or ``None``.
        labelled: Whether every sample has a label in ``classes`` (``False``: samples to predict on, whose batches
            carry each sample's position, as a prediction folder's do).
        storage_options: Object-store settings for shards in a bucket (their paths are URLs).
        block_bytes: Shards in a bucket: read runs of consecutive members of about this many bytes, one request each
            (kept per process, the next batch's requested ahead); ``None``: one request per sample.
        shuffle_buffer: With ``block_bytes``: the training order in windows of runs holding about this many samples
            (:attr:`windows`); ``None``: no window.
        **kwargs: Augmentation arguments of :class:`~lightning_fastdata.datasets.base.AugmentedImageDataset`.

    Raises:
        ValueError: If there is no sample, or a label is outside ``classes`` (naming the shard and sample).
    """

    per_process_attrs = ("_fds", "_groups", "_pending", "_kept_bytes")

    def __init__(
        self,
        shards: Sequence[TarIndex],
        classes: Sequence[str],
        indices: np.ndarray | None = None,
        storage_options: Mapping[str, Any] | None = None,
        labelled: bool = True,
        entropy_indexes: Any = None,
        block_bytes: int | None = None,
        shuffle_buffer: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.entropy_indexes = entropy_indexes
        self.shards = list(shards)
        self._classes = tuple(str(c) for c in classes)
        counts = [len(s) for s in self.shards]
        if not sum(counts):
            raise InvalidValueError(f"The shards {[s.path for s in self.shards][:3]} hold no sample.")
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows = np.arange(self._starts[-1]) if indices is None else np.asarray(indices, dtype=np.int64)
        self._rows = rows  # each sample's number among all the shards' samples
        self._shard_of = np.repeat(np.arange(len(self.shards), dtype=np.int32), counts)[rows]
        self._offsets = np.concatenate([s.offsets for s in self.shards])[rows]
        self._sizes = np.concatenate([s.sizes for s in self.shards])[rows]
        labels = np.concatenate([s.labels for s in self.shards])[rows]
        self._targets = shard_targets(labels, self._classes, labelled, self.describe)
        self._fds: dict[int, int] | None = None
        self._storage: Any = bucket_storage([s.path for s in self.shards], storage_options, "shards")
        if self._storage is not None:
            self._keys = [split_url(s.path)[1] for s in self.shards]
        #: Whether samples are read in runs of members (:class:`~lightning_fastdata.datasets.group_reads.GroupReads`).
        self.block_reads = self._storage is not None and block_bytes is not None
        #: The training order that reads whole runs (the loader's sampler takes it), or ``None``.
        self.windows = None
        # runs of members: a window's are requested several batches ahead; one request a member: the next batch's
        self.read_ahead_batches = GroupReads.read_ahead_batches if self.block_reads else 1
        if self.block_reads:
            assert block_bytes is not None
            self._blocks(block_bytes)
            self.windows = None if shuffle_buffer is None else self.group_windows(shuffle_buffer)

    def _blocks(self, block_bytes: int) -> None:
        """Cut each shard into runs of consecutive members of about ``block_bytes`` each.

        Sets each sample's run (numbered over all shards) and each run's byte range.
        """
        if block_bytes < 1:
            raise InvalidValueError(f"block_bytes should be a positive size in bytes or None, got {block_bytes!r}.")
        spans = (np.column_stack([s.offsets, s.offsets + s.sizes]) for s in self.shards)
        group_of, self._group_start, self._group_end = cut_runs(spans, block_bytes)
        self._group_of = group_of[self._rows]

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, in label order."""
        return self._classes

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label (int64), shard after shard."""
        return self._targets

    def describe(self, index: int) -> str:
        """``shard.tar:key`` of sample ``index``."""
        s = int(self._shard_of[index])
        shard = self.shards[s]
        return f"{shard.path}:{shard.keys[int(self._rows[index]) - int(self._starts[s])]}"

    def make_identity(self) -> DataIdentity:
        """Each sample's shard, key and label, and each shard's size, in this order."""
        names = np.concatenate(
            [
                mix(np.array([string_hash(k) for k in shard.keys], dtype=np.uint64))
                ^ np.uint64(string_hash(os.path.basename(shard.path)))
                for shard in self.shards
            ]
        )
        samples = label_hashes(self._targets) ^ mix(names[self._rows])
        sizes = "|".join(str(s.size) for s in self.shards)
        return DataIdentity.of(self.shards[0].path, samples, "tar|" + "/".join(self._classes) + "|" + sizes)

    def _fd(self, s: int) -> int:
        self._kept()  # this process's own handles (reset_groups after a fork)
        assert self._fds is not None
        fd = self._fds.get(s)
        if fd is None:
            shard = self.shards[s]
            fd = os.open(shard.path, os.O_RDONLY)
            try:
                shard.check_unchanged(os.fstat(fd))
            except Exception:
                os.close(fd)
                raise
            self._fds[s] = fd
        return fd

    @property
    def reads_ahead(self) -> bool:
        """Whether the next batch's members are requested while this one decodes (shards in a bucket)."""
        return self._storage is not None

    def reset_groups(self) -> None:
        """Forget the kept runs and the open shards (a process of its own)."""
        super().reset_groups()
        self._fds = {}

    def group_calls(self, firsts: Sequence[int]) -> tuple[Any, list[tuple[Any, ...]]]:
        """:func:`~lightning_fastdata.loading.storage.ranged.read_remote_range` of each sample's run."""
        calls = []
        for i in firsts:
            shard, g = self.shards[int(self._shard_of[i])], int(self._group_of[i])
            remote = RemoteShard(shard.path, shard.size, shard.mtime_ns)
            calls.append((remote, int(self._group_start[g]), int(self._group_end[g])))
        return read_remote_range, calls

    def sample_bytes(self, group: Any, index: int) -> bytes:
        """The member's bytes, cut from its run's (``group``: the run's first byte and its bytes)."""
        start, data = group
        at = int(self._offsets[index]) - start
        return bytes(data[at : at + int(self._sizes[index])])

    def _requests(self, indices: np.ndarray) -> tuple[list[str], list[tuple[int, int]]]:
        shard = self._shard_of[indices]
        keys = [self._keys[s] for s in shard.tolist()]
        starts = self._offsets[indices]
        return keys, list(zip(starts.tolist(), (starts + self._sizes[indices]).tolist()))

    def read_ahead(self, indices: np.ndarray) -> None:
        """Start the ranged requests of ``indices`` (this worker's next batch) now (shards in a bucket)."""
        if self.block_reads and not self._scattered(indices):
            self.read_groups_ahead(indices)
        elif self._storage is not None:  # one request a member: the next batch's alone (read_many matches them)
            self._storage.read_ahead(*self._requests(indices))

    def _scattered(self, indices: np.ndarray) -> bool:
        """Whether ``indices`` lie in so many runs not at hand that one request per member is cheaper.

        So it is for a full shuffle, weighted draws or a mix; a window of runs reads each run once.
        """
        return 2 * len(self._missing(indices)) > len(indices)

    def _read_remote(self, indices: np.ndarray) -> Iterator[Source]:
        keys, ranges = self._requests(indices)
        versions = [self.shards[s].mtime_ns for s in self._shard_of[indices].tolist()]

        def changed(k: int) -> None:
            shard = self.shards[int(self._shard_of[indices[k]])]
            raise DataError(
                f"The shard {shard.path!r} changed after it was indexed (another size or ETag): its samples would be "
                "read at the wrong places. Restart to index it again, and do not rewrite shards while they are read."
            )

        return self._storage.read_many(keys, versions, changed, ranges)  # decoded as they arrive

    def read_sources(self, indices: np.ndarray) -> list[Source] | Iterator[Source]:
        """Each sample's image bytes, one ``pread`` (or ranged request) each; an ``OSError`` where a read fails."""
        if self.block_reads and not self._scattered(indices):
            return list(self.read_grouped(indices))
        if self._storage is not None:
            return self._read_remote(indices)
        out: list[Source] = []
        for i in indices.tolist():
            try:
                data = os.pread(self._fd(int(self._shard_of[i])), int(self._sizes[i]), int(self._offsets[i]))
            except DataError:
                raise  # a shard that is not the one indexed: never read, never skipped
            except OSError as err:
                out.append(err)
                continue
            out.append(data if len(data) == self._sizes[i] else OSError(f"{self.describe(i)}: short read"))
        return out
