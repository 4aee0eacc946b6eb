"""The Lightning behaviours ``datamodules/lightning_compat.py`` relies on, pinned with a real Trainer.

A Lightning upgrade that changes one of them fails here first, by name, instead of as a resume that repeats or
skips samples somewhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.datamodules.lightning_compat import checkpoint_step_intervals, reopen_epoch
from lightning_fastdata.testing import cpu_trainer


class RecordingLoader(StatefulDataLoader):
    def __init__(self, *args: Any, events: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events = events

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.events.append("loader.load_state_dict")
        super().load_state_dict(state_dict)


class RecordingDataModule(pl.LightningDataModule):
    """Five batches an epoch; records when Lightning asks for the loader and loads its state."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def train_dataloader(self) -> RecordingLoader:
        self.events.append("train_dataloader")
        return RecordingLoader(RandomDataset(32, 10), batch_size=2, events=self.events)


def test_model_checkpoint_keeps_its_step_interval_where_we_read_it() -> None:
    trainer = cpu_trainer(ModelCheckpoint(every_n_train_steps=5), ModelCheckpoint(), enable_checkpointing=True)
    assert checkpoint_step_intervals(trainer) == [5]  # the one without a step interval adds none
    assert checkpoint_step_intervals(cpu_trainer()) == []


@pytest.mark.timeout(120)
def test_max_steps_inside_an_epoch_counts_that_epoch_as_processed() -> None:
    trainer = cpu_trainer(epochs=-1, max_steps=3)
    trainer.fit(BoringModel(), RecordingDataModule())
    progress = trainer.fit_loop.epoch_progress.current
    assert (progress.started, progress.processed) == (1, 1)  # 3 of 5 batches, yet "processed"
    assert reopen_epoch(trainer, 0)
    assert (progress.started, progress.processed) == (1, 0)
    assert not reopen_epoch(trainer, 0)  # only an epoch counted as processed is reopened


@pytest.mark.timeout(120)
def test_the_fit_loop_loads_the_loader_state_after_asking_for_the_loader(tmp_path: Path) -> None:
    def trainer(steps: int) -> pl.Trainer:
        every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_last=True)
        return cpu_trainer(every, epochs=-1, max_steps=steps, enable_checkpointing=True)

    trainer(2).fit(BoringModel(), RecordingDataModule())
    resumed = RecordingDataModule()
    trainer(4).fit(BoringModel(), resumed, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.events[:2] == ["train_dataloader", "loader.load_state_dict"]


def test_the_values_logged_for_the_progress_bar_on_a_step_are_found_with_their_device() -> None:
    """What ``FastDataCallback`` reads after the first step on a GPU, to warn about a wait per step."""
    from lightning_fastdata.callbacks.fastdata import progress_bar_wait_warning
    from lightning_fastdata.datamodules.lightning_compat import step_progress_bar_values

    class Logging(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("shown", out["loss"], prog_bar=True)
            self.log("logged_only", out["loss"])
            self.log("per_epoch", out["loss"], prog_bar=True, on_step=False, on_epoch=True)
            return out

    seen: list[dict[str, str] | None] = []

    class Look(Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append(step_progress_bar_values(trainer))

    cpu_trainer(Look(), epochs=-1, max_steps=2).fit(Logging(), RecordingDataModule())
    assert seen == [{"shown": "cpu"}, {"shown": "cpu"}]
    assert progress_bar_wait_warning({"shown": "cpu"}) is None  # a host value is read without a wait
    warning = progress_bar_wait_warning({"train_loss": "cuda:0", "lr": "cpu", "acc": "cuda:0"})
    assert warning is not None and "`acc`, `train_loss` are logged with prog_bar=True on cuda:0" in warning
    assert "`lr`" not in warning and "without prog_bar=True" in warning
