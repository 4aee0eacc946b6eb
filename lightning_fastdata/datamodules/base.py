"""The one place that builds loaders; subclasses only build datasets."""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.loading.collate import collate_prebatched
from lightning_fastdata.loading.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalizer
from lightning_fastdata.loading.prefetch import enable_device_prefetch
from lightning_fastdata.loading.sampler import EpochSampler
from lightning_fastdata.loading.workers import init_worker, resolve_num_workers

__all__ = ["FastDataModule"]

log = logging.getLogger("lightning_fastdata")


class _TrainLoader(StatefulDataLoader):
    """The train loader: a ``StatefulDataLoader`` that the DataModule restores itself (per rank)."""

    _fastdata_restored = False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict``, unless the DataModule already restored this rank's own state."""
        if self._fastdata_restored:
            self._fastdata_restored = False
            return
        super().load_state_dict(state_dict)


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
            stalls behind one slow batch.
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
        self._train_loader: StatefulDataLoader | None = None
        self._pending_loader_state: dict[str, Any] | None = None
        self._restart_epoch: int | None = None
        self._skip_epoch = -1

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
            loader._fastdata_restored = True  # type: ignore[attr-defined]
            self._pending_loader_state = None
        elif self._restart_epoch is not None:
            loader.sampler.set_epoch(self._restart_epoch)
            loader._fastdata_restored = True  # type: ignore[attr-defined]
            self._restart_epoch = None
        self._train_loader = loader
        return loader

    def val_dataloader(self) -> DataLoader | list:
        """The validation loader, or ``[]`` when there is no validation set."""
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, train=False)

    def state_dict(self) -> dict[str, Any]:
        """Every rank's train-loader state (gathered: Lightning writes only rank 0's checkpoint)."""
        if self._train_loader is None:
            return {}
        state = self._train_loader.state_dict()
        sampler = self._train_loader.sampler
        world_size = 1
        states = [state]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world_size = torch.distributed.get_world_size()
            states = [None] * world_size  # type: ignore[list-item]
            torch.distributed.all_gather_object(states, state)
        return {"loader_states": states, "world_size": world_size, "epoch": getattr(sampler, "epoch", 0)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep this rank's loader state until :meth:`train_dataloader` makes the loader.

        A checkpoint from a different world size cannot continue the interrupted epoch sample-exactly (its
        shards were cut for another number of ranks): the epoch is restarted from its beginning on the new
        ranks, with a warning (samples already seen in that epoch are seen again).
        """
        states = state_dict.get("loader_states")
        if not states:
            return
        world_size, rank = self._world()[:2]
        if len(states) != world_size:
            rank_zero_warn(
                f"The checkpoint's loader state is from {len(states)} rank(s), this run has {world_size}: epoch "
                f"{state_dict['epoch']} restarts from its beginning (its samples seen before the checkpoint are "
                "seen again). Resume with the same number of devices for an exact continuation."
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
        loader: DataLoader
        if train:
            loader = _TrainLoader(dataset, snapshot_every_n_steps=self._snapshot_interval(), **kwargs)
        else:
            loader = DataLoader(dataset, **kwargs)
        if self.device_prefetch and self.trainer is not None:
            enable_device_prefetch(loader, self.trainer.strategy.root_device)
        return loader
