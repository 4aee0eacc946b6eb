"""A sampler that shards across ranks and tells the dataset which epoch each index belongs to."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

__all__ = ["BatchLookahead", "EpochSampler", "SampleKey"]

#: What :class:`EpochSampler` yields: ``(epoch, index)``. Datasets derive a sample's random augmentation
#: from ``(seed, epoch, index)``, so it depends neither on the worker count nor on prefetch depth.
SampleKey = tuple[int, int]


class EpochSampler(DistributedSampler):
    """Shuffle (or not) and shard ``range(length)`` across ranks; yield ``(epoch, index)`` keys.

    It subclasses ``DistributedSampler`` so that Lightning does not replace it with its own under DDP
    (``use_distributed_sampler`` only injects one when the loader's sampler is not a
    ``DistributedSampler``). Like torch's, it pads ranks to equal length unless ``drop_last``.

    Args:
        length: Number of samples in the dataset.
        num_replicas: World size (1 without DDP).
        rank: This process's global rank.
        shuffle: Draw a new permutation every epoch from ``seed + epoch``.
        seed: Seed of the permutations; the same on every rank.
        drop_last: Drop the tail instead of padding so that every rank gets the same count.
        block_size: Shuffle blocks of this many consecutive indices instead of single indices, and give each
            rank whole runs of blocks: reads become sequential (good for network or spinning storage, and for
            chunked HDF5), at the price of randomness: a batch holds neighbours from one or two blocks, so
            batch statistics are less mixed. ``None`` (default) shuffles fully.
    """

    def __init__(
        self,
        length: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        block_size: int | None = None,
    ) -> None:
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size should be a positive int or None, got {block_size!r}.")
        if length <= 0:
            raise ValueError(f"EpochSampler needs a non-empty dataset, got length={length!r}.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank should be in [0, {num_replicas - 1}], got rank={rank!r}.")
        # DistributedSampler only reads len(dataset); a range stands in for the dataset.
        super().__init__(
            range(length),  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,  # type: ignore[arg-type]
            drop_last=drop_last,
        )
        self.length = length
        self.block_size = block_size
        self.yielded = 0  # keys handed out by the current iteration
        self._resume_at: int | None = None  # set by load_state_dict: where the next iteration starts

    def indices(self) -> torch.Tensor:
        """This rank's indices for the current epoch, in order."""
        if self.shuffle and self.block_size:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            starts = torch.randperm(-(-self.length // self.block_size), generator=gen) * self.block_size
            order = torch.cat([torch.arange(s, min(s + self.block_size, self.length)) for s in starts.tolist()])
        elif self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=gen)
        else:
            order = torch.arange(self.length)
        if self.drop_last:
            order = order[: self.total_size]
        elif self.total_size > self.length:
            order = torch.cat([order, order[: self.total_size - self.length]])
        if self.block_size:  # contiguous runs per rank keep reads sequential
            return order[self.rank * self.num_samples : (self.rank + 1) * self.num_samples]
        return order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[SampleKey]:  # type: ignore[override]
        epoch, start = self.epoch, self._resume_at or 0
        self._resume_at = None
        self.yielded = start
        for i in self.indices()[start:].tolist():
            self.yielded += 1
            yield epoch, i

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; nothing of the new epoch has been yielded yet."""
        if epoch != self.epoch:
            self.yielded = 0
        super().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position: the permutation is a function of ``seed`` and ``epoch``, so this is all of it."""
        return {"epoch": self.epoch, "seed": self.seed, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` was taken: same epoch, the next iteration skips what was yielded.

        Raises:
            ValueError: If the state was saved with another seed (it would describe another permutation).
        """
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"Sampler state was saved with seed={state['seed']!r}, this sampler has seed={self.seed!r}."
            )
        yielded = int(state.get("yielded", 0))
        # A state saved after the last batch of an epoch resumes with the *next* epoch's permutation, even if
        # the loader's iterator (and its workers' index prefetch) starts before Lightning calls set_epoch
        # (Lightning #21938: with num_workers > 0 the first resumed epoch reused the old permutation).
        finished = yielded >= self.num_samples
        self.epoch = int(state["epoch"]) + (1 if finished else 0)
        self._resume_at = yielded if 0 < yielded < self.num_samples else None


class BatchLookahead:
    """Which samples a loader worker gets next, from the batch it was just given: to fetch them ahead.

    A loader with ``in_order=True`` hands batches to its ``W`` workers in turn, so a worker that got the batch
    at position ``p`` of the epoch's order gets the one at ``p + W x batch`` next; the order is a function of
    the sampler's seed and the epoch (in the keys), so a worker computes it from its own copy of the sampler.
    A guess that does not match (another loader policy, a resumed or padded epoch) returns ``None``: the guess
    only starts fetches early, it never decides what a batch holds.
    """

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = copy.copy(sampler)
        self._epoch: int | None = None
        self._order = np.zeros(0, dtype=np.int64)
        self._position = np.zeros(0, dtype=np.int64)

    def after(self, keys: Sequence[Any], num_workers: int) -> np.ndarray | None:
        """The indices of this worker's next batch after ``keys`` (``(epoch, index)`` pairs), or ``None``."""
        if not keys or not isinstance(keys[0], (tuple, list)) or num_workers < 1:
            return None
        epoch = int(keys[0][0])
        if epoch != self._epoch:
            self.sampler.epoch = epoch
            self._order = self.sampler.indices().numpy().astype(np.int64)
            self._position = np.full(self.sampler.length, -1, dtype=np.int64)
            self._position[self._order] = np.arange(len(self._order))  # padding repeats: verified below
            self._epoch = epoch
        n = len(keys)
        got = np.fromiter((int(k[1]) for k in keys), dtype=np.int64, count=n)
        if not 0 <= got[0] < len(self._position):
            return None
        start = int(self._position[got[0]])
        if start < 0 or not np.array_equal(self._order[start : start + n], got):
            return None
        nxt = self._order[start + num_workers * n : start + (num_workers + 1) * n]
        return nxt if len(nxt) else None
