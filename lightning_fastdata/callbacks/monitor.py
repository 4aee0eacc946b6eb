"""``DataWaitMonitor``: logs how much of each step waits for data, and says what to change."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_fastdata.callbacks.limit import RunFacts, Verdict, run_verdict
from lightning_fastdata.callbacks.meter import DataWaitMeter, DataWaitStats
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.workers import process_cpu_seconds

__all__ = ["DataWaitMonitor", "DeviceUtilization", "HostUsage", "could_decode_on_device"]


def _metrics(stats: DataWaitStats) -> dict[str, float]:
    return {"data_wait_fraction": stats.data_wait_fraction, "samples_per_sec": stats.samples_per_sec}


def _batch_size(batch: Any) -> int:
    """Lightning's own rule (the first tensor's first dimension), 1 where a batch holds no tensor."""
    try:
        return extract_batch_size(batch)
    except MisconfigurationException:
        return 1


class HostUsage:
    """The training thread's CPU time, the loader workers' and the device hooks' over training epochs.

    :meth:`start` at an epoch's first step, :meth:`sample` after each step (the workers' CPU every ``every`` steps:
    a read of ``/proc`` per worker), :meth:`close` at its end; the shares are over the sampled spans.

    Args:
        every: Steps between two reads of the workers' CPU time (and of the accelerator's utilisation).
        clock: Wall seconds; ``thread_clock``: the calling thread's CPU seconds (tests inject fakes).
    """

    def __init__(
        self,
        every: int = 20,
        clock: Callable[[], float] = time.perf_counter,
        thread_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.every, self.clock, self.thread_clock = every, clock, thread_clock
        #: The accelerator's utilisation samples (0-1), read every ``every`` steps where :meth:`sample` is given one.
        self.device_samples: list[float] = []
        self.wall_s = self.thread_s = self.hook_s = 0.0
        self.workers_wall_s, self.workers_s = 0.0, 0.0
        self.workers_readable = True
        self._open: list[float] | None = None  # wall, thread, hook at the epoch's start
        self._workers_open: tuple[float, float] | None = None  # wall, workers' CPU at the epoch's start
        self._last: list[float] | None = None
        self._workers_last: tuple[float, float] | None = None
        self._steps = 0

    def start(self, pids: Callable[[], list[int]], hook_s: float) -> None:
        """The epoch's first step starts: the reference point (``pids``: the workers' process ids, asked now)."""
        self._open = self._last = [self.clock(), self.thread_clock(), hook_s]
        self._steps = 0
        found = pids()
        cpu = process_cpu_seconds(found) if found else None
        self.workers_readable &= cpu is not None or not found
        self._workers_open = self._workers_last = None if cpu is None else (self._open[0], cpu)

    def sample(
        self, pids: Callable[[], list[int]], hook_s: float, device: Callable[[], float | None] | None = None
    ) -> None:
        """A step ended: the thread and hook now; the workers (``pids``) and ``device`` every ``every`` steps."""
        if self._open is None:
            return
        self._last = [self.clock(), self.thread_clock(), hook_s]
        self._steps += 1
        if device is not None and self._steps % self.every == 0 and (busy := device()) is not None:
            self.device_samples.append(busy)
        if self._workers_open is not None and self._steps % self.every == 0:
            found = pids()
            cpu = process_cpu_seconds(found) if found else None
            if cpu is not None:
                self._workers_last = (self._last[0], cpu)

    def close(self) -> None:
        """The epoch ended: add its spans to the totals."""
        if self._open is not None and self._last is not None:
            self.wall_s += self._last[0] - self._open[0]
            self.thread_s += self._last[1] - self._open[1]
            self.hook_s += self._last[2] - self._open[2]
        if self._workers_open is not None and self._workers_last is not None:
            self.workers_wall_s += self._workers_last[0] - self._workers_open[0]
            self.workers_s += self._workers_last[1] - self._workers_open[1]
        self._open = self._last = None
        self._workers_open = self._workers_last = None

    def facts(self, stats: DataWaitStats, workers: int, accelerator: bool, device_decode: bool = False) -> RunFacts:
        """The run's :class:`~lightning_fastdata.callbacks.limit.RunFacts` (shares scaled to ``stats``' wall time).

        ``device_decode``: the DataModule could decode on the device instead of its workers.
        """
        share = self.thread_s / self.wall_s if self.wall_s > 0 else None
        busy = self.workers_s / self.workers_wall_s if self.workers_wall_s > 0 and self.workers_readable else None
        return RunFacts(
            steps=stats.steps,
            wall_s=stats.total_s,
            wait_s=stats.wait_s,
            hook_s=self.hook_s,
            main_thread_cpu_s=None if share is None else share * stats.total_s,
            workers=workers,
            workers_cpu_s=None if busy is None else busy * stats.total_s,
            accelerator=accelerator,
            device_busy=sum(self.device_samples) / len(self.device_samples) if self.device_samples else None,
            device_decode=device_decode,
        )


def _worker_pids(trainer: Trainer) -> list[int]:
    pids = getattr(getattr(trainer, "train_dataloader", None), "worker_pids", None)
    return pids() if callable(pids) else []


class DeviceUtilization:
    """The training GPU's utilisation (NVML's share of time a kernel ran, 0-1), or ``None`` where it is unreadable.

    Through ``torch.cuda.utilization`` (``nvidia-ml-py`` installed, a CUDA device); the first failure turns it off.
    """

    def __init__(self) -> None:
        self.readable = True

    def __call__(self, trainer: Trainer) -> float | None:
        """The root device's utilisation now, or ``None``."""
        device = getattr(getattr(trainer, "strategy", None), "root_device", None)
        if not self.readable or device is None or device.type != "cuda":
            return None
        try:
            import torch

            return float(torch.cuda.utilization(device)) / 100.0
        except Exception:  # noqa: BLE001 - no NVML (ModuleNotFoundError), a driver without it: not measurable
            self.readable = False
            return None


def _hook_s(trainer: Trainer) -> float:
    return float(getattr(getattr(getattr(trainer, "datamodule", None), "transfer", None), "train_hook_s", 0.0))


class DataWaitMonitor(Callback):
    """Log ``data_wait_fraction`` and ``samples_per_sec`` while training, and say what to change.

    The wait of a step is the time from the end of the previous step (or the start of the epoch, for an
    epoch's first step: fetching it includes starting the workers) to the start of this one: fetching the
    batch from the loader plus the host-to-device transfer. Every training step is counted.

    Values are logged when the Trainer logs (its ``log_every_n_steps``) or every ``log_every_n_steps`` steps if
    given; the steps after the last logged value are logged when training ends, so a run shorter than the
    interval still logs once. At the end of the first epoch, if more than ``warn_threshold`` of the time was
    spent waiting, it warns once (rank 0) with the likely fix. With ``print_summary`` one line with the run's
    images/s and wait fraction is printed when fit ends, with or without a logger. On an accelerator, the end of fit
    also says which part limited the run, from measured facts (the training thread's and the workers' CPU time, the
    wait, the device hook's host time: :func:`~lightning_fastdata.callbacks.limit.run_verdict`), with the advice
    that fits; the first epoch's warning says the same.

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
        self.usage = HostUsage()
        self.device_utilization = DeviceUtilization()
        self._warned = False
        self._started = False
        self._epoch_hook_s = 0.0

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start timing here: the time between epochs (validation, checkpoints) is not waiting for data."""
        self.meter.reset_reference()
        self._started = False
        self._epoch_hook_s = _hook_s(trainer)  # the epoch's first hook runs before its first batch starts

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Mark the batch as ready."""
        if not self._started:
            self._started = True
            self.usage.start(lambda: _worker_pids(trainer), self._epoch_hook_s)
        self.meter.step_start(_batch_size(batch))

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close the step; log the window when it is time."""
        self.meter.step_end()
        self.usage.sample(lambda: _worker_pids(trainer), _hook_s(trainer), lambda: self.device_utilization(trainer))
        interval = self.log_every_n_steps or getattr(trainer, "log_every_n_steps", 0)  # 0: Trainer logs nothing
        if interval and trainer.global_step % interval == 0:
            stats = self.meter.window()
            if stats.steps:
                pl_module.log_dict(_metrics(stats), on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Warn once, after the first epoch, if the run is input-bound (or, on an accelerator, host-bound)."""
        self.usage.close()
        stats = self.meter.total()
        if self._warned or stats.steps == 0:
            return
        self._warned = True
        verdict = self.verdict(stats, trainer)
        if verdict.limit != "model":
            rank_zero_warn(self.advice(stats, trainer, verdict))

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the steps since the last logged value (``self.log`` is not allowed here: the logger directly)."""
        stats = self.meter.window()
        if stats.steps and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(_metrics(stats), step=trainer.global_step)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the run's totals if ``print_summary``; on an accelerator, which part limited the run."""
        self.usage.close()
        stats = self.meter.total()
        if self.print_summary and stats.steps:
            rank_zero_info(self.summary(stats))
        if stats.steps and _on_accelerator(trainer):
            rank_zero_info(f"lightning_fastdata: {self.verdict(stats, trainer).message}")

    def verdict(self, stats: DataWaitStats, trainer: Trainer) -> Verdict:
        """Which part limited the run so far (:func:`~lightning_fastdata.callbacks.limit.run_verdict`)."""
        workers = int(getattr(getattr(trainer, "train_dataloader", None), "num_workers", 0) or 0)
        facts = self.usage.facts(stats, workers, _on_accelerator(trainer), could_decode_on_device(trainer))
        return run_verdict(facts, self.warn_threshold)

    @staticmethod
    def summary(stats: DataWaitStats) -> str:
        """The one line printed at the end of fit."""
        return (
            f"lightning_fastdata: {stats.samples_per_sec:.1f} images/s per rank over {stats.steps} steps; "
            f"{100 * stats.data_wait_fraction:.1f}% of step time spent waiting for data."
        )

    def advice(self, stats: DataWaitStats, trainer: Trainer, verdict: Verdict | None = None) -> str:
        """The verdict on a run that waited (or was host-bound), and how to measure every option on its data."""
        verdict = verdict or self.verdict(stats, trainer)
        step_ms = 1000 * (stats.total_s - stats.wait_s) / max(stats.steps, 1)
        return (
            f"The training loop waited for data {100 * stats.data_wait_fraction:.0f}% of the time. {verdict.message} "
            f"`fastdata doctor DATA --step-ms {step_ms:.0f}` measures every option on your data and this machine "
            "and writes the fastest config."
        )


def could_decode_on_device(trainer: Trainer) -> bool:
    """Whether the run's DataModule decodes JPEGs in its workers and could on its CUDA device (``decode_on``)."""
    root = getattr(getattr(trainer, "strategy", None), "root_device", None)
    dm = getattr(trainer, "datamodule", None)
    transfer = getattr(dm, "transfer", None)
    return (
        root is not None
        and root.type == "cuda"
        and getattr(dm, "device_decode", False)
        and getattr(transfer, "decode_on", None) == "workers"
        and bool(dm.decodes_images())  # type: ignore[union-attr]
    )


def _on_accelerator(trainer: Trainer) -> bool:
    root = getattr(getattr(trainer, "strategy", None), "root_device", None)
    return root is not None and root.type != "cpu"
