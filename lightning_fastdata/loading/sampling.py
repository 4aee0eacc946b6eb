"""What an epoch draws: sample weights, a fixed epoch size, subsets of the samples.

:class:`SamplingSettings` holds a DataModule's arguments (validated when it is made); for a dataset's labels it
makes a :class:`Subset` (which samples take part, and their labels renumbered) and :class:`EpochDraws` (which
samples each epoch draws), which :class:`~lightning_fastdata.loading.sampler.EpochSampler` shuffles, shards over
the ranks and resumes like a plain epoch.

**Draws are a function of ``(seed, epoch)`` only**: with replacement, ``epoch_size`` independent draws from the
weights (inverse transform: a uniform number per draw, located in the weights' cumulative sum); without
replacement, the weighted random order of Efraimidis and Spirakis (each sample's key ``u ** (1 / w)``, the largest
``epoch_size`` keys in descending order); without weights, whole random permutations of the samples, one after the
other, cut at ``epoch_size``, or with ``replacement=True`` said (no weights) independent uniform draws (open_clip's
``--dataset-resampled``, by sample). A sample drawn twice in an epoch gets two keys (the sampler numbers the draws by
position), so it is augmented twice, differently. The docs' Sampling page has the cost at 1.28M and 10M samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_fastdata.errors import InvalidValueError

__all__ = [
    "EpochDraws",
    "SampleWeights",
    "REPEAT_FACTOR_THRESHOLD",
    "SamplingSettings",
    "Subset",
    "describe_change",
    "map_labels",
    "occurrences",
]

#: ``sample_weights``: ``"balanced"`` (inverse class frequency), ``"repeat_factor"`` (LVIS' repeat factors, for
#: several classes per sample: :data:`REPEAT_FACTOR_THRESHOLD`), a mapping class name -> weight, one weight per
#: training sample, or a callable of a sample's label (an int, or a multi-hot row) -> its weight.
SampleWeights = str | Mapping[str, float] | Sequence[float] | Callable[[Any], float]

#: ``sample_weights="repeat_factor"``: LVIS' threshold ``t`` (detectron2's ``REPEAT_THRESHOLD``): a class in a fraction
#: ``f`` of the images gets the factor ``max(1, sqrt(t / f))``, an image its classes' largest (1 without a class).
REPEAT_FACTOR_THRESHOLD = 0.001

#: Draws are made this many at a time (bounded memory at 10M samples).
_CHUNK = 1 << 20


def _digest(array: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Subset:
    """The samples of a split that take part, and their labels in the (possibly smaller) class list.

    Attributes:
        rows: Dataset indices that take part, sorted; ``None``: all.
        classes: The class list after the subset (``classes=`` in its order, else the dataset's).
        label_map: Maps a dataset label to the new one: an ``int64`` lookup (``-1`` for a class left out) for
            class positions, or the columns kept (in the new order) for multi-hot rows; ``None``: unchanged.
    """

    rows: np.ndarray | None
    classes: tuple[str, ...]
    label_map: np.ndarray | None = None

    def map_labels(self, labels: np.ndarray) -> np.ndarray:
        """``labels`` (a batch's, as the dataset has them) in the subset's class list."""
        return map_labels(labels, self.label_map)


def map_labels(labels: np.ndarray, label_map: np.ndarray | None) -> np.ndarray:
    """``labels`` in another class list (``label_map``: :attr:`Subset.label_map`'s forms; ``None``: unchanged).

    Class positions are looked up in ``label_map``; multi-hot rows keep its columns, in its order.
    """
    if label_map is None:
        return labels
    return labels[:, label_map] if labels.ndim == 2 else label_map[labels]


@dataclass(frozen=True)
class EpochDraws:
    """Which dataset indices an epoch draws, in order: a function of ``(seed, epoch)`` (module docstring).

    Attributes:
        pool: The dataset indices that may be drawn (sorted), or ``None``: every index (``0 ... n - 1``).
        n: How many samples the pool holds.
        weights: Each pool entry's weight (float32, sum > 0): kept for draws without replacement; ``None`` otherwise.
        cdf: The weights' cumulative sum: kept for draws with replacement; ``None`` otherwise.
        size: Draws per epoch (``epoch_size``, else the pool's size).
        replacement: Weighted draws with replacement (each independent), else without.
        shuffle: Draw in random order; ``False``: the pool in order, repeated up to ``size`` (no weights).
        identity: What selects the draws, by name (the pool, weights, size, replacement), each as a short digest:
            a resume state carries it, and a change is refused naming the setting that changed.
    """

    pool: np.ndarray | None
    n: int
    weights: np.ndarray | None
    cdf: np.ndarray | None
    size: int
    replacement: bool
    shuffle: bool = True
    identity: dict[str, str] = field(default_factory=dict)

    @classmethod
    def in_order(cls, rows: np.ndarray) -> EpochDraws:
        """An evaluation epoch over ``rows`` (dataset indices): each once, in order."""
        rows = rows.astype(np.int64)
        return cls.of(rows, len(rows), None, len(rows), shuffle=False)

    @classmethod
    def of(
        cls,
        pool: np.ndarray | None,
        n: int,
        weights: np.ndarray | None,
        size: int,
        replacement: bool = True,
        shuffle: bool = True,
        identity: dict[str, str] | None = None,
    ) -> EpochDraws:
        """Draws over ``pool`` (``None``: ``range(n)``) with ``weights`` (``None``: uniform)."""
        cdf = np.cumsum(weights) if weights is not None and replacement else None
        kept = weights.astype(np.float32) if weights is not None and not replacement else None
        return cls(pool, n, kept, cdf, size, replacement, shuffle, dict(identity or {}))

    @property
    def repeats_samples(self) -> bool:
        """Whether an epoch may draw a sample more than once."""
        return self.cdf is not None or self.size > self.n

    def draw(self, seed: int, epoch: int) -> np.ndarray:
        """The epoch's dataset indices, in order (``size`` of them; int32 below 2**31 samples)."""
        rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch), 0x5A3C]))
        n = self.n
        dtype = np.int32 if n < 2**31 else np.int64
        if self.cdf is not None:  # with replacement: sorted uniforms located in the cdf, then shuffled
            positions = np.empty(self.size, dtype=dtype)
            spacings = rng.standard_exponential(self.size + 1)
            total = spacings.sum()
            offset = 0.0
            for start in range(0, self.size, _CHUNK):
                part = np.cumsum(spacings[start : min(start + _CHUNK, self.size)]) + offset
                offset = float(part[-1])
                u = part * (self.cdf[-1] / total)  # increasing: searchsorted walks the cdf once
                positions[start : start + len(u)] = np.minimum(np.searchsorted(self.cdf, u, side="right"), n - 1)
            del spacings
            rng.shuffle(positions)
        elif self.weights is not None:  # without replacement: Efraimidis-Spirakis keys, the largest first
            keys = rng.random(n, dtype=np.float32)
            with np.errstate(divide="ignore"):
                np.log(keys, out=keys)
                np.divide(keys, self.weights, out=keys)  # <= 0; weight 0: -inf, never before a positive weight
            np.negative(keys, out=keys)  # >= 0 (+inf for weight 0): the smallest first
            if self.size < n:
                top = np.argpartition(keys, self.size - 1)[: self.size]
                positions = top[np.argsort(keys[top], kind="stable")].astype(dtype)
            elif n < 2**32:
                # the order of the keys: their bits (monotone for floats >= 0) over each index, sorted as uint64
                # (numpy's vectorised sort: 10M in ~1 s against ~1.4 s for argsort); ties go by index
                packed = keys.view(np.uint32).astype(np.uint64) << np.uint64(32)
                packed |= np.arange(n, dtype=np.uint64)
                del keys
                packed.sort()
                positions = (packed & np.uint64(0xFFFFFFFF)).astype(dtype)
            else:
                positions = np.argsort(keys, kind="stable").astype(dtype)
        elif not self.shuffle:
            positions = np.resize(np.arange(n, dtype=dtype), self.size)
        else:
            rounds = -(-self.size // n)
            positions = np.concatenate([rng.permutation(n).astype(dtype) for _ in range(rounds)])[: self.size]
        return positions if self.pool is None else self.pool[positions].astype(dtype)


def occurrences(draws: np.ndarray) -> np.ndarray:
    """For each draw, how many earlier draws are the same index (0 for a first draw); vectorised."""
    order = np.argsort(draws, kind="stable")
    ordered = draws[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    run = np.repeat(starts, np.diff(np.r_[starts, len(draws)]))
    out = np.empty(len(draws), dtype=np.int64)
    out[order] = np.arange(len(draws)) - run
    return out


@dataclass(frozen=True)
class SamplingSettings:
    """A DataModule's sampling arguments, validated (each error names its argument); see ``FastDataModule``.

    Raises:
        ValueError: On an impossible value (named).
    """

    sample_weights: SampleWeights | None = None
    replacement: bool | None = None
    epoch_size: int | None = None
    classes: Sequence[str] | None = None
    max_per_class: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        w = self.sample_weights
        if isinstance(w, str) and w not in ("balanced", "repeat_factor"):
            raise InvalidValueError(
                f"sample_weights={w!r}: pass 'balanced', 'repeat_factor', a mapping class name -> weight, one weight "
                "per training sample, or a callable of the label."
            )
        if self.replacement is not None and not isinstance(self.replacement, bool):
            raise InvalidValueError(f"replacement should be True, False or None, got {self.replacement!r}.")
        if self.epoch_size is not None and (not isinstance(self.epoch_size, int) or self.epoch_size < 1):
            raise InvalidValueError(
                f"epoch_size should be a positive int (samples per epoch), got {self.epoch_size!r}."
            )
        if self.max_per_class is not None and (not isinstance(self.max_per_class, int) or self.max_per_class < 1):
            raise InvalidValueError(f"max_per_class should be a positive int, got {self.max_per_class!r}.")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise InvalidValueError(f"fraction should be in (0, 1] (of the training samples), got {self.fraction!r}.")
        if self.classes is not None:
            names = [str(c) for c in self.classes]
            if not names or len(set(names)) != len(names) or isinstance(self.classes, str):
                raise InvalidValueError(f"classes={self.classes!r} should be a list naming each class once.")

    def check_classes(self, classes: Sequence[str]) -> None:
        """Raise if ``classes=`` names a class the data (whose class names are ``classes``) does not have.

        Raises:
            ValueError: Naming the unknown classes and the data's.
        """
        unknown = [] if self.classes is None else [str(c) for c in self.classes if str(c) not in classes]
        if unknown:
            raise InvalidValueError(
                f"classes names {unknown} that the data does not have; its classes are {list(classes)[:20]}"
                f"{' ...' if len(classes) > 20 else ''}."
            )

    @property
    def subsets(self) -> bool:
        """Whether the settings take part of the samples (``classes``, ``max_per_class``, ``fraction``)."""
        return self.classes is not None or self.max_per_class is not None or self.fraction is not None

    @property
    def changes_draws(self) -> bool:
        """Whether the training epoch is anything but one permutation of every sample."""
        return self.subsets or self.sample_weights is not None or self.epoch_size is not None or self.resampled

    @property
    def resampled(self) -> bool:
        """Whether the epoch draws uniformly with replacement (``replacement=True`` said, no ``sample_weights``)."""
        return self.replacement is True and self.sample_weights is None

    def subset(self, targets: np.ndarray, classes: Sequence[str], train: bool, seed: int) -> Subset:
        """The samples of a split (``targets``: its labels) that take part; only ``classes`` for evaluation splits.

        Raises:
            ValueError: If ``classes`` names a class the data does not have, or a subset is empty (named).
        """
        classes = tuple(classes)
        multi = targets.ndim == 2
        keep = np.ones(len(targets), dtype=bool)
        label_map: np.ndarray | None = None
        new_classes = classes
        if self.classes is not None:
            self.check_classes(classes)
            wanted = [str(c) for c in self.classes]
            positions = np.array([classes.index(c) for c in wanted], dtype=np.int64)
            if multi:
                keep = np.asarray(targets[:, positions].any(axis=1), dtype=bool)
                label_map = positions
            else:
                label_map = np.full(len(classes), -1, dtype=np.int64)
                label_map[positions] = np.arange(len(positions))
                keep = np.asarray(label_map[targets] >= 0, dtype=bool)
            new_classes = tuple(wanted)
        if train and self.max_per_class is not None:
            if multi:
                raise InvalidValueError(
                    "max_per_class needs one label per sample; with several labels per sample a sample belongs to "
                    "several classes. Use fraction= for a smaller set."
                )
            order = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x3C1]).permutation(len(targets))
            order = order[keep[order]]
            labels = targets[order]
            rank = occurrences(labels)  # a sample's position among its class's, in the seeded order
            keep = np.zeros(len(targets), dtype=bool)
            keep[order[rank < self.max_per_class]] = True
        if train and self.fraction is not None and self.fraction < 1:
            candidates = np.flatnonzero(keep)
            count = max(1, int(round(len(candidates) * self.fraction)))
            chosen = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xF4A]).choice(candidates, count, replace=False)
            keep = np.zeros(len(targets), dtype=bool)
            keep[chosen] = True
        rows = np.flatnonzero(keep)
        if len(rows) == 0:
            raise InvalidValueError(
                f"The {'training' if train else 'evaluation'} split has no sample left after classes={self.classes!r}, "
                f"max_per_class={self.max_per_class!r}, fraction={self.fraction!r}."
            )
        return Subset(None if keep.all() else rows, new_classes, label_map)

    def draws(self, targets: np.ndarray, subset: Subset, shuffle: bool) -> EpochDraws | None:
        """The training epoch's draws over ``subset`` (``targets``: the split's labels), or ``None``: a plain epoch.

        Raises:
            ValueError: On weights that do not fit (a sequence of another length, a negative or non-finite
                weight, an unknown class name, all zero), or ``replacement=False`` with ``epoch_size`` larger than
                the samples with a positive weight.
        """
        if not self.changes_draws:
            return None
        pool = None if subset.rows is None else subset.rows.astype(np.int64)
        labels = subset.map_labels(targets if pool is None else targets[pool])
        weights = None if self.sample_weights is None else self._weights(targets, pool, labels, subset.classes)
        n = len(targets) if pool is None else len(pool)
        if self.resampled:  # every sample equally likely, each draw independent
            weights = np.ones(n, dtype=np.float64)
        size = self.epoch_size if self.epoch_size is not None else n
        replacement = True if self.replacement is None else self.replacement
        if weights is not None and not replacement and size > int((weights > 0).sum()):
            raise InvalidValueError(
                f"replacement=False draws each sample at most once an epoch, but epoch_size={size} is more than the "
                f"{int((weights > 0).sum())} samples with a positive weight; use replacement=True or a smaller "
                "epoch_size."
            )
        if not shuffle and weights is not None:
            what = "replacement=True" if self.resampled else "sample_weights"
            raise InvalidValueError(f"{what} draws at random: it needs shuffle=True.")
        identity = {"pool": "all" if pool is None else _digest(pool), "epoch_size": str(size)}
        if weights is not None:
            identity.update(weights=_digest(weights), replacement=str(replacement))
        return EpochDraws.of(pool, n, weights, size, replacement, shuffle, identity)

    def shares(self, targets: np.ndarray, classes: Sequence[str], seed: int) -> tuple[np.ndarray, Subset]:
        """Each training sample's share of the draws under these settings (summing to 1; 0: not taking part).

        What a mix draws a source's samples by, within the source's share: its subset (``classes``,
        ``max_per_class``, ``fraction``) and its ``sample_weights``; uniform over the subset without weights.
        Returns the shares and the subset.

        Raises:
            ValueError: As :meth:`subset` and :meth:`draws` on settings that do not fit the data.
        """
        subset = self.subset(targets, classes, True, seed)
        pool = None if subset.rows is None else subset.rows.astype(np.int64)
        shares = np.zeros(len(targets), dtype=np.float64)
        if self.sample_weights is None:
            weights = np.ones(len(targets) if pool is None else len(pool), dtype=np.float64)
        else:
            labels = subset.map_labels(targets if pool is None else targets[pool])
            weights = self._weights(targets, pool, labels, subset.classes)
        shares[slice(None) if pool is None else pool] = weights / weights.sum()
        return shares, subset

    def _weights(
        self, targets: np.ndarray, pool: np.ndarray | None, labels: np.ndarray, classes: tuple[str, ...]
    ) -> np.ndarray:
        w = self.sample_weights
        multi = labels.ndim == 2
        if (
            isinstance(w, str) and w == "repeat_factor"
        ):  # LVIS: rare classes' images drawn more, sqrt(t / f) times, at least once
            rows = labels if multi else np.eye(len(classes), dtype=np.uint8)[labels]
            frequency = rows.astype(bool).mean(axis=0)
            factor = np.maximum(1.0, np.sqrt(REPEAT_FACTOR_THRESHOLD / np.maximum(frequency, 1e-12)))
            weights = np.where(rows.any(axis=1), (rows * factor).max(axis=1), 1.0)
        elif isinstance(w, str):  # "balanced"
            if multi:
                raise InvalidValueError(
                    "sample_weights='balanced' needs one label per sample; with several labels per sample pass a "
                    "callable of the label row (e.g. the inverse frequency of its rarest class)."
                )
            counts = np.bincount(labels, minlength=len(classes)).astype(np.float64)
            weights = 1.0 / counts[labels]
        elif isinstance(w, Mapping):
            unknown = [k for k in w if k not in classes]
            if unknown:
                raise InvalidValueError(
                    f"sample_weights names classes {unknown} that the data does not have (its classes: "
                    f"{list(classes)[:20]}); classes not named keep weight 1."
                )
            per_class = np.array([float(w.get(c, 1.0)) for c in classes], dtype=np.float64)
            if multi:  # a sample's weight: the largest of its classes' (1 without a class)
                weights = np.where(labels.any(axis=1), (labels * per_class).max(axis=1), 1.0)
            else:
                weights = per_class[labels]
        elif callable(w):
            weights = np.array([float(w(label)) for label in labels.tolist()], dtype=np.float64)
        else:
            given = np.asarray(w, dtype=np.float64)
            if given.shape != (len(targets),):
                raise InvalidValueError(
                    f"sample_weights has {given.size} weights, the training set {len(targets)} samples: give one per "
                    "training sample, in its order (len(dm.train_dataset) after dm.setup('fit')), or a mapping of "
                    "class names, 'balanced' or a callable of the label."
                )
            weights = given if pool is None else given[pool]
        bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
        if bad.size:
            sample = int(bad[0] if pool is None else pool[bad[0]])
            raise InvalidValueError(
                f"sample_weights gives sample {sample} the weight {float(weights[bad[0]])!r}: weights should be finite "
                f"and >= 0 ({bad.size} such samples)."
            )
        if not weights.sum() > 0:
            raise InvalidValueError("sample_weights are all zero: nothing could be drawn.")
        return weights


def describe_change(saved: Mapping[str, str], now: Mapping[str, str]) -> str | None:
    """Which sampling setting differs between two :attr:`EpochDraws.identity` (``None``: the same)."""
    names = {"pool": "the samples taking part (classes, max_per_class, fraction)", "epoch_size": "epoch_size",
             "weights": "sample_weights", "replacement": "replacement"}  # fmt: skip
    changed = [names.get(k, k) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    return None if not changed else ", ".join(changed)
