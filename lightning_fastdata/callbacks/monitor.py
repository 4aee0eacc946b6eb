"""``DataWaitMonitor``: logs how much of each step waits for data, and says what to change."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_fastdata.callbacks.meter import DataWaitMeter, DataWaitStats
from lightning_fastdata.errors import InvalidValueError

__all__ = ["DataWaitMonitor"]


def _metrics(stats: DataWaitStats) -> dict[str, float]:
    return {"data_wait_fraction": stats.data_wait_fraction, "samples_per_sec": stats.samples_per_sec}


def _batch_size(batch: Any) -> int:
    """Lightning's own rule (the first tensor's first dimension), 1 where a batch holds no tensor."""
    try:
        return extract_batch_size(batch)
    except MisconfigurationException:
        return 1


class DataWaitMonitor(Callback):
    """Log ``data_wait_fraction`` and ``samples_per_sec`` while training, and say what to change.

    The wait of a step is the time from the end of the previous step (or the start of the epoch, for an
    epoch's first step: fetching it includes starting the workers) to the start of this one: fetching the
    batch from the loader plus the host-to-device transfer. Every training step is counted.

    Values are logged when the Trainer logs (its ``log_every_n_steps``) or every ``log_every_n_steps`` steps if
    given; the steps after the last logged value are logged when training ends, so a run shorter than the
    interval still logs once. At the end of the first epoch, if more than ``warn_threshold`` of the time was
    spent waiting, it warns once (rank 0) with the likely fix. With ``print_summary`` one line with the run's
    images/s and wait fraction is printed when fit ends, with or without a logger.

    Args:
        log_every_n_steps: Steps between two logged values; ``None``: the Trainer's ``log_every_n_steps``.
        warn_threshold: Wait fraction above which the run counts as input-bound.
        print_summary: Print images/s and the wait fraction of the whole run when fit ends.
    """

    def __init__(
        self, log_every_n_steps: int | None = None, warn_threshold: float = 0.2, print_summary: bool = False
    ) -> None:
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise InvalidValueError(f"log_every_n_steps should be a positive int or None, got {log_every_n_steps!r}.")
        if not 0 < warn_threshold < 1:
            raise InvalidValueError(f"warn_threshold should be in (0, 1), got {warn_threshold!r}.")
        self.log_every_n_steps = log_every_n_steps
        self.warn_threshold = warn_threshold
        self.print_summary = print_summary
        self.meter = DataWaitMeter()
        self._warned = False

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start timing here: the time between epochs (validation, checkpoints) is not waiting for data."""
        self.meter.reset_reference()

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Mark the batch as ready."""
        self.meter.step_start(_batch_size(batch))

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close the step; log the window when it is time."""
        self.meter.step_end()
        interval = self.log_every_n_steps or getattr(trainer, "log_every_n_steps", 0)  # 0: Trainer logs nothing
        if interval and trainer.global_step % interval == 0:
            stats = self.meter.window()
            if stats.steps:
                pl_module.log_dict(_metrics(stats), on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Warn once, after the first epoch, if the run is input-bound."""
        stats = self.meter.total()
        if self._warned or stats.steps == 0:
            return
        self._warned = True
        if stats.data_wait_fraction > self.warn_threshold:
            rank_zero_warn(self.advice(stats, trainer))

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the steps since the last logged value (``self.log`` is not allowed here: the logger directly)."""
        stats = self.meter.window()
        if stats.steps and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(_metrics(stats), step=trainer.global_step)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the run's totals if ``print_summary``."""
        stats = self.meter.total()
        if self.print_summary and stats.steps:
            rank_zero_info(self.summary(stats))

    @staticmethod
    def summary(stats: DataWaitStats) -> str:
        """The one line printed at the end of fit."""
        return (
            f"lightning_fastdata: {stats.samples_per_sec:.1f} images/s per rank over {stats.steps} steps; "
            f"{100 * stats.data_wait_fraction:.1f}% of step time spent waiting for data."
        )

    def advice(self, stats: DataWaitStats, trainer: Trainer) -> str:
        """A plain-words diagnosis of an input-bound run."""
        dm = getattr(trainer, "datamodule", None)
        workers = getattr(trainer.train_dataloader, "num_workers", None)
        msg = f"The training loop waited for data {100 * stats.data_wait_fraction:.0f}% of the time. "
        measure = (
            " `fastdata doctor DATA --step-ms "
            f"{1000 * (stats.total_s - stats.wait_s) / max(stats.steps, 1):.0f}` measures every option on your "
            "data and this machine and writes the fastest config."
        )
        if workers == 0:
            return (
                msg + "The loader has num_workers=0: set num_workers='auto' (or > 0) to decode in parallel." + measure
            )
        name = type(dm).__name__ if dm is not None else "your DataModule"
        if name == "ImageFolderDataModule":
            return msg + (
                f"JPEG decode is the likely limit ({workers} workers): train from TensorCacheDataModule (decode once, "
                "no decode per epoch), or give the loader more workers if CPUs are idle." + measure
            )
        return msg + (
            f"Check whether CPUs are idle (then raise num_workers, now {workers}) or the file system is the limit "
            "(then move the data to one HDF5 file or a tensor cache on local disk)." + measure
        )
