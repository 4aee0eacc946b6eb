"""What an epoch draws: weights, epoch sizes and subsets, sharded and resumed like a plain epoch (the sampler alone)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from helpers.stats import CHI2_999, chi_square

from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.sampling import EpochDraws, SamplingSettings, Subset, occurrences

#: A skewed set: 1,000 / 50 / 10 samples of classes a, b, c (a 1:100 imbalance), shuffled.
SKEWED = np.random.default_rng(1).permutation(np.repeat(np.arange(3), [1000, 50, 10]))
CLASSES = ("a", "b", "c")


def draws_of(settings: SamplingSettings, targets: np.ndarray = SKEWED, train: bool = True, seed: int = 0) -> Any:
    subset = settings.subset(targets, CLASSES, train, seed)
    return subset, settings.draws(targets, subset, shuffle=True)


def epoch_keys(draws: EpochDraws, world: int = 1, repeats: int = 1, epoch: int = 0, seed: int = 0) -> list[list]:
    out = []
    for rank in range(world):
        sampler = EpochSampler(len(SKEWED), world, rank, seed=seed, repeats=repeats, draws=draws)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_balanced_weights_draw_every_class_equally_often_on_every_rank() -> None:
    _, draws = draws_of(SamplingSettings("balanced", epoch_size=6000))
    ranks = epoch_keys(draws, world=2)
    assert len(ranks[0]) == len(ranks[1]) == 3000  # the same number of batches on every rank
    for keys in [[k for r in ranks for k in r], *ranks]:  # the epoch, and each rank's share
        counts = Counter(int(SKEWED[k[1]]) for k in keys)
        assert chi_square(counts, {c: len(keys) / 3 for c in range(3)}) < CHI2_999[2], counts
    # a plain epoch has the skew (the test can fail): class a is 94% of it
    plain = Counter(int(SKEWED[i]) for i in np.random.default_rng(0).permutation(len(SKEWED))[:3000])
    assert chi_square(plain, {c: 1000.0 for c in range(3)}) > 1000
    # per-class weights: a mapping; c four times b's weight, a left at 1 (1,000 of them)
    _, mapped = draws_of(SamplingSettings({"b": 10.0, "c": 200.0}, epoch_size=30000))
    counts = Counter(int(SKEWED[k[1]]) for k in epoch_keys(mapped)[0])
    total = 1000 * 1 + 50 * 10 + 10 * 200
    expect = {0: 30000 * 1000 / total, 1: 30000 * 500 / total, 2: 30000 * 2000 / total}
    assert chi_square(counts, expect) < CHI2_999[2], counts


def test_draws_are_a_function_of_seed_and_epoch_and_every_key_is_its_own() -> None:
    _, draws = draws_of(SamplingSettings("balanced"))
    first = epoch_keys(draws, epoch=3)[0]
    assert first == epoch_keys(draws, epoch=3)[0]  # again: the same
    assert first != epoch_keys(draws, epoch=4)[0] and first != epoch_keys(draws, epoch=3, seed=1)[0]
    assert len(first) == len(SKEWED)  # an epoch: as many draws as samples, unless epoch_size says otherwise
    # with replacement each of the 10 c samples is drawn ~35 times: every draw still has its own key
    assert len(set(first)) == len(first)
    assert max(Counter(k[1] for k in first).values()) > 20
    # two ranks share the epoch's draws: together exactly the one-rank keys
    two = epoch_keys(draws, world=2, epoch=3)
    assert sorted(two[0] + two[1]) == sorted(first)
    # repeated augmentation composes with weights: each draw twice, side by side, with its own repeat numbers
    repeated = epoch_keys(draws, repeats=2, epoch=3)[0]
    assert len(repeated) == len(SKEWED) and len(set(repeated)) == len(repeated)
    assert all(a[:2] == b[:2] and b[2] == a[2] + 1 for a, b in zip(repeated[::2], repeated[1::2]))


def test_without_replacement_each_sample_once_and_weight_zero_never() -> None:
    weights = np.where(SKEWED == 0, 0.0, 1.0).tolist()  # class a never
    _, draws = draws_of(SamplingSettings(weights, replacement=False, epoch_size=60))
    keys = epoch_keys(draws)[0]
    assert len({k[1] for k in keys}) == 60 and all(SKEWED[k[1]] != 0 for k in keys)
    # a whole epoch without replacement: a weighted permutation (every sample once), heavier samples earlier
    heavy = np.where(SKEWED == 2, 100.0, 1.0)
    _, tilted = draws_of(SamplingSettings(heavy.tolist(), replacement=False))
    order = [k[1] for k in epoch_keys(tilted)[0]]
    assert sorted(order) == list(range(len(SKEWED)))
    position = {index: p for p, index in enumerate(order)}
    assert np.mean([position[i] for i in np.flatnonzero(SKEWED == 2)]) < 0.1 * len(SKEWED)  # weight 100 vs 1
    _, with_repl = draws_of(SamplingSettings(weights, epoch_size=5000))
    assert all(SKEWED[k[1]] != 0 for k in epoch_keys(with_repl)[0])
    # a callable of the label
    _, called = draws_of(SamplingSettings(lambda label: 1.0 if label == 2 else 0.0, epoch_size=100))
    assert {int(SKEWED[k[1]]) for k in epoch_keys(called)[0]} == {2}
    # no weights, epoch_size larger than the set: whole permutations one after another
    _, longer = draws_of(SamplingSettings(epoch_size=2500))
    counts = Counter(k[1] for k in epoch_keys(longer)[0])
    assert set(counts.values()) <= {2, 3} and len(counts) == len(SKEWED)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (dict(sample_weights="uniform"), "sample_weights='uniform'"),
        (dict(sample_weights=[1.0, 2.0]), "2 weights, the training set 1060"),
        (dict(sample_weights={"zebra": 2.0}), "['zebra']"),
        (dict(sample_weights=[-1.0] * 1060), "weight -1.0"),
        (dict(sample_weights=[0.0] * 1060), "all zero"),
        (dict(sample_weights=[1.0] * 10 + [0.0] * 1050, replacement=False, epoch_size=20), "epoch_size=20"),
        (dict(epoch_size=0), "epoch_size should be a positive int"),
        (dict(classes=["a", "zebra"]), "['zebra']"),
        (dict(fraction=1.5), "fraction should be in (0, 1]"),
        (dict(max_per_class=0), "max_per_class should be a positive int"),
    ],
    ids=[
        "unknown-string",
        "sequence-length",
        "unknown-class",
        "negative",
        "all-zero",
        "more-than-positive",
        "epoch-size",
        "subset-class",
        "fraction",
        "max-per-class",
    ],  # fmt: skip
)
def test_impossible_settings_are_errors_naming_them(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError) as err:
        draws_of(SamplingSettings(**settings))
    assert says in str(err.value), str(err.value)


def test_subsets_keep_some_classes_renumbered_at_most_k_each_or_a_fraction() -> None:
    subset = SamplingSettings(classes=["c", "a"]).subset(SKEWED, CLASSES, True, 0)
    assert subset.classes == ("c", "a") and subset.rows is not None and len(subset.rows) == 1010
    assert sorted(Counter(subset.map_labels(SKEWED[subset.rows]).tolist()).items()) == [(0, 10), (1, 1000)]
    capped = SamplingSettings(max_per_class=20).subset(SKEWED, CLASSES, True, 0)
    assert capped.rows is not None
    assert sorted(Counter(SKEWED[capped.rows].tolist()).items()) == [(0, 20), (1, 20), (2, 10)]
    assert np.array_equal(capped.rows, SamplingSettings(max_per_class=20).subset(SKEWED, CLASSES, True, 0).rows)
    other_seed = SamplingSettings(max_per_class=20).subset(SKEWED, CLASSES, True, 1).rows
    assert not np.array_equal(capped.rows, other_seed)
    tenth = SamplingSettings(fraction=0.1).subset(SKEWED, CLASSES, True, 0)
    assert tenth.rows is not None and len(tenth.rows) == 106
    # evaluation splits take classes= only (a capped or partial validation set would change the metric)
    assert SamplingSettings(max_per_class=20, fraction=0.1).subset(SKEWED, CLASSES, False, 0).rows is None
    # multi-hot rows keep the classes' columns, in the given order
    rows = np.array([[1, 0, 1], [0, 1, 0], [0, 0, 0]], dtype=np.uint8)
    multi = SamplingSettings(classes=["c", "a"]).subset(rows, CLASSES, True, 0)
    assert multi.rows is not None and multi.rows.tolist() == [0]
    assert multi.map_labels(rows).tolist() == [[1, 1], [0, 0], [0, 0]]
    assert isinstance(Subset(None, CLASSES).map_labels(rows), np.ndarray)


def test_a_state_resumes_the_draws_exactly_on_one_rank_and_continues_them_on_another_world() -> None:
    _, draws = draws_of(SamplingSettings("balanced", epoch_size=999))
    full = epoch_keys(draws, epoch=2)[0]
    sampler = EpochSampler(len(SKEWED), seed=0, draws=draws)
    sampler.set_epoch(2)
    it = iter(sampler)
    head = [next(it) for _ in range(400)]
    state = sampler.state_dict()
    resumed = EpochSampler(len(SKEWED), seed=0, draws=draws)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full  # mid-epoch: the exact next draw
    # two ranks stopped at 150 and 149 keys: one rank continues with exactly the draws left
    two = epoch_keys(draws, world=2, epoch=2)
    one = EpochSampler(len(SKEWED), seed=0, draws=draws)
    one.continue_epoch(2, one.consumed_mask([150, 149], 2))
    left = list(one)
    assert sorted(left + two[0][:150] + two[1][:149]) == sorted(full)
    # other settings: refused, naming what changed
    _, other = draws_of(SamplingSettings("balanced", epoch_size=1000))
    with pytest.raises(ValueError, match="epoch_size changed"):
        EpochSampler(len(SKEWED), seed=0, draws=other).load_state_dict(state)
    _, plain_size = draws_of(SamplingSettings(epoch_size=999))
    with pytest.raises(ValueError, match="sample_weights"):
        EpochSampler(len(SKEWED), seed=0, draws=plain_size).load_state_dict(state)
    with pytest.raises(ValueError, match="other sampling settings"):
        EpochSampler(len(SKEWED), seed=0).load_state_dict(state)


def test_occurrences_number_each_repeat_of_an_index() -> None:
    assert occurrences(np.array([5, 3, 5, 5, 3, 9])).tolist() == [0, 0, 1, 2, 1, 0]


def test_repeat_factors_draw_a_rare_classs_images_sqrt_t_over_f_times_as_often() -> None:
    """``"repeat_factor"`` (LVIS, detectron2's ``RepeatFactorTrainingSampler``): a class in a fraction ``f`` of the
    images gives them ``max(1, sqrt(0.001 / f))``, an image its classes' largest; 1 without a class."""
    from lightning_fastdata.loading.sampling import REPEAT_FACTOR_THRESHOLD

    rows = np.zeros((20_000, 3), np.uint8)
    rows[:, 0] = 1  # everywhere: factor 1
    rows[:5, 1] = 1  # in 5 of 20,000 (f = 0.00025): sqrt(0.001 / 0.00025) = 2
    rows[5:10, 2] = 1  # likewise
    rows[10:15] = 0  # no class: 1
    shares, _ = SamplingSettings("repeat_factor").shares(rows, ("common", "rare", "rarer"), seed=0)
    assert REPEAT_FACTOR_THRESHOLD == 0.001
    assert shares[0] / shares[100] == pytest.approx(2.0) and shares[7] / shares[100] == pytest.approx(2.0)
    assert shares[12] == pytest.approx(shares[100]) and shares.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="repeat_factor"):
        SamplingSettings("lvis")
