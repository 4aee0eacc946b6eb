"""``FastDataCallback``: the GPU-side half of fast loading, for any Trainer."""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.loading.prefetch import enable_device_prefetch
from lightning_fastdata.loading.workers import resolve_num_workers

__all__ = ["FastDataCallback"]


class FastDataCallback(Callback):
    """Pinned memory, CUDA-stream prefetch, per-rank worker scaling and a data-wait monitor, in one callback.

    On this package's DataModules it sets, before the loaders are built: ``num_workers`` (only where the
    DataModule's own value is ``"auto"``: explicit values always win), pinned memory (only where the
    DataModule's ``pin_memory`` is ``None``: pinned on CUDA, off on CPU), device prefetch for the train and
    validation loaders, and the output memory format.

    On any other LightningDataModule it wraps ``train_dataloader()``: a returned ``DataLoader`` (or subclass)
    gets the device prefetch, and pinned memory if ``pin_memory=True`` is passed here explicitly (a foreign
    loader's own ``pin_memory`` and ``num_workers`` are taken as the user's explicit choice and never
    changed). It cannot prefetch loaders that are not ``DataLoader`` instances, nor loaders passed straight to
    ``trainer.fit(train_dataloaders=...)`` or returned by the LightningModule (it warns once); the monitor
    works everywhere. Normalisation on the device is done by the package's DataModules themselves.

    Prefetch keeps one batch in flight: the next batch is copied host-to-device on a side CUDA stream while
    the current step runs, Lightning's own transfer then finds it on the device (a no-op), and a checkpoint
    saves the loader state *before* the look-ahead batch, so a resume does not skip it. On CPU the same path
    runs with no stream.

    Args:
        prefetch: Copy the next batch to the device while the current one trains.
        pin_memory: ``None``: pin on CUDA for the package's DataModules; ``True``/``False`` force it (``True`` also
            pins foreign loaders).
        num_workers: Applied to the package's DataModules whose ``num_workers`` is ``"auto"``; ``"auto"`` means
            usable CPUs (affinity capped by the cgroup quota) / devices per node - 1. ``None`` leaves them.
        channels_last: Output images in channels-last memory format (what convolutions on GPU prefer).
        log_every_n_steps: Steps between logged ``data_wait_fraction`` / ``samples_per_sec`` values; ``None``: when
            the Trainer logs (its ``log_every_n_steps``). The steps after the last value are logged at the end.
        warn_threshold: Wait fraction above which the first epoch is reported as input-bound.
        print_summary: Print one line with the run's images/s and data-wait fraction when fit ends.
    """

    def __init__(
        self,
        prefetch: bool = True,
        pin_memory: bool | None = None,
        num_workers: int | Literal["auto"] | None = None,
        channels_last: bool = True,
        log_every_n_steps: int | None = None,
        warn_threshold: float = 0.2,
        print_summary: bool = True,
    ) -> None:
        if num_workers is not None:
            resolve_num_workers(num_workers)  # validates (and raises) here, before training starts
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.num_workers = num_workers
        self.channels_last = channels_last
        self.monitor = DataWaitMonitor(log_every_n_steps, warn_threshold, print_summary)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Configure the DataModule before Lightning asks it for loaders."""
        dm = getattr(trainer, "datamodule", None)
        device = trainer.strategy.root_device
        on_cuda = device.type == "cuda"
        if isinstance(dm, FastDataModule):
            if self.num_workers is not None and dm.num_workers == "auto":
                dm.num_workers = self.num_workers
            if dm.pin_memory is None and self.pin_memory is not None:
                dm.pin_memory = self.pin_memory
            dm.device_prefetch = self.prefetch
            dm.channels_last = self.channels_last
            rank_zero_info(
                f"lightning_fastdata: FastDataCallback on {type(dm).__name__}: prefetch={self.prefetch}, "
                f"pin_memory={dm.pin_memory if dm.pin_memory is not None else on_cuda}, device={device}."
            )
        elif dm is not None:
            self._wrap_foreign(dm, device)
        else:
            rank_zero_warn(
                "FastDataCallback: no DataModule, so only the data-wait monitor applies (loaders passed to fit() or "
                "returned by the LightningModule are not prefetched). Pass a LightningDataModule to get prefetch."
            )

    def _wrap_foreign(self, dm: Any, device: Any) -> None:
        original = dm.train_dataloader
        callback = self

        def train_dataloader() -> Any:
            loader = original()
            if not isinstance(loader, DataLoader):
                rank_zero_warn(
                    f"FastDataCallback: {type(dm).__name__}.train_dataloader() returned {type(loader).__name__}, not a "
                    "DataLoader; it is used as is (no pinning, no prefetch)."
                )
                return loader
            if callback.pin_memory:
                loader.pin_memory = True
            if callback.prefetch:
                enable_device_prefetch(loader, device)
            return loader

        dm.train_dataloader = train_dataloader

    # -- the monitor ---------------------------------------------------------------------------------------
    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_train_epoch_start(trainer, pl_module)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_train_epoch_end(trainer, pl_module)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_train_end(trainer, pl_module)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_fit_end(trainer, pl_module)
