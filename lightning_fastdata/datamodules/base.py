"""The one place that builds loaders; subclasses only build datasets."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.loading.collate import collate_prebatched
from lightning_fastdata.loading.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalizer
from lightning_fastdata.loading.prefetch import DevicePrefetcher, PrefetchIterator
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.workers import init_worker, resolve_num_workers

__all__ = ["FastDataModule"]

log = logging.getLogger("lightning_fastdata")


@contextmanager
def _quiet_torchdata_in_order() -> Iterator[None]:
    """Drop torchdata's "in_order=False ... no guarantees for state management" log line while inside."""

    def drop(record: logging.LogRecord) -> bool:
        return "in_order=False" not in record.getMessage()

    torchdata_log = logging.getLogger(StatefulDataLoader.__module__)
    torchdata_log.addFilter(drop)
    try:
        yield
    finally:
        torchdata_log.removeFilter(drop)


class _TrainLoader(StatefulDataLoader):
    """The train loader: a ``StatefulDataLoader`` that prefetches to a device and is restored per rank.

    Args:
        dataset: As ``StatefulDataLoader``'s.
        prefetch_device: Copy the next batch to this device while the current one trains (``None``: no
            look-ahead). A constructor argument, so that a copy Lightning re-instantiates keeps it.
        **kwargs: ``StatefulDataLoader``'s arguments.
    """

    def __init__(self, dataset: Dataset, prefetch_device: torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.prefetch_device = prefetch_device
        self._prefetcher = None if prefetch_device is None else DevicePrefetcher(prefetch_device)  # one stream
        self._current: weakref.ref[PrefetchIterator] | None = None
        self.restored = False  # the DataModule restored this rank's state: ignore Lightning's next load

    def __iter__(self) -> PrefetchIterator:  # type: ignore[override]
        exact = self.in_order or self.num_workers == 0  # out of order, torchdata keeps no state worth tracking
        it = PrefetchIterator(super().__iter__(), self._prefetcher, super().state_dict if exact else None)
        self._current = weakref.ref(it)
        return it

    def _iterator_now(self) -> PrefetchIterator | None:
        return None if self._current is None else self._current()

    def state_dict(self) -> dict[str, Any]:
        """The state after the batch last returned (a look-ahead batch is left out, so a resume replays it)."""
        it = self._iterator_now()
        if it is not None and it.state_after is not None:
            return it.state_after
        if self.num_workers > 0 and not self.in_order:
            with _quiet_torchdata_in_order():  # the DataModule warned once already
                return super().state_dict()
        return super().state_dict()

    def batches_done(self, before_current_batch: bool = False) -> int | None:
        """Batches of the current epoch already handed out (``None``: no epoch in progress)."""
        it = self._iterator_now()
        if it is None:
            return None
        return it.returned - (1 if before_current_batch and it.returned else 0)

    def state_before_current_batch(self) -> dict[str, Any]:
        """The state before the batch last returned: resuming from it trains that batch again."""
        it = self._iterator_now()
        if it is not None and it.state_before is not None:
            return it.state_before
        return self.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict``, unless the DataModule already restored this rank's own state."""
        if self.restored:
            self.restored = False
            return
        super().load_state_dict(state_dict)


class _EvalLoader(DataLoader):
    """The validation loader: a ``DataLoader`` that prefetches to ``prefetch_device`` (see :class:`_TrainLoader`)."""

    def __init__(self, dataset: Dataset, prefetch_device: torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.prefetch_device = prefetch_device
        self._prefetcher = None if prefetch_device is None else DevicePrefetcher(prefetch_device)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        inner = super().__iter__()
        return inner if self._prefetcher is None else PrefetchIterator(inner, self._prefetcher)


class FastDataModule(LightningDataModule):
    """Base of the package's DataModules: loaders, device-side normalisation, worker resolution.

    Loaders return ``(images, labels)`` with images uint8 ``N x 3 x H x W`` (channels-last); after they reach
    the training device, :meth:`on_after_batch_transfer` turns them into normalised float32, so a quarter of
    the bytes cross shared memory and PCIe. The train loader is a torchdata ``StatefulDataLoader``.

    Args:
        image_size: Side of the square training and validation images.
        scale: Area range of the training random crop (``RandomResizedCrop``'s ``scale``).
        ratio: Aspect-ratio range of the training random crop.
        crop_fraction: Validation crop as a fraction of the shorter side (0.875: 224 out of 256).
        on_corrupt: ``"raise"`` on a corrupt or truncated image (naming it), or ``"skip"`` it: each skipped image
            is logged and the count is reported after every epoch.
        val_fraction: Fraction of the data held out (seeded) for validation when the subclass has no separate
            validation source; 0 for none.
        batch_size: Samples per batch (per rank under DDP).
        num_workers: Loader worker processes, or ``"auto"``: usable CPUs (affinity capped by the cgroup quota)
            divided by the devices on this node, minus one for the main process.
        pin_memory: Pin host batches; ``None`` pins when the Trainer's accelerator is CUDA.
        persistent_workers: Keep workers alive across epochs; ``None`` means yes whenever there are workers.
        prefetch_factor: Batches loaded ahead per worker (torch's default 2 when ``None``).
        shuffle: Reshuffle the training set every epoch.
        drop_last: Drop the last incomplete training batch.
        seed: Seed of shuffling, augmentation and the validation split; same on every rank.
        mean: Per-channel mean (0-1 scale) for normalisation on the device.
        std: Per-channel standard deviation (0-1 scale).
        in_order: Return batches in sampler order (torch's ``in_order``); ``False`` trades order for fewer
            stalls behind one slow batch, and with workers gives up exact mid-epoch resume (torchdata keeps no
            reliable state then; warned once).
        snapshot_every_n_steps: How often the train loader snapshots worker state (torchdata's argument). A
            resume replays the batches since the last snapshot (up to N - 1), and a snapshot every step costs
            (torchdata#1317). ``None``: the Trainer's ``ModelCheckpoint(every_n_train_steps=...)`` interval if
            there is one (snapshots then coincide with checkpoints), else 1.
        block_shuffle: Shuffle blocks of this many consecutive samples instead of single samples (sequential
            reads; less random batches, see :class:`~lightning_fastdata.EpochSampler`). ``None``: full shuffle.

    Raises:
        ValueError: On an impossible combination, e.g. ``prefetch_factor`` with ``num_workers=0``.
    """

    def __init__(
        self,
        image_size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        crop_fraction: float = 0.875,
        on_corrupt: Literal["raise", "skip"] = "raise",
        val_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = None,
        block_shuffle: int | None = None,
    ) -> None:
        super().__init__()
        if image_size <= 0:
            raise ValueError(f"image_size should be a positive int, got {image_size!r}.")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction should be in [0, 1), got {val_fraction!r}.")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}.")
        resolve_num_workers(num_workers)  # validates; resolved again once the Trainer's device count is known
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                f"prefetch_factor={prefetch_factor!r} needs worker processes; use num_workers > 0 or leave "
                "prefetch_factor unset."
            )
        if num_workers == 0 and persistent_workers:
            raise ValueError("persistent_workers=True needs worker processes; use num_workers > 0.")
        if prefetch_factor is not None and prefetch_factor < 1:
            raise ValueError(f"prefetch_factor should be a positive int, got {prefetch_factor!r}.")
        if block_shuffle is not None and block_shuffle < 1:
            raise ValueError(f"block_shuffle should be a positive int or None, got {block_shuffle!r}.")
        if snapshot_every_n_steps is not None and snapshot_every_n_steps < 1:
            raise ValueError(f"snapshot_every_n_steps should be a positive int, got {snapshot_every_n_steps!r}.")
        self.val_fraction = val_fraction
        # What every image dataset of the package takes; validated again (with messages) by the datasets.
        self.dataset_kwargs: dict[str, Any] = dict(
            image_size=image_size,
            scale=scale,
            ratio=ratio,
            crop_fraction=crop_fraction,
            seed=seed,
            on_corrupt=on_corrupt,
        )
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.in_order = in_order
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.block_shuffle = block_shuffle
        self.normalizer = Normalizer(mean, std)
        # Set by FastDataCallback (or by hand): copy batches to the device on a side stream one step ahead,
        # and the memory format of the images after transfer.
        self.device_prefetch = False
        self.channels_last = True
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self._resolved_workers: int | None = None
        # Exact resume (see state_dict): the train loader, and its state for this rank from a checkpoint.
        self._train_loader: _TrainLoader | None = None
        self._pending_loader_state: dict[str, Any] | None = None
        self._restart_epoch: int | None = None
        self._skip_epoch = -1
        self._warned_in_order = False
        self._resumed_mid_epoch: int | None = None

    # -- what subclasses provide -----------------------------------------------------------------------
    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Return ``(train_dataset, val_dataset_or_None)``; called once, from :meth:`setup`."""
        raise NotImplementedError

    def split(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Seeded train/validation split of ``range(n)`` by ``val_fraction`` (same on every rank), each sorted."""
        if self.val_fraction == 0:
            return np.arange(n), None
        order = np.random.default_rng(self.seed).permutation(n)
        n_val = max(1, int(round(n * self.val_fraction)))
        return np.sort(order[n_val:]), np.sort(order[:n_val])

    # -- Lightning hooks -------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Build the datasets once (every rank builds its own; they are cheap indexes)."""
        if self.train_dataset is None:
            self.train_dataset, self.val_dataset = self.build_datasets()

    def train_dataloader(self) -> StatefulDataLoader:
        """The training loader: shuffled per epoch, sharded across ranks, stateful."""
        if self.train_dataset is None:
            raise RuntimeError(f"{type(self).__name__}.train_dataloader() needs setup('fit') to run first.")
        loader = self._loader(self.train_dataset, train=True)
        if self._pending_loader_state is not None:
            # Restored here, when the loader is made, rather than by Lightning's fit loop: that one restores
            # rank 0's state on every rank, and not at all if configure_optimizers loaded the data early
            # (Lightning #20550). Lightning's later load_state_dict call on this loader is then ignored.
            loader.load_state_dict(self._pending_loader_state)
            loader.restored = True
            self._pending_loader_state = None
            if self._resumed_mid_epoch is not None:
                self._align_fit_loop(self._resumed_mid_epoch)
        elif self._restart_epoch is not None:
            loader.sampler.set_epoch(self._restart_epoch)
            loader.restored = True
            self._restart_epoch = None
        self._train_loader = loader
        return loader

    def val_dataloader(self) -> DataLoader | list:
        """The validation loader, or ``[]`` when there is no validation set."""
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, train=False)

    def state_dict(self) -> dict[str, Any]:
        """Every rank's train-loader state (gathered: Lightning writes only rank 0's checkpoint).

        A checkpoint saved because a step failed (``OnExceptionCheckpoint``: the Trainer is interrupted) holds
        the state *before* the failed batch, so that batch is trained after resume. Such a save may run on one
        rank only, so under DDP nothing is gathered then (a collective would wait forever for the others): the
        checkpoint holds this rank's state alone, and a resume from it restarts the epoch on every rank (warned).
        Saves by ``ModelCheckpoint`` run on every rank and gather.
        """
        loader = self._train_loader
        if loader is None:
            return {}
        trainer = self.trainer
        interrupted = trainer is not None and trainer.interrupted
        state = loader.state_before_current_batch() if interrupted else loader.state_dict()
        world_size, rank = 1, 0
        states: list[dict[str, Any] | None] = [state]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world_size, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
            states = [None] * world_size
            if interrupted:
                states[rank] = state
            else:
                torch.distributed.all_gather_object(states, state)
        epoch = getattr(loader.sampler, "epoch", 0)
        done = loader.batches_done(before_current_batch=interrupted)
        mid_epoch = done is not None and done < len(loader)
        return {"loader_states": states, "world_size": world_size, "epoch": epoch, "mid_epoch": mid_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep this rank's loader state until :meth:`train_dataloader` makes the loader.

        A checkpoint from a different world size cannot continue the interrupted epoch sample-exactly (its
        shards were cut for another number of ranks), nor can one that lacks some rank's state (saved by one
        rank on an exception): the epoch is restarted from its beginning on every rank, with a warning (its
        samples seen before the checkpoint are seen again).
        """
        states = state_dict.get("loader_states")
        if not states:
            return
        self._resumed_mid_epoch = int(state_dict["epoch"]) if state_dict.get("mid_epoch") else None
        world_size, rank = self._world()[:2]
        if len(states) != world_size or any(s is None for s in states):
            why = (
                f"is from {len(states)} rank(s), this run has {world_size}"
                if len(states) != world_size
                else "lacks some ranks' state (saved by one rank on an exception)"
            )
            rank_zero_warn(
                f"The checkpoint's loader state {why}: epoch {state_dict['epoch']} restarts from its beginning (its "
                "samples seen before the checkpoint are seen again). Resume with the same number of devices, from a "
                "checkpoint saved on all ranks (ModelCheckpoint), for an exact continuation."
            )
            self._restart_epoch = int(state_dict["epoch"])
            return
        self._pending_loader_state = states[rank]

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Report corrupt images skipped in the epoch that just ended (``on_corrupt='skip'``)."""
        trainer = self.trainer
        if trainer is not None and trainer.training and trainer.current_epoch != self._skip_epoch:
            if self._skip_epoch >= 0:
                self._report_skipped(self._skip_epoch)
            self._skip_epoch = trainer.current_epoch
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Convert the uint8 images of ``(images, labels, ...)`` to normalised float on the device."""
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            if batch[0].dtype == torch.uint8:
                return (self.format_images(self.normalizer(batch[0])), *batch[1:])
        return batch

    def format_images(self, images: torch.Tensor) -> torch.Tensor:
        """Apply the output memory format (``channels_last``, the default, or contiguous NCHW)."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return images.contiguous(memory_format=fmt)

    def teardown(self, stage: str) -> None:
        """Report skipped images of the last epoch."""
        if self._skip_epoch >= 0:
            self._report_skipped(self._skip_epoch)
            self._skip_epoch = -1

    def _align_fit_loop(self, epoch: int) -> None:
        """Make Lightning count the resumed epoch as unfinished when the loader state says it is.

        When ``max_steps`` stops a run in the middle of an epoch, Lightning still ends the epoch (its counters say
        "processed", "completed") and saves ``last.ckpt`` so; resumed from it, the fit loop started the next epoch
        (``Epoch 1: 6/15`` while epoch 0's remaining samples were served, and epoch 1's permutation was then
        skipped). The counters are put back to "epoch started, not processed"; called from ``train_dataloader()``,
        which the fit loop calls before it derives its restart stage from them.
        """
        fit_loop = getattr(self.trainer, "fit_loop", None)
        progress = getattr(fit_loop, "epoch_progress", None)
        if progress is not None and progress.current.started == epoch + 1 and progress.current.processed == epoch + 1:
            for tracker in (progress.total, progress.current):
                if tracker.completed == tracker.processed:
                    tracker.completed -= 1
                tracker.processed -= 1
            rank_zero_info(f"lightning_fastdata: resuming inside epoch {epoch}, where the checkpoint's loader stopped.")
        self._resumed_mid_epoch = None

    # -- the one place loaders are built ---------------------------------------------------------------
    def _report_skipped(self, epoch: int) -> None:
        count = getattr(self.train_dataset, "skipped_count", lambda epoch: 0)(epoch)
        if count:
            rank_zero_warn(f"Epoch {epoch}: skipped {count} corrupt image(s) (on_corrupt='skip'); see the log.")
            self.train_dataset.reset_skipped_count(epoch)  # type: ignore[union-attr]

    def _world(self) -> tuple[int, int, int]:
        """``(world_size, global_rank, devices_per_node)`` from the attached Trainer, else a single process."""
        trainer = self.trainer
        if trainer is None:
            return 1, 0, 1
        return trainer.world_size, trainer.global_rank, max(1, trainer.num_devices)

    def _resolve_workers(self, devices_per_node: int) -> int:
        if self._resolved_workers is None:
            self._resolved_workers = resolve_num_workers(self.num_workers, devices_per_node)
            if self.num_workers == "auto":
                rank_zero_info(f"lightning_fastdata: num_workers='auto' resolved to {self._resolved_workers}.")
        return self._resolved_workers

    def _snapshot_interval(self) -> int:
        if self.snapshot_every_n_steps is not None:
            return self.snapshot_every_n_steps
        # ModelCheckpoint keeps its interval only as _every_n_train_steps (no public accessor); read it softly.
        checkpoints = self.trainer.checkpoint_callbacks if self.trainer is not None else []
        intervals = [n for n in (getattr(cb, "_every_n_train_steps", 0) for cb in checkpoints) if n]
        return min(intervals) if intervals else 1

    def _use_pin_memory(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        trainer = self.trainer
        if trainer is None:
            return False
        return trainer.strategy.root_device.type == "cuda"

    def _loader(self, dataset: Dataset, train: bool) -> Any:
        world_size, rank, devices = self._world()
        workers = self._resolve_workers(devices)
        sampler = EpochSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=self.shuffle and train,
            seed=self.seed,
            drop_last=self.drop_last and train,
            block_size=self.block_shuffle if train else None,
        )
        persistent = workers > 0 if self.persistent_workers is None else (self.persistent_workers and workers > 0)
        kwargs: dict[str, Any] = dict(
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=collate_prebatched,
            pin_memory=self._use_pin_memory(),
            drop_last=self.drop_last and train,
            worker_init_fn=init_worker,
            persistent_workers=persistent,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            in_order=self.in_order,
            # Worker seeds follow the DataModule's seed, so a run is reproducible end to end.
            generator=torch.Generator().manual_seed(self.seed + rank),
        )
        kwargs["prefetch_device"] = (
            self.trainer.strategy.root_device if self.device_prefetch and self.trainer is not None else None
        )
        loader: DataLoader
        if train:
            if workers > 0 and not self.in_order:
                if not self._warned_in_order:
                    rank_zero_warn(
                        "in_order=False with worker processes gives up exact mid-epoch resume: a run resumed from a "
                        "checkpoint may repeat or skip samples of the interrupted epoch. Use in_order=True (the "
                        "default) where exact resume matters."
                    )
                    self._warned_in_order = True
                with _quiet_torchdata_in_order():  # said once above, instead of at every loader and state_dict
                    loader = _TrainLoader(dataset, snapshot_every_n_steps=self._snapshot_interval(), **kwargs)
            else:
                loader = _TrainLoader(dataset, snapshot_every_n_steps=self._snapshot_interval(), **kwargs)
        else:
            loader = _EvalLoader(dataset, **kwargs)
        return loader
