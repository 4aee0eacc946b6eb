"""The torchdata layout the elastic resume reads (``loading/transport/torchdata_internals.py``), on real loaders."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport import torchdata_internals
from lightning_fastdata.loading.transport.collate import collate_prebatched


class Keys(Dataset):
    def __len__(self) -> int:
        return 40

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([e for e, _ in keys]), torch.tensor([i for _, i in keys])


def test_this_torchdata_has_every_name() -> None:
    assert torchdata_internals.MISSING == ()


@pytest.mark.parametrize(("workers", "snapshot_every"), [(0, 1), (2, 1), (2, 3)])
def test_the_samplers_state_and_the_batches_since_it_are_found(workers: int, snapshot_every: int) -> None:
    """After 5 batches of 4 the sampler's state (plus the batches since the snapshot it is in) accounts for 20 keys,
    as a fresh loader's sampler with that state would resume; its epoch and seed are the sampler's."""
    sampler = EpochSampler(40, seed=7)
    loader = StatefulDataLoader(
        Keys(),
        batch_size=4,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_prebatched,
        snapshot_every_n_steps=snapshot_every,
    )
    it = iter(loader)
    seen = [next(it) for _ in range(5)]
    found = torchdata_internals.sampler_state(loader.state_dict())
    assert found is not None
    state, since = found
    assert state["epoch"] == 0 and state["seed"] == 7 and state["length"] == 40
    assert state["yielded"] + 4 * since == 20
    assert since == (0 if workers == 0 else 5 % snapshot_every)
    del it, seen


def test_a_state_without_a_sampler_state_gives_none() -> None:
    assert torchdata_internals.sampler_state(None) is None
    assert torchdata_internals.sampler_state({}) is None
    plain = StatefulDataLoader(list(range(8)), batch_size=2)  # torch's RandomSampler: no EpochSampler position
    it = iter(plain)
    next(it)
    assert torchdata_internals.sampler_state(plain.state_dict()) is None
