"""The Lightning side of the GPU suite: settings, the timing callback, one timed ``Trainer.fit``, stand-in data.

See :mod:`benchmarks.gpu` for what is measured and what the figures mean.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from lightning_fastdata import FastDataCallback, ImageClassifier, TensorCacheDataModule
from lightning_fastdata.callbacks.meter import DataWaitMeter, DataWaitStats
from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.measure import baseline_loader

__all__ = [
    "BaselineData",
    "HostNormaliseCache",
    "NormalisedOnHost",
    "Repeat",
    "Settings",
    "SyntheticData",
    "Timer",
    "common_args",
    "cuda_available",
    "fit",
    "minus",
    "rss_mb",
]


@dataclass
class Settings:
    """What one run measures with.

    Args:
        root: The ImageNet-like folder (``root/<class>/<image>.jpg``).
        scratch: Where the tensor cache and the HDF5 file are built (kept for the next part or run).
        scale_root: The folder of the ``scale`` part; it needs more batches than ``2 + 2 x`` its most workers.
        arch: torchvision model trained in the ``fed`` and ``mechanisms`` parts.
        image_size: Crop size.
        batch_size: Batch size.
        workers: Loader workers in every part except ``scale``.
        steps: Training steps per epoch.
        epochs: Epochs per run; the first is warm-up, the rate is over the others.
        cache_size: Side of the cached squares (tensor cache, HDF5 raw).
        scale_workers: Worker counts of the ``scale`` part.
        decode_images: Files decoded by the ``decode`` part.
        repeats: Interleaved rounds of the ``mechanisms`` part.
        fed_loaders: The ``fed`` part's loaders by name (empty: all).
        folder_workers: The ``fed`` part also runs the folder module with each of these worker counts.
        recipe_variants: The ``recipe`` part also trains the recipe less one piece for each name here
            (``benchmarks.gpu_recipe.VARIANTS``).
        reference_epochs: Epochs of the ``recipe`` part's reference-loader fit (``None``: ``epochs``); its slowest.
        recipe_diagnose: The ``recipe`` part's untimed fit with the op recorder and the profiler.
        large_root: The ``device-decode`` part's folder of large photos (``None``: ``root``).
        loader_seconds: How long the ``decode`` and ``device-decode`` parts time a loader alone.
    """

    root: str
    scratch: str
    scale_root: str
    arch: str = "resnet50"
    image_size: int = 224
    batch_size: int = 256
    workers: int = 15
    steps: int = 40
    epochs: int = 5
    cache_size: int = 256
    scale_workers: tuple[int, ...] = (1, 2, 4, 8, 15)
    decode_images: int = 2048
    fed_loaders: tuple[str, ...] = ()
    folder_workers: tuple[int, ...] = ()
    repeats: int = 1
    recipe_variants: tuple[str, ...] = ()
    reference_epochs: int | None = None
    recipe_diagnose: bool = True
    large_root: str | None = None
    loader_seconds: float = 5.0


def common_args(s: Settings) -> dict[str, Any]:
    """The DataModule arguments every part shares: crop, batch, workers, no validation split."""
    return dict(image_size=s.image_size, batch_size=s.batch_size, num_workers=s.workers, val_fraction=0.0)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return None


def minus(a: DataWaitStats, b: DataWaitStats) -> DataWaitStats:
    return DataWaitStats(a.steps - b.steps, a.samples - b.samples, a.wait_s - b.wait_s, a.total_s - b.total_s)


class Timer(pl.Callback):
    """Rate over epochs 1.., GPU idle from CUDA events, memory at each epoch's end (see the module docstring)."""

    def __init__(self, meter: DataWaitMeter) -> None:
        self.meter = meter
        self.start: float | None = None
        self.images = 0
        self.steps: list[list[Any]] = []  # per timed step: [epoch, start event, end event]
        self.gpu_mem_mb: list[float] = []
        self.gpu_alloc_mb: list[float] = []
        self.host_rss_mb: list[float | None] = []

    def _event(self) -> Any:
        if not cuda_available():
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            if cuda_available():
                torch.cuda.synchronize()
            self.start, self.waited = time.perf_counter(), self.meter.total()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        if self.start is not None:
            self.images += len(batch[1])
            self.steps.append([trainer.current_epoch, self._event(), None])

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.start is not None:
            self.steps[-1][2] = self._event()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if cuda_available():
            torch.cuda.synchronize()
            self.gpu_mem_mb.append(round(torch.cuda.memory_reserved() / 2**20, 1))
            self.gpu_alloc_mb.append(round(torch.cuda.memory_allocated() / 2**20, 1))
        self.host_rss_mb.append(None if (rss := rss_mb()) is None else round(rss, 1))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if cuda_available():
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - (self.start or time.perf_counter())

    def epochs_timed(self) -> int:
        return len({epoch for epoch, *_ in self.steps})

    def gpu_step_ms(self) -> float | None:
        """Median GPU milliseconds of a timed step (its events at the step's start and end)."""
        if not cuda_available() or not self.steps:
            return None
        return round(statistics.median(s.elapsed_time(e) for _, s, e in self.steps), 2)

    def gpu_idle(self) -> float | None:
        """Gaps between consecutive steps of an epoch over gaps + steps, in GPU time."""
        if not cuda_available() or not self.steps:
            return None
        busy = sum(s.elapsed_time(e) for _, s, e in self.steps)
        gaps = sum(a[2].elapsed_time(b[1]) for a, b in zip(self.steps, self.steps[1:]) if a[0] == b[0])
        return gaps / (gaps + busy) if gaps + busy > 0 else None

    def epoch_times_ms(self) -> tuple[float, float] | None:
        """GPU time within epochs (first step's start to last step's end) and across the epoch boundaries."""
        if not cuda_available() or not self.steps:
            return None
        within = boundary = 0.0
        first = self.steps[0]
        for a, b in zip(self.steps, self.steps[1:] + [None]):
            if b is None or b[0] != a[0]:
                within += first[1].elapsed_time(a[2])
                if b is not None:
                    boundary += a[2].elapsed_time(b[1])
                    first = b
        return within, boundary

    def row(self) -> dict[str, Any]:
        if self.start is None:
            raise RuntimeError("The run ended before its second epoch: raise --epochs to at least 2.")
        waited = minus(self.meter.total(), self.waited)
        idle = self.gpu_idle()
        split = self.epoch_times_ms()
        return {
            "img_s": round(self.images / self.seconds, 1),
            # the rate inside epochs (GPU time, first step to last step) and what the epoch boundaries cost: with
            # short epochs, refilling the worker queue at each epoch start is a large share of the wall time
            "steady_img_s": None if split is None else round(self.images / (split[0] / 1000), 1),
            "epoch_boundary_ms": None if split is None else round(split[1] / max(1, self.epochs_timed() - 1), 1),
            "data_wait": round(waited.data_wait_fraction, 4),
            "gpu_idle": None if idle is None else round(idle, 4),
            "gpu_mem_mb": self.gpu_mem_mb,
            "gpu_alloc_mb": self.gpu_alloc_mb,
            "host_rss_mb": self.host_rss_mb,
            "timed_steps": len(self.steps),
            "gpu_step_ms": self.gpu_step_ms(),
        }


def fit(
    s: Settings,
    dm: pl.LightningDataModule,
    callback: pl.Callback,
    channels_last: bool = True,
    extra_callbacks: Sequence[pl.Callback] = (),
) -> dict:
    """Train ``s.arch`` on ``dm`` for ``s.epochs`` x ``s.steps``; the timer's row.

    The process's garbage is collected first: a loader whose workers fork after earlier fits would inherit
    unreachable cycles holding CUDA tensors, and a worker whose own collection frees one dies (CUDA error:
    initialization error). torchvision's reference loader (no ``gc.freeze`` in its workers, as ours) died so at the
    start of its second 500-step epoch in the 2026-11-27 run, after enough allocations for a full collection.
    """
    gc.collect()
    monitor = callback.monitor if isinstance(callback, FastDataCallback) else callback
    assert isinstance(monitor, DataWaitMonitor)
    timer = Timer(monitor.meter)
    trainer = pl.Trainer(
        accelerator="auto",
        devices=1,
        precision="bf16-mixed" if cuda_available() else "32-true",
        max_epochs=s.epochs,
        limit_train_batches=s.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        benchmark=cuda_available(),
        callbacks=[callback, timer, *extra_callbacks],
    )
    num_classes = len(getattr(dm, "classes", [])) or 1000
    trainer.fit(ImageClassifier(num_classes=num_classes, arch=s.arch, channels_last=channels_last), dm)
    return timer.row()


class Repeat:
    """The same device-resident batch, ``steps`` times per epoch: the model alone, nothing to load."""

    def __init__(self, batch: tuple[torch.Tensor, torch.Tensor], steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self.batch for _ in range(self.steps))


class SyntheticData(pl.LightningDataModule):
    def __init__(self, s: Settings, num_classes: int) -> None:
        super().__init__()
        self.s, self.classes = s, list(range(num_classes))

    def train_dataloader(self) -> Repeat:
        device = "cuda" if cuda_available() else "cpu"
        g = torch.Generator(device=device).manual_seed(0)
        shape = (self.s.batch_size, 3, self.s.image_size, self.s.image_size)
        images = torch.randn(shape, device=device, generator=g).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, len(self.classes), (self.s.batch_size,), device=device, generator=g)
        return Repeat((images, labels), self.s.steps)


class BaselineData(pl.LightningDataModule):
    """torchvision ``ImageFolder`` + classic transforms + a plain ``DataLoader``: what users write today."""

    def __init__(self, s: Settings) -> None:
        super().__init__()
        self.s = s
        self.classes = sorted(p.name for p in Path(s.root).iterdir() if p.is_dir())

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return baseline_loader(self.s.root, self.s.image_size, self.s.batch_size, self.s.workers)


class NormalisedOnHost(Dataset):
    """Wraps a batched dataset: normalises each batch to float32 in the worker (4x the bytes over PCIe)."""

    def __init__(self, inner: Any, dm: FastDataModule) -> None:
        self.inner, self.normalizer = inner, dm.normalizer

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __getitems__(self, indices: list[int]) -> Any:
        images, *rest = self.inner.__getitems__(indices)
        return (self.normalizer(images).contiguous(memory_format=torch.channels_last), *rest)


class HostNormaliseCache(TensorCacheDataModule):
    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        train, val = super().build_datasets()
        return NormalisedOnHost(train, self), val
