"""How a DataModule's loaders are built: sampler (and its draws), workers, transport, pinned memory, prefetch."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from lightning_fastdata.datamodules.lightning_compat import checkpoint_step_intervals
from lightning_fastdata.datamodules.resume import LoaderResume, ResumableLoader, quiet_torchdata_in_order
from lightning_fastdata.datamodules.transfer import DeviceTransferHooks
from lightning_fastdata.datasets.base import LoaderPlan
from lightning_fastdata.loading.sampler import BatchLookahead, EpochSampler
from lightning_fastdata.loading.sampling import EpochDraws, SamplingSettings, Subset
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.loading.transport.shm_pool import BatchTransport
from lightning_fastdata.loading.workers import init_worker, resolve_num_workers

__all__ = ["LoaderBuilding"]


class LoaderBuilding(DeviceTransferHooks):
    """The loader building of :class:`~lightning_fastdata.FastDataModule` (the one place loaders are made).

    Every loader gets an :class:`~lightning_fastdata.EpochSampler`: training ones shuffled per epoch, sharded with
    equal counts, with the draws of the sampling settings (weights, ``epoch_size``, a subset); evaluation ones every
    sample (of the classes kept) exactly once over all ranks, in order.
    """

    # set by the DataModule (its arguments, validated)
    sampling: SamplingSettings
    data_classes: tuple[str, ...]
    seed: int
    shuffle: bool
    drop_last: bool
    block_shuffle: int | None
    repeated_augmentations: int
    batch_size: int
    persistent_workers: bool | None
    prefetch_factor: int | None
    in_order: bool
    batch_transport: BatchTransport
    snapshot_every_n_steps: int | None
    resume: LoaderResume
    _warned_in_order: bool

    def _sampling_settings(self, dataset: Dataset, train: bool) -> SamplingSettings:
        """The sampling settings ``dataset``'s loader draws with: this module's (a mix adds its sources' weights)."""
        return self.sampling

    def _sampling_of(self, dataset: Dataset, train: bool) -> tuple[Subset | None, EpochDraws | None]:
        """The subset and (training) draws of ``dataset`` under the sampling settings; ``(None, None)``: plain."""
        settings = self._sampling_settings(dataset, train)
        if not settings.changes_draws or not train and not settings.subsets:
            return None, None
        targets = np.asarray(dataset.targets)  # type: ignore[attr-defined]
        subset = settings.subset(targets, self.data_classes, train, self.seed)
        if train:
            return subset, settings.draws(targets, subset, self.shuffle)
        if subset.rows is None:
            return subset, None
        return subset, EpochDraws.in_order(subset.rows)  # evaluation: the kept samples, each once, in order

    def _world(self) -> tuple[int, int, int]:
        """``(world_size, global_rank, devices_per_node)`` from the attached Trainer, else a single process."""
        trainer = self.trainer
        if trainer is None:
            return 1, 0, 1
        return trainer.world_size, trainer.global_rank, max(1, trainer.num_devices)

    def _resolve_workers(self, devices_per_node: int) -> int:
        if self._resolved_workers is None:
            offered = self._offered_workers
            wanted = offered if self.num_workers == "auto" and offered is not None else self.num_workers
            self._resolved_workers = resolve_num_workers(wanted, devices_per_node)
            if wanted == "auto":
                rank_zero_info(f"lightning_fastdata: num_workers='auto' resolved to {self._resolved_workers}.")
        return self._resolved_workers

    def _snapshot_interval(self) -> int:
        if self.snapshot_every_n_steps is not None:
            return self.snapshot_every_n_steps
        intervals = checkpoint_step_intervals(self.trainer)
        if intervals is None:
            rank_zero_warn(
                "lightning_fastdata: cannot read the step interval of a checkpoint callback (this Lightning has no "
                "ModelCheckpoint._every_n_train_steps); loader snapshots are taken every step. Pass "
                "snapshot_every_n_steps= to the DataModule to choose."
            )
        return min(intervals) if intervals else 1

    def _use_pin_memory(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        if self._offered_pin_memory is not None:
            return self._offered_pin_memory
        trainer = self.trainer
        if trainer is None:
            return False
        return trainer.strategy.root_device.type == "cuda"

    def _prefetch_device(self) -> torch.device | str | None:
        if not self._prefetch:
            return None
        if self._prefetch_to is not None:
            return self._prefetch_to
        return None if self.trainer is None else self.trainer.strategy.root_device

    def _loader(self, dataset: Dataset, train: bool, labelled: bool = True, label_map: np.ndarray | None = None) -> Any:
        """The loader of ``dataset``: training (``train``: shuffled, stateful) or evaluation.

        ``labelled=False`` (predict): no subset, no label mapped. ``label_map``: the labels in another class list
        (a mix's source), where no subset maps them.
        """
        world_size, rank, devices = self._world()
        workers = self._resolve_workers(devices)
        subset, draws = self._sampling_of(dataset, train) if labelled else (None, None)
        sampler = EpochSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=self.shuffle and train,
            seed=self.seed,
            drop_last=self.drop_last and train,
            block_size=self.block_shuffle if train else None,
            repeats=self.repeated_augmentations if train else 1,
            even=train,  # evaluation: every sample once over all ranks, so N ranks' metrics equal one rank's
            draws=draws,
        )
        if hasattr(dataset, "for_loader"):  # this package's datasets, and a mix of them
            # the next batch's reads start early (from a bucket)
            ahead = train and workers > 0 and self.in_order and getattr(dataset, "reads_ahead", False) and not draws
            plan = LoaderPlan(
                return_keys=train and bool(self.device_augment),
                lookahead=BatchLookahead(sampler) if ahead else None,
                epoch_samples=len(sampler),  # what max_corrupt_fraction is a fraction of
                label_map=label_map if subset is None or subset.label_map is None else subset.label_map,
                predicting=not labelled,
            )
            dataset = dataset.for_loader(plan)
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
            batch_transport=self.batch_transport,
            # Worker seeds follow the DataModule's seed, so a run is reproducible end to end.
            generator=torch.Generator().manual_seed(self.seed + rank),
        )
        kwargs["prefetch_device"] = self._prefetch_device()
        loader: DataLoader
        if train:
            exact = self.in_order or workers == 0
            if not exact and not self._warned_in_order:
                rank_zero_warn(
                    "in_order=False with worker processes gives up exact mid-epoch resume: a run resumed from a "
                    "checkpoint may repeat or skip samples of the interrupted epoch. Use in_order=True (the "
                    "default) where exact resume matters."
                )
                self._warned_in_order = True
            # Said once above, instead of by torchdata at every loader and state_dict.
            with nullcontext() if exact else quiet_torchdata_in_order():
                loader = ResumableLoader(dataset, snapshot_every_n_steps=self._snapshot_interval(), **kwargs)
        else:
            loader = PrefetchingDataLoader(dataset, **kwargs)
        return loader
