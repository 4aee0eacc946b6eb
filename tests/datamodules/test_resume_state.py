"""``LoaderResume``'s transitions (its docstring's state machine), on a real loader, without a Trainer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from torch.utils.data import Dataset

from lightning_fastdata.datamodules.resume import LoaderResume, ResumableLoader
from lightning_fastdata.loading.collate import collate_prebatched
from lightning_fastdata.loading.sampler import EpochSampler


class Keys(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([e for e, _ in keys]), torch.tensor([i for _, i in keys])


def loader() -> ResumableLoader:
    sampler = EpochSampler(12, shuffle=True, seed=3)
    return ResumableLoader(Keys(), batch_size=4, sampler=sampler, collate_fn=collate_prebatched)


def test_continue_resumes_at_the_next_batch_and_ignores_the_fit_loops_load() -> None:
    first = loader()
    it = iter(first)
    seen = [next(it)[1].tolist() for _ in range(2)]
    saved = LoaderResume().save(first, interrupted=False)
    assert saved["mid_epoch"] and saved["world_size"] == 1
    resume = LoaderResume()
    assert resume.state == "fresh"
    resume.load(saved, world_size=1, rank=0)
    assert resume.state == "continue" and resume.mid_epoch == 0
    second = loader()
    resume.apply(second, trainer=None)
    assert resume.state == "fresh" and second.skip_next_load
    second.load_state_dict({"not": "read"})  # the fit loop's load of rank 0's state: ignored once
    assert not second.skip_next_load
    rest = [b[1].tolist() for b in second]
    whole = [b[1].tolist() for b in loader()]
    assert seen + rest == whole


def test_a_checkpoint_from_another_world_size_restarts_the_epoch_with_a_warning() -> None:
    saved = {"loader_states": [{}, {}], "world_size": 2, "epoch": 3, "mid_epoch": True}
    resume = LoaderResume()
    with pytest.warns(UserWarning, match=r"is from 2 rank\(s\), this run has 1: epoch 3 restarts"):
        resume.load(saved, world_size=1, rank=0)
    assert resume.state == "restart" and resume.restart_epoch == 3
    fresh = loader()
    resume.apply(fresh, trainer=None)
    assert resume.state == "fresh" and fresh.sampler.epoch == 3 and fresh.skip_next_load


def test_a_checkpoint_missing_a_ranks_state_restarts_the_epoch() -> None:
    resume = LoaderResume()
    with pytest.warns(UserWarning, match="lacks some ranks' state"):
        resume.load({"loader_states": [{}, None], "epoch": 1}, world_size=2, rank=0)
    assert resume.state == "restart"


def test_nothing_saved_leaves_it_fresh_and_the_loader_as_built() -> None:
    resume = LoaderResume()
    resume.load({}, world_size=1, rank=0)
    fresh = loader()
    resume.apply(fresh, trainer=None)
    assert resume.state == "fresh" and not fresh.skip_next_load
