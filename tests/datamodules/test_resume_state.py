"""``LoaderResume``'s transitions (its docstring's state machine), on a real loader, without a Trainer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from lightning_fastdata import ImageFolderDataModule
from lightning_fastdata.datamodules.resume import LoaderResume, ResumableLoader
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.transport.collate import collate_prebatched


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
    # what Lightning's loop would save now is the state the DataModule restored: the two agree
    assert resume.state == "fresh" and second.state_dict() == saved["loader_states"][0]
    other = loader()
    next(iter(other))
    second.load_state_dict(other.state_dict())  # the fit loop's load (rank 0's state on every rank): ignored
    rest = [b[1].tolist() for b in second]
    whole = [b[1].tolist() for b in loader()]
    assert seen + rest == whole
    second.load_state_dict(other.state_dict())  # after an iteration, a load is the caller's own again
    assert [b[1].tolist() for b in second] == whole[1:]


def test_a_checkpoint_without_sampler_positions_restarts_the_epoch_with_a_warning() -> None:
    saved = {"loader_states": [{}, {}], "world_size": 2, "epoch": 3, "mid_epoch": True}
    resume = LoaderResume()
    with pytest.warns(UserWarning, match=r"holds no EpochSampler position: epoch 3 restarts"):
        resume.load(saved, world_size=1, rank=0)
    assert resume.state == "restart" and resume.restart_epoch == 3
    fresh = loader()
    resume.apply(fresh, trainer=None)
    assert resume.state == "fresh" and fresh.sampler.epoch == 3


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
    assert resume.state == "fresh" and [b[1].tolist() for b in fresh] == [b[1].tolist() for b in loader()]


def rank_loader(rank: int, world: int, batch_size: int = 4) -> ResumableLoader:
    sampler = EpochSampler(12, num_replicas=world, rank=rank, shuffle=True, seed=3)
    return ResumableLoader(Keys(), batch_size=batch_size, sampler=sampler, collate_fn=collate_prebatched)


def test_two_ranks_checkpoint_continues_on_one_rank_with_the_samples_left() -> None:
    """*elastic*: each old rank trained one batch of 3 (2 x 6 samples); one rank gets the 4 left, in 1 batch."""
    olds = [rank_loader(r, 2, batch_size=3) for r in range(2)]
    its = [iter(o) for o in olds]
    seen = [i for it in its for i in next(it)[1].tolist()]
    states = [LoaderResume().save(o, interrupted=False) for o in olds]
    saved = {**states[0], "loader_states": [s["loader_states"][0] for s in states], "world_size": 2}
    resume = LoaderResume()
    resume.load(saved, world_size=1, rank=0)
    assert resume.state == "elastic"
    new = rank_loader(0, 1)
    resume.apply(new, trainer=None)
    assert resume.state == "fresh"
    rest = [i for b in new for i in b[1].tolist()]
    assert sorted(seen + rest) == list(range(12)) and len(rest) == 6
    assert new.sampler.epoch_length() == 6 and len(new) == 3  # 2 batches left of 3: the first counts as done
    new.sampler.set_epoch(1)  # the next epoch is whole
    assert len([i for b in new for i in b[1].tolist()]) == 12


def test_another_batch_size_on_the_same_world_continues_by_samples() -> None:
    """*continue* becomes *elastic* when the new loader's batch size differs: by samples, not batches."""
    first = loader()  # batch 4
    it = iter(first)
    seen = [i for _ in range(2) for i in next(it)[1].tolist()]
    saved = LoaderResume().save(first, interrupted=False)
    resume = LoaderResume()
    resume.load(saved, world_size=1, rank=0)
    assert resume.state == "continue"
    halved = rank_loader(0, 1, batch_size=2)
    resume.apply(halved, trainer=None)
    it = iter(halved)
    batches = [b[1].tolist() for b in it]
    assert [len(b) for b in batches] == [2, 2] and sorted(seen + sum(batches, [])) == list(range(12))
    assert halved.batches_done() == len(halved)  # the epoch's count ends with the loader's last batch


def test_an_epoch_boundary_checkpoint_from_another_world_size_starts_the_next_epoch_whole() -> None:
    olds = [rank_loader(r, 2) for r in range(2)]
    for o in olds:
        list(o)  # the whole epoch 0
    states = [LoaderResume().save(o, interrupted=False) for o in olds]
    saved = {**states[0], "loader_states": [s["loader_states"][0] for s in states], "world_size": 2}
    assert not saved["mid_epoch"]
    resume = LoaderResume()
    resume.load(saved, world_size=1, rank=0)  # no warning: nothing is repeated
    new = rank_loader(0, 1)
    resume.apply(new, trainer=None)
    assert new.sampler.epoch == 1 and len([i for b in new for i in b[1].tolist()]) == 12


def test_a_continued_epoch_counts_the_batches_before_the_checkpoint() -> None:
    """Resumed after 1 of 3 batches, the epoch is done after 2 more: a checkpoint then is not "mid-epoch"."""
    first = loader()
    it = iter(first)
    next(it)
    resume = LoaderResume()
    resume.load(LoaderResume().save(first, interrupted=False), world_size=1, rank=0)
    second = loader()
    resume.apply(second, trainer=None)
    rest = iter(second)
    assert len(list(rest)) == 2
    assert second.batches_done() == len(second) == 3
    assert not LoaderResume().save(second, interrupted=False)["mid_epoch"]


@pytest.mark.timeout(120)
def test_outside_a_trainer_the_datamodules_state_resumes_mid_epoch(image_folder: Path) -> None:
    """A loop of one's own (a notebook): ``dm.state_dict()`` mid-epoch, then ``load_state_dict`` on a new DataModule
    before its ``train_dataloader()``: the rest of the epoch, nothing skipped or repeated; the DataModule's state is
    made of the loader's own ``state_dict`` (what Lightning's loop saves)."""

    def module() -> ImageFolderDataModule:
        dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=4, num_workers=2, val_fraction=0)
        dm.setup("fit")
        return dm

    whole = [b[1].tolist() for b in module().train_dataloader()]
    dm = module()
    loader = dm.train_dataloader()
    it = iter(loader)
    first = [next(it)[1].tolist() for _ in range(3)]
    state = dm.state_dict()
    assert state["loader_states"] == [loader.state_dict()]
    del it
    again = module()
    again.load_state_dict(state)
    again.load_state_dict(state)  # loading is idempotent
    rest = [b[1].tolist() for b in again.train_dataloader()]
    assert first + rest == whole and len(whole) >= 5


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_iterator_counts_the_epochs_batches_from_the_restored_state(workers: int) -> None:
    """The prefetching iterator's count of the epoch's batches (what a checkpoint saves as ``batches_done``) starts
    from the state it was restored from (torchdata's count) and, in an epoch continued on another world, from the
    batches that world leaves out; a fresh epoch starts from 0."""

    def make(world: int = 1, batch_size: int = 2) -> ResumableLoader:
        sampler = EpochSampler(12, num_replicas=world, shuffle=True, seed=3)
        return ResumableLoader(
            Keys(), batch_size=batch_size, sampler=sampler, collate_fn=collate_prebatched, num_workers=workers
        )

    first = make()
    it = iter(first)
    for _ in range(4):
        next(it)
    assert first.batches_done() == 4
    second = make()
    second.load_state_dict(first.state_dict())
    it2 = iter(second)
    next(it2)
    assert second.batches_done() == 5  # 4 restored + 1
    del it, it2
    continued = make()
    continued.sampler.continue_epoch(0, np.arange(12) < 8)  # 8 of 12 consumed elsewhere: 2 batches of 2 left
    it3 = iter(continued)
    next(it3)
    assert len(continued) == 6 and continued.batches_done() == 4 + 1
    del it3
    fresh = make()
    it4 = iter(fresh)
    next(it4)
    assert fresh.batches_done() == 1
