"""How a DataModule's loaders are built: sampler (and its draws), workers, transport, pinned memory, prefetch.

:class:`LoaderSettings` holds the loader arguments of :class:`~lightning_fastdata.FastDataModule` (validated when
it is made); :class:`LoaderFactory`, which the DataModule owns, builds every loader from them, the DataModule's
:class:`~lightning_fastdata.datamodules.transfer.DeviceTransfer` (workers, pinned memory, prefetch) and what the
DataModule says of the dataset (its subset and draws, the device work, a label map).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from lightning_fastdata.datamodules.lightning_compat import checkpoint_step_intervals
from lightning_fastdata.datamodules.resume import ResumableLoader, quiet_torchdata_in_order
from lightning_fastdata.datamodules.transfer import DeviceTransfer
from lightning_fastdata.datasets.base import LoaderPlan
from lightning_fastdata.datasets.group_reads import keep_for_random_reads
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.jpeg.device import check_device_decode
from lightning_fastdata.loading.sampler import BatchLookahead, EpochSampler
from lightning_fastdata.loading.sampling import EpochDraws, SamplingSettings, Subset
from lightning_fastdata.loading.transport.collate import collate_prebatched
from lightning_fastdata.loading.transport.loaders import PrefetchingDataLoader
from lightning_fastdata.loading.transport.shm_pool import BatchTransport
from lightning_fastdata.loading.workers import init_worker

__all__ = ["LoaderFactory", "LoaderSettings", "world_of"]


@dataclass
class LoaderSettings:
    """A DataModule's loader arguments (``FastDataModule``'s names and meanings), validated by it."""

    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    persistent_workers: bool | None
    prefetch_factor: int | None
    in_order: bool
    snapshot_every_n_steps: int | None
    block_shuffle: int | None
    batch_transport: BatchTransport
    repeated_augmentations: int


def world_of(trainer: Any) -> tuple[int, int, int]:
    """``(world_size, global_rank, devices_per_node)`` of ``trainer``, else (``None``) a single process."""
    if trainer is None:
        return 1, 0, 1
    return trainer.world_size, trainer.global_rank, max(1, trainer.num_devices)


class LoaderFactory:
    """Builds a DataModule's loaders (the one place they are made).

    Every loader gets an :class:`~lightning_fastdata.EpochSampler`: training ones shuffled per epoch, sharded with
    equal counts, with the draws of the sampling settings (weights, ``epoch_size``, a subset); evaluation ones every
    sample (of the classes kept) exactly once over all ranks, in order. Training loaders are
    :class:`~lightning_fastdata.datamodules.resume.ResumableLoader` (stateful), the others
    :class:`~lightning_fastdata.loading.transport.loaders.PrefetchingDataLoader`.

    Args:
        settings: The loader arguments.
        transfer: The DataModule's transfer settings (workers, pinned memory, prefetch).
    """

    def __init__(self, settings: LoaderSettings, transfer: DeviceTransfer) -> None:
        self.settings = settings
        self.transfer = transfer
        self._warned_in_order = False

    def sampling_of(
        self, settings: SamplingSettings, dataset: Dataset, classes: tuple[str, ...], train: bool
    ) -> tuple[Subset | None, EpochDraws | None]:
        """The subset and (training) draws of ``dataset`` (its data's ``classes``) under ``settings``.

        ``(None, None)``: a plain epoch; an evaluation split keeps only its subset's samples, each once, in order.
        """
        if not settings.changes_draws or not train and not settings.subsets:
            return None, None
        targets = np.asarray(dataset.targets)  # type: ignore[attr-defined]
        subset = settings.subset(targets, classes, train, self.settings.seed)
        if train:
            return subset, settings.draws(targets, subset, self.settings.shuffle)
        if subset.rows is None:
            return subset, None
        return subset, EpochDraws.in_order(subset.rows)

    def snapshot_interval(self, trainer: Any) -> int:
        """Steps between the train loader's snapshots: the argument, else the checkpoint interval, else 1."""
        if self.settings.snapshot_every_n_steps is not None:
            return self.settings.snapshot_every_n_steps
        intervals = checkpoint_step_intervals(trainer)
        if intervals is None:
            rank_zero_warn(
                "lightning_fastdata: cannot read the step interval of a checkpoint callback (this Lightning has no "
                "ModelCheckpoint._every_n_train_steps); loader snapshots are taken every step. Pass "
                "snapshot_every_n_steps= to the DataModule to choose."
            )
        return min(intervals) if intervals else 1

    def build(
        self,
        dataset: Dataset,
        trainer: Any,
        train: bool,
        sampling: tuple[Subset | None, EpochDraws | None] = (None, None),
        return_keys: bool = False,
        label_map: np.ndarray | None = None,
        predicting: bool = False,
    ) -> Any:
        """The loader of ``dataset``: training (``train``: shuffled, stateful) or evaluation.

        ``sampling``: its subset and draws (the DataModule's sampling settings); ``return_keys``: batches carry their
        keys (the device has work to do on them); ``label_map``: the labels in another class list (a mix's source),
        where no subset maps them; ``predicting``: a ``trainer.predict`` loader.
        """
        s = self.settings
        decode_on_device = self.transfer.decode_on == "device"
        if decode_on_device and not hasattr(dataset, "for_loader"):
            raise InvalidValueError(
                f"decode_on='device' decodes the JPEGs of this package's image-and-label datasets; this loader reads "
                f"a {type(dataset).__name__}, whose batches the workers make whole: leave decode_on='workers'."
            )
        if decode_on_device and trainer is not None:
            check_device_decode(trainer.strategy.root_device)
        world_size, rank, devices = world_of(trainer)
        workers = self.transfer.workers(devices)
        subset, draws = sampling
        sampler = EpochSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=world_size,
            rank=rank,
            shuffle=s.shuffle and train,
            seed=s.seed,
            drop_last=s.drop_last and train,
            block_size=s.block_shuffle if train else None,
            repeats=s.repeated_augmentations if train else 1,
            even=train,  # evaluation: every sample once over all ranks, so N ranks' metrics equal one rank's
            draws=draws,
            # a dataset read in groups (Parquet row groups) shuffles in windows of them, unless told otherwise
            windows=getattr(dataset, "windows", None) if train and draws is None and not s.block_shuffle else None,
            # batches of one aspect-ratio group each (detection's grouping), where the dataset has them
            groups=getattr(dataset, "aspect_groups", None) if train else None,
            group_size=s.batch_size,
        )
        if train and sampler.windows is None and not sampler.block_size and (sampler.shuffle or draws is not None):
            keep_for_random_reads(dataset)  # group reads (Parquet row groups) in a random order: keep what fits
        if hasattr(dataset, "for_loader"):  # this package's datasets, and a mix of them
            # the next batch's reads start early (from a bucket)
            ahead = train and workers > 0 and s.in_order and getattr(dataset, "reads_ahead", False) and not draws
            plan = LoaderPlan(
                return_keys=train and return_keys,
                lookahead=BatchLookahead(sampler) if ahead else None,
                epoch_samples=len(sampler),  # what max_corrupt_fraction is a fraction of
                label_map=label_map if subset is None or subset.label_map is None else subset.label_map,
                predicting=predicting,
                decode_on_device=decode_on_device,
            )
            dataset = dataset.for_loader(plan)
        elif train and workers > 0 and s.in_order and getattr(dataset, "reads_ahead", False) and not draws:
            dataset = dataset.reading_ahead(BatchLookahead(sampler))  # type: ignore[attr-defined]  # the next runs early
        persistent = workers > 0 if s.persistent_workers is None else (s.persistent_workers and workers > 0)
        kwargs: dict[str, Any] = dict(
            batch_size=s.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=collate_prebatched,
            pin_memory=self.transfer.use_pin_memory(trainer),
            drop_last=s.drop_last and train,
            worker_init_fn=init_worker,
            persistent_workers=persistent,
            prefetch_factor=s.prefetch_factor if workers > 0 else None,
            in_order=s.in_order,
            batch_transport=s.batch_transport,
            # Worker seeds follow the DataModule's seed, so a run is reproducible end to end.
            generator=torch.Generator().manual_seed(s.seed + rank),
            prefetch_device=self.transfer.prefetch_device(trainer),
        )
        if not train:
            return PrefetchingDataLoader(dataset, **kwargs)
        exact = s.in_order or workers == 0
        if not exact and not self._warned_in_order:
            rank_zero_warn(
                "in_order=False with worker processes gives up exact mid-epoch resume: a run resumed from a "
                "checkpoint may repeat or skip samples of the interrupted epoch. Use in_order=True (the "
                "default) where exact resume matters."
            )
            self._warned_in_order = True
        loader: DataLoader
        # Said once above, instead of by torchdata at every loader and state_dict.
        with nullcontext() if exact else quiet_torchdata_in_order():
            loader = ResumableLoader(dataset, snapshot_every_n_steps=self.snapshot_interval(trainer), **kwargs)
        return loader
