"""``FastDataCallback``: the GPU-side half of fast loading, for any Trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datamodules.lightning_compat import step_progress_bar_values
from lightning_fastdata.datamodules.transfer import DeviceHalf
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.transport.loaders import with_prefetch
from lightning_fastdata.loading.workers import CpuBudget, resolve_num_workers

__all__ = ["FastDataCallback", "progress_bar_wait_warning", "threads_beside_workers"]

_NOT_SET = object()


class FastDataCallback(Callback):
    """Pinned memory, CUDA-stream prefetch, per-rank worker scaling and a data-wait monitor, in one callback.

    A thin adapter: on this package's DataModules it hands its settings over through one method,
    :meth:`~lightning_fastdata.FastDataModule.configure_transfer`, before the loaders are
    built; the DataModule owns them, and its own explicit ``num_workers``/``pin_memory`` win (the log line says which
    were kept). The DataModule then builds loaders that prefetch by construction
    (:mod:`lightning_fastdata.loading.transport.loaders`).

    On any other LightningDataModule it rebuilds what ``train_dataloader()`` returns, when that is a plain
    ``DataLoader``/``StatefulDataLoader``, as its prefetching twin (same dataset, sampler and settings; pinned
    only if ``pin_memory=True`` is passed here: a foreign loader's own ``pin_memory`` and ``num_workers`` are
    the user's choice). For that, the DataModule's ``train_dataloader`` is replaced from ``setup`` to
    ``teardown`` of each fit, and put back as it was (each fit prefetches to its own Trainer's device). Other
    loader classes (their constructors are unknown), non-loaders, and loaders passed straight to
    ``trainer.fit(train_dataloaders=...)`` or returned by the LightningModule are used as they are (warned); the
    monitor works everywhere. Normalisation on the device is done by the package's DataModules.

    Prefetch keeps one batch in flight: the next batch is copied host-to-device on a side CUDA stream while
    the current step runs, Lightning's own transfer then finds it on the device (a no-op), and a checkpoint
    saves the loader state *before* the look-ahead batch, so a resume does not skip it. On CPU the same path
    runs with no stream.

    After the first training step on a GPU it looks, once, at what the LightningModule logged with
    ``prog_bar=True`` on the step: Lightning turns those values into numbers after every step, a wait for the GPU
    each step when they are its tensors, and the callback warns naming them (``progress_bar_wait_warning``).

    Args:
        prefetch: Copy the next batch to the device on a side CUDA stream while the current one trains. Off by
            default: on an H100 (ResNet-50, bf16, batch 256 of uint8 224 px images) it bought nothing measurable
            over Lightning's own copy and held more GPU memory, a uint8 batch's copy being a small part of the step
            (the docs' Benchmarks page, GPU part ``mechanisms``). Turn it on where the copy is a larger share of the
            step: a small model, float batches, large images.
        pin_memory: ``None``: pin on CUDA for the package's DataModules; ``True``/``False`` force it (``True`` also
            pins foreign loaders).
        num_workers: Applied to the package's DataModules whose ``num_workers`` is ``"auto"``; ``"auto"`` means
            usable CPUs (affinity capped by the cgroup quota) / devices per node - 1. ``None`` leaves them.
        channels_last: Output images in channels-last memory format (what convolutions on GPU prefer).
        log_every_n_steps: Steps between logged ``data_wait_fraction`` / ``samples_per_sec`` values; ``None``: when
            the Trainer logs (its ``log_every_n_steps``). The steps after the last value are logged at the end.
        warn_threshold: Wait fraction above which the first epoch is reported as input-bound.
        print_summary: Print one line with the run's images/s and data-wait fraction when fit ends.
        host_threads: torch's intra-op threads in the training process while it trains on an accelerator with
            loader workers: ``"auto"`` (default) caps them at the CPUs the workers leave free (usable CPUs per
            device - the training loader's workers, at least 1) and puts the old count back when training ends;
            an int sets that count; ``None`` leaves torch's setting alone. Without a cap, torch's threads (one per
            CPU) and the workers (one per CPU but one) oversubscribe the CPUs: any host op large enough to be
            split wakes them all, and they take CPU time from the workers and from the training loop's own
            thread: on one H100 with 16 CPUs and 15 workers, torchvision's reference recipe fed ResNet-50 about
            three times faster with one thread than with torch's 16 (the docs' Benchmarks page, GPU part).
        device_half: How the package's DataModules run a recipe's device half (``device_transforms`` and
            ``batch_transforms``): ``"eager"`` (default: torchvision's ops as drawn), ``"static"`` (every parameter
            drawn on the host into one buffer, then one fixed sequence of ops: the same pixels and targets, bit for
            bit), ``"graphed"`` (the static half captured once as a CUDA graph and replayed each batch, the training
            thread's host time per batch cut to a few copies; CUDA only, eager elsewhere). The static forms take
            ``TrivialAugmentWide``, ``RandAugment``, ``RandomErasing``, ``MixUp``, ``CutMix`` (others are refused
            at setup, named). Eager stays the default until a GPU run measures the graphed half (the docs'
            Benchmarks page, GPU part).
    """

    def __init__(
        self,
        prefetch: bool = False,
        pin_memory: bool | None = None,
        num_workers: int | Literal["auto"] | None = None,
        channels_last: bool = True,
        log_every_n_steps: int | None = None,
        warn_threshold: float = 0.2,
        print_summary: bool = True,
        host_threads: int | Literal["auto"] | None = "auto",
        device_half: DeviceHalf = "eager",
    ) -> None:
        if num_workers is not None:
            resolve_num_workers(num_workers)  # validates (and raises) here, before training starts
        if (
            host_threads is not None
            and host_threads != "auto"
            and (isinstance(host_threads, bool) or not isinstance(host_threads, int) or host_threads < 1)
        ):
            raise InvalidValueError(f"host_threads should be a positive int, 'auto' or None, got {host_threads!r}.")
        self.host_threads = host_threads
        if device_half not in ("eager", "static", "graphed"):
            raise InvalidValueError(f"device_half should be 'eager', 'static' or 'graphed', got {device_half!r}.")
        self.device_half = device_half
        self._bar_checked = False  # the first training step on a GPU is looked at once for per-step waits
        self._threads_before: int | None = None  # torch's thread count before on_train_start capped it
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.num_workers = num_workers
        self.channels_last = channels_last
        self.monitor = DataWaitMonitor(log_every_n_steps, warn_threshold, print_summary)
        self._restore: Callable[[], None] | None = None  # undoes _wrap_foreign

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Hand the settings to the DataModule before Lightning asks it for loaders."""
        dm = getattr(trainer, "datamodule", None)
        device = trainer.strategy.root_device
        if isinstance(dm, FastDataModule):
            source = dm.configure_transfer(
                prefetch=self.prefetch,
                pin_memory=self.pin_memory,
                num_workers=self.num_workers,
                channels_last=self.channels_last,
                device_half=self.device_half,
            )
            kept = [name for name, who in source.items() if who == "DataModule"]
            own = f"; the DataModule's own {' and '.join(kept)} kept" if kept else ""
            rank_zero_info(
                f"lightning_fastdata: FastDataCallback on {type(dm).__name__}: prefetch={self.prefetch}, "
                f"device={device}, device_half={self.device_half}{own}."
            )
        elif dm is not None and stage == "fit" and self._restore is None:
            self._wrap_foreign(dm, device)
        else:
            rank_zero_warn(
                "FastDataCallback: no DataModule, so only the data-wait monitor applies (loaders passed to fit() or "
                "returned by the LightningModule are not prefetched). Pass a LightningDataModule to get prefetch."
            )

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Put a foreign DataModule's ``train_dataloader`` back as it was before :meth:`setup`."""
        if self._restore is not None:
            self._restore()
            self._restore = None

    def _wrap_foreign(self, dm: Any, device: Any) -> None:
        """Rebuild the foreign DataModule's train loader as its prefetching twin, each time it is asked for."""
        original = dm.train_dataloader
        own = vars(dm).get("train_dataloader", _NOT_SET)  # an instance attribute of the user's, if any
        callback = self

        def restore() -> None:
            if own is _NOT_SET:
                del dm.train_dataloader
            else:
                dm.train_dataloader = own

        def train_dataloader() -> Any:
            loader = original()
            if not isinstance(loader, DataLoader):
                rank_zero_warn(
                    f"FastDataCallback: {type(dm).__name__}.train_dataloader() returned {type(loader).__name__}, not a "
                    "DataLoader; it is used as is (no pinning, no prefetch)."
                )
                return loader
            twin = with_prefetch(loader, device if callback.prefetch else None, callback.pin_memory or None)
            if twin is None:
                rank_zero_warn(
                    f"FastDataCallback: {type(loader).__name__} is a DataLoader subclass this callback cannot rebuild; "
                    "it is used as is (no pinning, no prefetch). Plain DataLoader/StatefulDataLoader are prefetched."
                )
                return loader
            return twin

        dm.train_dataloader = train_dataloader
        self._restore = restore

    # -- the training process's intra-op threads --------------------------------------------------------------
    def host_thread_count(self, trainer: Trainer) -> int | None:
        """The intra-op thread count :meth:`on_train_start` sets for this Trainer, or ``None`` to leave torch's.

        ``"auto"``: only on an accelerator (a CPU run trains on those threads) and with loader workers; the usable
        CPUs (:class:`~lightning_fastdata.CpuBudget`) per device of this node less the training loader's workers.
        """
        if self.host_threads is None:
            return None
        if self.host_threads != "auto":
            return int(self.host_threads)
        if trainer.strategy.root_device.type == "cpu":
            return None
        workers = max((getattr(dl, "num_workers", 0) for dl in _loaders(trainer.train_dataloader)), default=0)
        return threads_beside_workers(workers, trainer.num_devices) if workers > 0 else None

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Cap torch's intra-op threads (``host_threads``) for the training loop; :meth:`on_train_end` undoes it."""
        wanted = self.host_thread_count(trainer)
        now = torch.get_num_threads()
        if wanted is not None and wanted != now:
            self._threads_before = now
            torch.set_num_threads(wanted)
            rank_zero_info(
                f"lightning_fastdata: torch's intra-op threads {now} -> {wanted} while training (the loader's workers "
                "have the other CPUs; FastDataCallback(host_threads=None) leaves them)."
            )

    def _restore_threads(self) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

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
        """Forwarded to the monitor; after the first step on a GPU, a warning if the step makes the host wait."""
        self.monitor.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self._bar_checked and pl_module.device.type == "cuda":
            self._bar_checked = True
            warning = progress_bar_wait_warning(step_progress_bar_values(trainer) or {})
            if warning:
                rank_zero_warn(warning)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_train_epoch_end(trainer, pl_module)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor; torch's intra-op thread count put back."""
        self._restore_threads()
        self.monitor.on_train_end(trainer, pl_module)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Torch's intra-op thread count put back when training stops on an exception."""
        self._restore_threads()

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Forwarded to the monitor."""
        self.monitor.on_fit_end(trainer, pl_module)


def progress_bar_wait_warning(values: dict[str, str]) -> str | None:
    """The warning for per-step progress-bar values on a device (``name -> device``), or ``None`` if there are none.

    Lightning turns every value logged with ``prog_bar=True`` into a Python number after every training step: for a
    tensor on a GPU, a wait for the whole step, so the host cannot prepare the next batch while the GPU trains.
    """
    on_device = sorted(name for name, device in values.items() if not device.startswith("cpu"))
    if not on_device:
        return None
    names = ", ".join(f"`{name}`" for name in on_device)
    return (
        f"lightning_fastdata: {names} {'is' if len(on_device) == 1 else 'are'} logged with prog_bar=True on "
        f"{values[on_device[0]]}: Lightning turns progress-bar values into numbers after every training step, which "
        "makes the host wait for the GPU each step (the next batch cannot be prepared meanwhile). Log per-step values "
        "without prog_bar=True (loggers and callbacks still get them), or show a copy made without a wait, as "
        "ImageClassifier does (the Training recipes guide, 'A wait for the GPU in every step')."
    )


def threads_beside_workers(workers: int, devices_per_node: int = 1, budget: CpuBudget | None = None) -> int:
    """The CPUs a rank's loader ``workers`` leave free (at least 1): ``usable // devices_per_node - workers``.

    ``budget``: the node's CPUs (:meth:`~lightning_fastdata.CpuBudget.detect` when ``None``).
    """
    budget = budget or CpuBudget.detect()
    return max(1, budget.usable // max(1, devices_per_node) - workers)


def _loaders(loaders: Any) -> list[Any]:
    """The loaders in what ``trainer.train_dataloader`` holds (one loader, a CombinedLoader, a list or a dict)."""
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    if isinstance(loaders, CombinedLoader):
        loaders = loaders.flattened
    if isinstance(loaders, dict):
        return list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    return [] if loaders is None else [loaders]
