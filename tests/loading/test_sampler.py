"""EpochSampler: shards, permutations, block shuffle."""

from __future__ import annotations

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
