"""EpochSampler: shards, permutations, block shuffle."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fastdata import EpochSampler


def test_block_shuffle_sampler() -> None:
    a = EpochSampler(20, num_replicas=2, rank=0, block_size=4)
    b = EpochSampler(20, num_replicas=2, rank=1, block_size=4)
    ia, ib = [i for _, i in a], [i for _, i in b]
    assert set(ia) | set(ib) == set(range(20)) and not set(ia) & set(ib)
    runs = [ia[k : k + 4] for k in range(0, 8, 4)]
    assert all(r == list(range(r[0], r[0] + 4)) and r[0] % 4 == 0 for r in runs)  # whole blocks, in order
    assert ia + ib != list(range(20))  # blocks are shuffled
    with pytest.raises(ValueError, match="block_size"):
        EpochSampler(5, block_size=0)


def _keys(sampler: EpochSampler) -> list[int]:
    return [i for _, i in sampler]


#: Aspect-ratio groups of the 39 samples of the tests below (three groups of unequal sizes).
GROUPS = np.random.default_rng(5).integers(0, 3, 39)


def _grouped_batches(keys: list[int], size: int) -> tuple[int, int]:
    """How many of ``keys``' batches of ``size`` are of one group, and how many mix groups (all of them after)."""
    purity = [len(set(GROUPS[keys[k : k + size]].tolist())) == 1 for k in range(0, len(keys), size)]
    pure = purity.index(False) if False in purity else len(purity)
    return pure, len(purity) - pure


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("block_size", [None, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 3), (3, 2), (2, 2)])
def test_an_epoch_continued_on_another_world_size_trains_every_sample_once(
    old: int, new: int, drop_last: bool, block_size: int | None, grouped: bool
) -> None:
    """The old ranks consumed a prefix of their shards; the new ranks split the rest equally, nothing twice. With
    aspect-ratio groups, every rank's batches are of one group but for at most one per group closing the epoch."""
    n, epoch = 39, 3
    kw = dict(shuffle=True, seed=7, drop_last=drop_last, block_size=block_size)
    if grouped:
        kw.update(groups=GROUPS, group_size=3)
    olds = [EpochSampler(n, num_replicas=old, rank=r, **kw) for r in range(old)]
    for s in olds:
        s.set_epoch(epoch)
    taken = [5, 5, 5][:old]  # DDP ranks step together: equal positions
    consumed = [i for s, t in zip(olds, taken) for i in s.indices()[:t].tolist()]
    news = [EpochSampler(n, num_replicas=new, rank=r, **kw) for r in range(new)]
    mask = news[0].consumed_mask(taken, epoch)
    assert sorted(np.flatnonzero(mask).tolist()) == sorted(consumed)
    for s in news:
        s.continue_epoch(epoch, mask)
    rest = [_keys(s) for s in news]
    assert len({len(r) for r in rest}) == 1  # equal step counts on every rank
    trained = consumed + [i for r in rest for i in r]
    padded = sum(len(_keys(s)) for s in olds) - n  # what the old world padded (+) or dropped (-)
    if drop_last:  # nothing twice; what is left out is less than one sample per rank (plus the old world's cut)
        assert len(set(trained)) == len(trained) and n - len(trained) < new + max(0, -padded)
    else:  # every sample; only the padding repeats some, fewer than one per rank
        assert set(trained) == set(range(n)) and len(trained) - n < new + max(0, padded)
    if old == new and not grouped:  # the same world: each rank continues its own shard, as an uninterrupted run does
        assert rest == [s.indices()[t:].tolist() for s, t in zip(olds, taken)]
    if grouped:  # (an interrupted world's resume is its position: exact; a continued share is grouped again)
        for keys in [_keys(s) for s in olds] + rest:
            _, mixed = _grouped_batches(keys, 3)
            assert mixed <= 3  # at most one unfilled batch per group, closing the epoch
    if block_size and not drop_last and not grouped:  # block shuffle stays sequential: runs of consecutive indices
        runs = sum(1 for r in rest for a, b in zip(r, r[1:]) if b != a + 1)
        assert runs <= sum(len(r) for r in rest) // block_size + 2 * new
    # the next epoch is whole again: what a run started on the new world size sees
    for r, s in enumerate(news):
        s.set_epoch(epoch + 1)
        fresh = EpochSampler(n, num_replicas=new, rank=r, **kw)
        fresh.set_epoch(epoch + 1)
        assert _keys(s) == _keys(fresh)


def test_a_continued_epochs_state_round_trips_and_a_second_interruption_is_counted() -> None:
    """Interrupted again inside a continued epoch: its state holds the first mask; the union is still exact."""
    n, epoch = 39, 0
    first = EpochSampler(n, num_replicas=2, rank=0, seed=1)
    mask = first.consumed_mask([8, 8], epoch)  # 2 ranks x 8 consumed
    one = EpochSampler(n, num_replicas=1, rank=0, seed=1)
    one.continue_epoch(epoch, mask)
    rest = _keys(one)
    assert len(rest) == n - 16
    one.continue_epoch(epoch, mask)
    it = iter(one)
    seen = [next(it)[1] for _ in range(5)]
    state = one.state_dict()
    assert len(state["consumed"]) == (n + 7) // 8
    again = EpochSampler(n, num_replicas=1, rank=0, seed=1)
    again.load_state_dict(state)  # the same world: continues this run's own order
    assert seen + _keys(again) == rest
    three = EpochSampler(n, num_replicas=3, rank=0, seed=1)
    unpacked = np.unpackbits(np.frombuffer(state["consumed"], dtype=np.uint8), count=n).astype(bool)
    mask2 = three.consumed_mask([5], epoch, unpacked)  # a second interruption, resumed on 3 ranks
    assert mask2.sum() == 16 + 5
    left = []
    for r in range(3):
        s = EpochSampler(n, num_replicas=3, rank=r, seed=1)
        s.continue_epoch(epoch, mask2)
        left += _keys(s)
    assert sorted(set(left)) == sorted(set(range(n)) - set(np.flatnonzero(mask2).tolist()))


def test_a_state_from_another_seed_or_dataset_size_is_refused_by_name() -> None:
    state = EpochSampler(39, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"seed=1, this sampler has seed=2: resume with the checkpoint's seed"):
        EpochSampler(39, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"a dataset of 39 samples, this one has 40"):
        EpochSampler(40, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"a dataset of 39 samples, this one has 40"):
        EpochSampler(40, seed=1, num_replicas=2).check_compatible(state)  # what an elastic resume checks first


@pytest.mark.parametrize("shape", ["windows", "blocks"])
def test_repeats_reach_different_ranks_with_windows_and_blocks(shape: str) -> None:
    """Repeated augmentation (torchvision's RASampler) sends a sample's repeats to different ranks; with windows of
    row groups (or block shuffle) each rank took a contiguous run of the order, so all of a sample's repeats landed
    on one rank. Now they spread over the ranks."""
    from lightning_fastdata.loading.sampler import ShuffleWindows

    kw: dict = dict(shuffle=True, seed=3, repeats=2)
    if shape == "windows":
        kw["windows"] = ShuffleWindows(np.arange(0, 40, 5), window=2)
    else:
        kw["block_size"] = 4
    ranks = [list(EpochSampler(40, num_replicas=2, rank=r, **kw)) for r in range(2)]
    assert [len(keys) for keys in ranks] == [20, 20]  # an epoch keeps its length: 20 samples, twice each
    assert sorted(k[1] for k in ranks[0]) == sorted(k[1] for k in ranks[1])  # each sample on both ranks, once
    assert [{k[2] for k in keys} for keys in ranks] == [{0}, {1}]  # repeat r on rank r


def test_aspect_ratio_groups_batch_each_ranks_share_and_the_plain_order_would_not() -> None:
    """Each rank's share in batches of one group until the unfilled ones close it; every sample once over the ranks
    (padded as torch pads); the groups are part of the order a resume checks."""
    ranks = [EpochSampler(39, num_replicas=2, rank=r, seed=3, groups=GROUPS, group_size=4) for r in range(2)]
    plain = [EpochSampler(39, num_replicas=2, rank=r, seed=3) for r in range(2)]
    keys = [_keys(s) for s in ranks]
    assert [sorted(k) for k in keys] == [sorted(_keys(s)) for s in plain]  # the same shares, reordered
    assert set(keys[0] + keys[1]) == set(range(39)) and len(keys[0]) == len(keys[1]) == 20
    for k in keys:
        pure, mixed = _grouped_batches(k, 4)
        assert pure >= 2 and mixed <= 3
    assert sum(_grouped_batches(_keys(s), 4)[0] for s in plain) < sum(_grouped_batches(k, 4)[0] for k in keys)
    with pytest.raises(ValueError, match="another order"):
        plain[0].load_state_dict(ranks[0].state_dict())
    with pytest.raises(ValueError, match="groups should give each"):
        EpochSampler(39, groups=GROUPS[:10])
