"""Callback suite: step time of the same CPU run with and without FastDataCallback (in-memory data).

Runs alternate (without, with, without, ...) and the medians are compared; 100 timed steps each after 10
warm-up steps. The machine is noisy (single runs of the same configuration vary by 2x), so read the
absolute difference in ms as well as the percentage.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_fastdata import FastDataCallback


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Data(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(2048, 3, 64, 64, generator=g), torch.randint(0, 10, (2048,), generator=g))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=32)


class _StepTimer(pl.Callback):
    def __init__(self, skip: int = 10) -> None:
        self.skip, self.start, self.steps = skip, 0.0, 0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.skip:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.steps = trainer.global_step - self.skip
        self.seconds = time.perf_counter() - self.start


def _step_ms(with_callback: bool, steps: int) -> float:
    timer = _StepTimer()
    callbacks: list[pl.Callback] = [timer] + ([FastDataCallback(log_every_n_steps=50)] if with_callback else [])
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(_Tiny(), _Data())
    return 1000 * timer.seconds / timer.steps


def callback_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Median step time with and without the callback, interleaved runs."""
    steps = 110
    without, with_cb = [], []
    for _ in range(max(5, args.repeats)):
        without.append(_step_ms(False, steps))
        with_cb.append(_step_ms(True, steps))
    a, b = statistics.median(without), statistics.median(with_cb)
    return {"step_ms_without": a, "step_ms_with": b, "overhead_pct": 100 * (b - a) / a, "runs": [without, with_cb]}
