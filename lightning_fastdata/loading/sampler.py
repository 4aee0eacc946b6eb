"""A sampler that shards across ranks and tells the dataset which epoch each index belongs to."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from lightning_fastdata.loading.sampling import EpochDraws, describe_change

__all__ = ["BatchLookahead", "EpochSampler", "SampleKey", "ShuffleWindows", "classes_per_batch", "window_mix"]

#: What :class:`EpochSampler` yields: ``(epoch, index)``, or ``(epoch, index, repeat)`` with repeated augmentation.
#: Datasets derive a sample's random augmentation from ``(seed, epoch, index, repeat)``, so it depends neither on the
#: worker count nor on prefetch depth.
SampleKey = tuple[int, int] | tuple[int, int, int]


class ShuffleWindows:
    """Read groups (a Parquet file's row groups) shuffled in windows: an order that reads each group in one piece.

    Each epoch puts the groups in a random order, cuts that order into windows of ``window`` groups, and shuffles
    the samples of each window together (a uniform permutation within it). A batch then draws from the groups of
    one window (or two), so a reader that holds one window's groups reads each group once, and the samples of
    ``window`` groups mix in every batch: webdataset's shuffle buffer, but a permutation, so every sample comes
    exactly once an epoch and a position is the whole state of a resume.

    Args:
        starts: Each group's first sample (ascending, from 0).
        window: Groups per window (at least 1).
    """

    def __init__(self, starts: np.ndarray, window: int) -> None:
        starts = np.asarray(starts, dtype=np.int64)
        if starts.ndim != 1 or not starts.size or starts[0] != 0 or np.any(np.diff(starts) <= 0):
            raise ValueError("ShuffleWindows needs the groups' first samples, ascending from 0.")
        if window < 1:
            raise ValueError(f"window should be a positive number of groups, got {window!r}.")
        self.starts, self.window = starts, int(window)

    @property
    def identity(self) -> str:
        """The groups and the window, which the order depends on (a resume must find the same)."""
        digest = hashlib.sha256(self.starts.tobytes()).hexdigest()[:16]
        return f"windows:{self.window}:{len(self.starts)}:{digest}"

    def order(self, length: int, gen: torch.Generator) -> torch.Tensor:
        """The epoch's permutation of ``range(length)`` drawn from ``gen``."""
        ends = np.append(self.starts[1:], length)
        groups = torch.randperm(len(self.starts), generator=gen).numpy()
        sizes = (ends - self.starts)[groups]
        first = np.repeat(self.starts[groups] - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
        positions = np.arange(length, dtype=np.int64) + first  # the groups' samples, group after group
        window_of = np.repeat(np.arange(len(groups)) // self.window, sizes)
        noise = torch.rand(length, generator=gen, dtype=torch.float64).numpy()
        return torch.from_numpy(positions[np.lexsort((noise, window_of))])


def classes_per_batch(targets: np.ndarray, order: np.ndarray, batch_size: int) -> float:
    """The mean number of distinct classes in the batches of ``batch_size`` that ``order`` makes of ``targets``."""
    whole = len(order) // batch_size * batch_size
    if not whole:
        return float(len(np.unique(targets[order])))
    batches = np.sort(np.asarray(targets)[order[:whole]].reshape(-1, batch_size), axis=1)
    return float(((np.diff(batches, axis=1) != 0).sum(axis=1) + 1).mean())


def window_mix(
    windows: ShuffleWindows, targets: np.ndarray, batch_size: int, seed: int = 0, samples: int = 200_000
) -> tuple[float, float]:
    """Classes per batch in ``windows``' order and in a full shuffle of the same ``targets``.

    One epoch's order, up to ``samples`` of it: how much the windows, over shards written class after class, narrow
    each batch.
    """
    gen = torch.Generator().manual_seed(seed)
    windowed = windows.order(len(targets), gen).numpy()[:samples]
    full = torch.randperm(len(targets), generator=gen).numpy()[:samples]
    return classes_per_batch(targets, windowed, batch_size), classes_per_batch(targets, full, batch_size)


class EpochSampler(DistributedSampler):
    """Shuffle (or not) and shard ``range(length)`` across ranks; yield ``(epoch, index)`` keys.

    It subclasses ``DistributedSampler`` so that Lightning does not replace it with its own under DDP
    (``use_distributed_sampler`` only injects one when the loader's sampler is not a
    ``DistributedSampler``). Like torch's, it pads ranks to equal length unless ``drop_last`` (training), or, with
    ``even=False`` (evaluation), gives every sample to exactly one rank and lets the shares differ by one.

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
        repeats: Repeated augmentation (torchvision's ``RASampler``, ``--ra-reps``): each sample appears this many
            times in the epoch's order, the repeats side by side, so that they go to consecutive ranks (or, on one
            rank, into one batch) and each gets its own augmentation (keys ``(epoch, index, repeat)``). An epoch keeps
            its length: each rank yields ``len(self)`` keys, as without repeats (torchvision's rounds that down to a
            multiple of 256 samples in all; ours does not). With ``block_size`` or ``windows`` the ranks then take
            every ``num_replicas``-th entry instead of contiguous runs, so the repeats still reach different ranks
            (each rank reads every block or window: the reads a rank saves by its own runs are given up). 1: off.
        even: Every rank gets the same count (padded with the epoch's first samples, or cut with ``drop_last``): what
            training under DDP needs. ``False``: every sample exactly once over all ranks, rank ``r`` taking every
            ``num_replicas``-th from ``r`` (the first ``length % num_replicas`` ranks one more): what evaluation needs,
            so that metrics over N ranks equal one rank's (a padded shard counts its repeated samples twice).
        draws: What each epoch draws instead of one permutation of ``range(length)`` (weights, ``epoch_size``, a
            subset: :class:`~lightning_fastdata.loading.sampling.EpochDraws`, a function of ``(seed, epoch)``); an
            epoch is then ``draws.size`` samples, sharded, resumed and continued on another world size like a plain
            one. Where a sample may be drawn twice, ``repeat`` numbers the draws (``position x repeats + r``), so every
            draw has its own key and augmentation.
        windows: Shuffle within windows of read groups
            (:class:`~lightning_fastdata.loading.sampler.ShuffleWindows`) instead of fully, each rank taking a
            contiguous run of the order (its own windows); ``None``: a full shuffle. Like ``block_size``, it shapes a
            training epoch only and is part of the state a resume checks.
        groups: A group per dataset sample (an image's aspect-ratio bin, torchvision's ``GroupedBatchSampler``):
            each rank's share of a shuffled epoch is reordered so that every run of ``group_size`` keys (a batch) is
            of one group, taken in the order a group's samples fill up (the first ``group_size`` of a group in the
            share make its first batch); the samples left in groups' unfilled batches close the epoch, in the share's
            order (at most one mixed batch per group). Every sample stays exactly once and every rank its equal
            count; part of the state a resume checks. ``None``: off.
        group_size: The batch size the groups fill.

    Raises:
        ValueError: On an impossible argument (named), e.g. ``even=False`` with ``drop_last`` or ``repeats``.
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
        repeats: int = 1,
        even: bool = True,
        draws: EpochDraws | None = None,
        windows: ShuffleWindows | None = None,
        groups: np.ndarray | None = None,
        group_size: int = 1,
    ) -> None:
        if groups is not None and (len(groups) != length or group_size < 1):
            raise ValueError(f"groups should give each of {length} samples a group and group_size be positive, got "
                             f"{len(groups)} groups and group_size={group_size!r}.")  # fmt: skip
        if windows is not None and (block_size is not None or draws is not None or not even):
            raise ValueError("windows shapes a plain training epoch: it takes no block_size, draws or even=False.")
        if draws is not None and block_size is not None:
            raise ValueError(
                "block_shuffle reads runs of neighbouring samples; with sample_weights, epoch_size or a subset an "
                "epoch draws samples one by one: use one or the other."
            )
        if not even and (drop_last or repeats != 1 or block_size is not None):
            raise ValueError(
                "even=False (every sample once, for evaluation) takes no drop_last, repeats or block_size: those "
                f"shape training epochs; got drop_last={drop_last!r}, repeats={repeats!r}, block_size={block_size!r}."
            )
        if repeats < 1:
            raise ValueError(f"repeats should be a positive int (1: off), got {repeats!r}.")
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size should be a positive int or None, got {block_size!r}.")
        if length <= 0:
            raise ValueError(f"EpochSampler needs a non-empty dataset, got length={length!r}.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank should be in [0, {num_replicas - 1}], got rank={rank!r}.")
        #: The dataset's length; an epoch draws ``length`` samples (``draws.size`` with draws).
        self.dataset_length = length
        self.draws = draws
        length = length if draws is None else draws.size
        self._drawn: tuple[int, np.ndarray] | None = None  # (epoch, its draws)
        # DistributedSampler only reads len(dataset); a range stands in for the dataset.
        super().__init__(
            range(length),  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.length = length
        self.block_size = block_size
        self.windows = windows if shuffle else None
        self.groups = np.asarray(groups, dtype=np.int64) if groups is not None and shuffle and even else None
        self.group_size = group_size
        self.repeats = repeats
        #: How many entries one epoch's order has (each sample ``repeats`` times, as ``index * repeats + repeat``).
        self.slots = length * repeats
        self.even = even
        if not even:  # this rank's own share, unpadded
            self.num_samples = len(range(rank, length, num_replicas))
            self.total_size = length
        self.yielded = 0  # keys handed out by the current iteration
        self._resume_at: int | None = None  # set by load_state_dict: where the next iteration starts
        # continue_epoch: the samples of epoch _consumed_epoch consumed before this run (not yielded again)
        self._consumed: np.ndarray | None = None
        self._consumed_epoch: int | None = None
        self._consumed_packed = b""

    def drawn(self, epoch: int | None = None) -> np.ndarray:
        """With ``draws``: the epoch's dataset indices in order; computed once per epoch."""
        epoch = self.epoch if epoch is None else epoch
        assert self.draws is not None
        if self._drawn is None or self._drawn[0] != epoch:
            self._drawn = (epoch, self.draws.draw(self.seed, epoch))
        return self._drawn[1]

    def epoch_order(self, epoch: int | None = None) -> torch.Tensor:
        """The whole permutation of ``range(length)`` for ``epoch`` (default: the current one), before sharding.

        With ``draws``, the positions in the epoch's draws (already in random order): ``0 ... draws.size - 1``.
        """
        epoch = self.epoch if epoch is None else epoch
        if self.draws is not None:
            order = torch.arange(self.length)
        elif self.shuffle and self.block_size:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            starts = torch.randperm(-(-self.length // self.block_size), generator=gen) * self.block_size
            order = torch.cat([torch.arange(s, min(s + self.block_size, self.length)) for s in starts.tolist()])
        elif self.windows is not None:
            order = self.windows.order(self.length, torch.Generator().manual_seed(self.seed + epoch))
        elif self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.length, generator=gen)
        else:
            order = torch.arange(self.length)
        if self.repeats == 1:
            return order
        return (order.view(-1, 1) * self.repeats + torch.arange(self.repeats)).flatten()

    def indices(self) -> torch.Tensor:
        """This rank's indices for the current epoch, in order.

        In an epoch continued with :meth:`continue_epoch`, the samples not yet consumed, in the permutation's
        order, split over this sampler's ranks as a whole epoch is (equal counts: padded from the epoch's start,
        or cut with ``drop_last``).
        """
        order = self.epoch_order()
        left = order
        continued = self._consumed is not None and self._consumed_epoch == self.epoch
        if continued:
            left = order[~torch.from_numpy(self._consumed)[order]]
        share = self._shard(left, order, self.num_replicas, self.rank)
        if self.repeats > 1:  # an epoch of `length` samples in all, however many repeats
            total = max(0, self.length - (int(self._consumed.sum()) if continued else 0))  # type: ignore[union-attr]
            per_rank = total // self.num_replicas if self.drop_last else -(-total // self.num_replicas)
            share = share[:per_rank]
        return share if self.groups is None else self._grouped(share)

    def _grouped(self, share: torch.Tensor) -> torch.Tensor:
        """``share`` reordered into batches of one group each (``groups``), the unfilled ones' samples last."""
        slots = share.numpy()
        index = slots // self.repeats
        if self.draws is not None:
            index = self.drawn()[index]
        assert self.groups is not None
        pending: dict[int, list[int]] = {}
        batched, placed = [], np.zeros(len(slots), dtype=bool)
        for k, group in enumerate(self.groups[index].tolist()):
            run = pending.setdefault(group, [])
            run.append(k)
            if len(run) == self.group_size:
                batched += run
                placed[run] = True
                run.clear()
        positions = np.concatenate([np.asarray(batched, dtype=np.int64), np.flatnonzero(~placed)])
        return share[torch.from_numpy(positions)]

    def _shard(self, left: torch.Tensor, order: torch.Tensor, replicas: int, rank: int) -> torch.Tensor:
        """``rank``'s share of ``left``, cut or padded to a multiple of ``replicas``.

        Cut with ``drop_last``, else padded with ``order``'s first samples; contiguous runs with block shuffle (reads
        stay sequential), every ``replicas``-th sample otherwise.
        """
        if not self.even:
            return left[rank::replicas]
        if self.drop_last:
            left = left[: len(left) - len(left) % replicas]
        elif len(left) % replicas:
            pad = replicas - len(left) % replicas
            left = torch.cat([left, order.repeat(-(-pad // len(order)))[:pad]])
        per_rank = len(left) // replicas
        if (self.block_size or self.windows is not None) and self.repeats == 1:
            return left[rank * per_rank : (rank + 1) * per_rank]
        return left[rank::replicas]  # with repeats, a sample's repeats (side by side) go to consecutive ranks

    def epoch_length(self) -> int:
        """How many keys this rank yields in the current epoch (fewer than ``len(self)`` in a continued epoch)."""
        if self._consumed is not None and self._consumed_epoch == self.epoch:
            return len(self.indices())
        return self.num_samples

    def consumed_mask(self, positions: Sequence[int], epoch: int, mask: np.ndarray | None = None) -> np.ndarray:
        """The samples of ``epoch`` consumed by ranks at ``positions`` (keys yielded by each rank, in rank order).

        The world those positions come from is ``len(positions)`` ranks of this sampler's kind (same length,
        seed, shuffle, ``drop_last`` and block size); ``mask``: what had been consumed before that world's
        ranks started the epoch (an epoch already continued once), else nothing.
        """
        other = copy.copy(self)
        other.num_replicas = len(positions)
        other.num_samples = (
            self.length // other.num_replicas if self.drop_last else -(-self.length // other.num_replicas)
        )
        other.total_size = other.num_samples * other.num_replicas
        other.epoch, other._consumed_epoch, other._consumed = epoch, epoch, mask
        consumed = np.zeros(self.slots, dtype=bool) if mask is None else mask.copy()
        for rank, taken in enumerate(positions):
            other.rank = rank
            consumed[other.indices()[: int(taken)].numpy()] = True
        return consumed

    def continue_epoch(self, epoch: int, consumed: np.ndarray) -> None:
        """Make ``epoch`` yield only the samples ``consumed`` (a bool mask over the dataset) does not mark.

        Every rank calls it with the same mask (what every rank of the interrupted world had consumed) and gets
        an equal share of the rest; the following epochs are whole again.
        """
        if consumed.shape != (self.slots,):
            raise ValueError(f"consumed should be a mask of {self.slots} samples, got shape {consumed.shape}.")
        self._consumed, self._consumed_epoch = consumed.astype(bool), int(epoch)
        self._consumed_packed = np.packbits(self._consumed).tobytes()
        self.epoch, self.yielded, self._resume_at = int(epoch), 0, None

    def __iter__(self) -> Iterator[SampleKey]:
        epoch, start = self.epoch, self._resume_at or 0
        self._resume_at = None
        self.yielded = start
        r = self.repeats
        if self.draws is not None:
            drawn, numbered = self.drawn(epoch), self.draws.repeats_samples
            for slot in self.indices()[start:].tolist():
                self.yielded += 1
                position, repeat = divmod(slot, r)
                index = int(drawn[position])
                if numbered:  # a sample drawn again: another key, another augmentation
                    yield (epoch, index, slot)
                else:
                    yield (epoch, index) if r == 1 else (epoch, index, repeat)
            return
        for i in self.indices()[start:].tolist():
            self.yielded += 1
            yield (epoch, i) if r == 1 else (epoch, i // r, i % r)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; nothing of the new epoch has been yielded yet."""
        if epoch != self.epoch:
            self.yielded = 0
        super().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position: the permutation is a function of ``seed`` and ``epoch``, so this is all of it.

        In an epoch continued with :meth:`continue_epoch`, also the samples consumed before it (a packed bit mask,
        ``length / 8`` bytes): this rank's order is a function of them too.
        """
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "seed": self.seed,
            # a loaded position not yet iterated is the position still (a state taken between load and iteration)
            "yielded": self.yielded if self._resume_at is None else self._resume_at,
            "length": self.dataset_length,
        }
        if self.draws is not None:
            state["draws"] = dict(self.draws.identity)
        if self.repeats > 1:
            state["repeats"] = self.repeats
        state["order"] = self._order_identity()
        if self._consumed is not None and self._consumed_epoch == self.epoch:
            state["consumed"] = self._consumed_packed
        return state

    def _order_identity(self) -> str:
        """How an epoch's order is drawn, beyond the seed: ``shuffle`` (full), blocks, windows, or in order."""
        if not self.shuffle:
            return "in order"
        grouped = ""
        if self.groups is not None:
            digest = hashlib.sha256(self.groups.tobytes()).hexdigest()[:12]
            grouped = f"+groups:{digest}:{self.group_size}"
        if self.block_size:
            return f"blocks:{self.block_size}{grouped}"
        return ("shuffle" if self.windows is None else self.windows.identity) + grouped

    def check_compatible(self, state: dict[str, Any]) -> None:
        """Raise if ``state`` describes another permutation: saved with another seed, order or dataset length.

        Raises:
            ValueError: Naming both values and what to do.
        """
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"Sampler state was saved with seed={state['seed']!r}, this sampler has seed={self.seed!r}: resume "
                "with the checkpoint's seed, or start without ckpt_path."
            )
        if int(state.get("repeats", 1)) != self.repeats:
            raise ValueError(
                f"Sampler state was saved with repeats={state.get('repeats', 1)!r} (repeated_augmentations), this "
                f"sampler has repeats={self.repeats!r}: resume with the checkpoint's setting, or start without "
                "ckpt_path."
            )
        if "order" in state and state["order"] != self._order_identity():  # (older states have none)
            raise ValueError(
                f"Sampler state was saved with another order ({state['order']!r}, now "
                f"{self._order_identity()!r}: block_shuffle, shuffle_buffer or the read groups changed): its positions "
                "describe another order. Resume with the checkpoint's settings, or start without ckpt_path."
            )
        saved, now = state.get("draws") or {}, {} if self.draws is None else self.draws.identity
        changed = describe_change(saved, now)
        if changed is not None:
            raise ValueError(
                f"Sampler state was saved with other sampling settings ({changed} changed): the checkpoint's "
                "positions describe other draws. Resume with the checkpoint's settings, or start without ckpt_path."
            )
        if int(state.get("length", self.dataset_length)) != self.dataset_length:
            raise ValueError(
                f"Sampler state was saved for a dataset of {state['length']} samples, this one has "
                f"{self.dataset_length}: "
                "the checkpoint's positions do not describe this dataset. Resume on the same data, or start without "
                "ckpt_path (or load the model weights alone)."
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` was taken: same epoch, the next iteration skips what was yielded.

        Raises:
            ValueError: If the state was saved with another seed (it would describe another permutation).
        """
        self.check_compatible(state)
        yielded = int(state.get("yielded", 0))
        if state.get("consumed"):
            bits = np.frombuffer(state["consumed"], dtype=np.uint8)
            self.continue_epoch(int(state["epoch"]), np.unpackbits(bits, count=self.slots).astype(bool))
        # A state saved after the last batch of an epoch resumes with the *next* epoch's permutation, even if
        # the loader's iterator (and its workers' index prefetch) starts before Lightning calls set_epoch
        # (Lightning #21938: with num_workers > 0 the first resumed epoch reused the old permutation).
        self.epoch = int(state["epoch"])
        length = self.epoch_length()
        if yielded >= length:
            self.epoch += 1
        self._resume_at = yielded if 0 < yielded < length else None


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

    def after(self, keys: Sequence[Any], num_workers: int, depth: int = 1) -> np.ndarray | None:
        """The indices of this worker's next batch after ``keys`` (``(epoch, index)`` pairs), or ``None``.

        ``depth``: its next ``depth`` batches', in order (a reader of whole groups starts a window's early).
        """
        if not keys or not isinstance(keys[0], (tuple, list)) or num_workers < 1 or self.sampler.repeats > 1:
            return None  # with repeats a sample is in the order several times: no guess
        if self.sampler.draws is not None:
            return None  # the order is of draws, not of samples: no guess
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
        step = num_workers * n
        nxt = np.concatenate([self._order[start + k * step : start + k * step + n] for k in range(1, depth + 1)])
        return nxt if len(nxt) else None
