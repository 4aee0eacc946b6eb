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

from lightning_fastdata import FastDataCallback, TensorCacheDataModule
from lightning_fastdata.bench.scratch import scratch_path
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.measure import count_images, time_loader
from lightning_fastdata.testing import cpu_trainer

__all__ = ["callback_suite", "snapshot_suite"]


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        # ~10-20 ms per step on 2 CPU cores: a real (small) training step, so a per-step cost is measurable
        self.net = nn.Sequential(
            nn.Conv2d(3, 64, 3, stride=1),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
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


class _TimedFastDataCallback(FastDataCallback):
    """FastDataCallback that also adds up the time spent inside its own per-step hooks."""

    hook_s = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        start = time.perf_counter()
        super().on_train_batch_start(*args)
        _TimedFastDataCallback.hook_s += time.perf_counter() - start

    def on_train_batch_end(self, *args: Any) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(*args)
        _TimedFastDataCallback.hook_s += time.perf_counter() - start


def _step_ms(with_callback: bool, steps: int) -> float:
    timer = _StepTimer()
    callbacks: list[pl.Callback] = [timer] + (
        [_TimedFastDataCallback(log_every_n_steps=50, print_summary=False)] if with_callback else []
    )
    trainer = cpu_trainer(*callbacks, epochs=-1, max_steps=steps)
    trainer.fit(_Tiny(), _Data())
    return 1000 * timer.seconds / timer.steps


def callback_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Median step time with and without the callback, interleaved runs."""
    steps = 110
    without, with_cb = [], []
    _TimedFastDataCallback.hook_s = 0.0
    for _ in range(max(7, args.repeats)):
        without.append(_step_ms(False, steps))
        with_cb.append(_step_ms(True, steps))
    a, b = statistics.median(without), statistics.median(with_cb)
    hook_us = 1e6 * _TimedFastDataCallback.hook_s / (len(with_cb) * steps)
    return {
        "step_ms_without": a,
        "step_ms_with": b,
        "overhead_pct": 100 * (b - a) / a,
        "hook_us_per_step": hook_us,
        "runs": [without, with_cb],
    }


def snapshot_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Cost of StatefulDataLoader snapshots on the fastest loader (tensor cache, 2 workers), per batch.

    If the snapshots cost < 1% of the time this loader needs per batch, they cost less than 1% of any
    training step that this loader can keep fed.
    """
    cache_dir = str(scratch_path(args, "cache256"))
    rates: dict[str, list[float]] = {
        "plain DataLoader (no state)": [],
        "snapshot every step": [],
        "snapshot every 100": [],
    }
    modules = {}
    for name, interval in (("snapshot every step", 1), ("snapshot every 100", 100)):
        dm = TensorCacheDataModule(
            args.root,
            cache_dir,
            cache_size=256,
            image_size=args.image_size,
            batch_size=args.batch_size,
            num_workers=2,
            val_fraction=0.0,
            persistent_workers=False,
            snapshot_every_n_steps=interval,
        )
        dm.setup("fit")
        modules[name] = dm

    def plain() -> PrefetchingDataLoader:
        loader = modules["snapshot every step"].train_dataloader()
        return PrefetchingDataLoader(  # no state, the same batch transport as the DataModule's loaders
            loader.dataset,
            batch_size=args.batch_size,
            sampler=loader.sampler,
            num_workers=2,
            collate_fn=collate_prebatched,
            batch_transport=loader.batch_transport,
        )

    for _ in range(max(6, args.repeats)):  # single runs vary by +-20% here: compare medians of many
        rates["plain DataLoader (no state)"].append(time_loader(plain, count_images))
        for name, dm in modules.items():
            rates[name].append(time_loader(dm.train_dataloader, count_images))
    ms = {name: 1000 * args.batch_size / statistics.median(r) for name, r in rates.items()}
    base = ms["plain DataLoader (no state)"]
    spread = {name: [round(1000 * args.batch_size / x, 2) for x in r] for name, r in rates.items()}
    return {
        "ms_per_batch": ms,
        "ms_per_batch_runs": spread,
        "overhead_pct": {k: 100 * (v - base) / base for k, v in ms.items()},
        "runs": rates,
    }
