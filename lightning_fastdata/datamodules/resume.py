"""The train loader's resume state machine, in one object: what a checkpoint holds and what a resume does with it."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.datamodules.lightning_compat import reopen_epoch, shift_batches_done
from lightning_fastdata.loading.index.identity import check_same_data
from lightning_fastdata.loading.transport.loaders import PrefetchingStatefulDataLoader
from lightning_fastdata.loading.transport.torchdata_internals import sampler_state

__all__ = ["LoaderResume", "ResumableLoader", "quiet_torchdata_in_order"]

log = logging.getLogger("lightning_fastdata")


@contextmanager
def quiet_torchdata_in_order() -> Iterator[None]:
    """Drop torchdata's "in_order=False ... no guarantees for state management" log line while inside."""

    def drop(record: logging.LogRecord) -> bool:
        return "in_order=False" not in record.getMessage()

    torchdata_log = logging.getLogger(StatefulDataLoader.__module__)
    torchdata_log.addFilter(drop)
    try:
        yield
    finally:
        torchdata_log.removeFilter(drop)


class ResumableLoader(PrefetchingStatefulDataLoader):
    """The train loader: prefetching and stateful, with torchdata's contract whole.

    :meth:`state_dict` is this loader's exact state and :meth:`load_state_dict` resumes it (or refuses a state of
    other settings, naming them), in a notebook, a loop of one's own or another framework as in Lightning.

    Under a Trainer the DataModule's ``state_dict`` holds every rank's loader state (Lightning's fit loop saves rank
    0's alone, and loads that one into every rank's loader after ``train_dataloader()``). :class:`LoaderResume`
    restores this rank's own state when the DataModule builds the loader, and marks the loader restored
    (:meth:`restored_by_owner`): the fit loop's load that follows, before the loader's first iteration, is then
    ignored, so nothing is restored twice and no rank takes rank 0's position.
    """

    _owner_restored = False

    def __iter__(self) -> Any:
        self._owner_restored = False  # a later load_state_dict is a caller's own again
        return super().__iter__()

    def state_dict(self) -> dict[str, Any]:
        """The exact state after the batch last returned (torchdata's ``in_order=False`` notice said once)."""
        with nullcontext() if self.exact_state else quiet_torchdata_in_order():
            return super().state_dict()

    def state_before_current_batch(self) -> dict[str, Any]:
        """The state before the batch last returned: resuming from it trains that batch again."""
        with nullcontext() if self.exact_state else quiet_torchdata_in_order():
            return super().state_before_current_batch()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict``; ignored once after the DataModule restored this rank's own state.

        Raises:
            ValueError: If the state was saved with other settings (named).
        """
        if self._owner_restored:
            log.debug("Train loader: the fit loop's load of rank 0's state ignored (this rank's own is restored).")
            return
        super().load_state_dict(state_dict)

    def restored_by_owner(self) -> None:
        """Say the DataModule has restored (or continued, or restarted) this loader's epoch from its checkpoint."""
        self._owner_restored = True


class LoaderResume:
    """What a checkpoint asked of the train loader, from ``load_state_dict`` until the loader is built.

    States (one instance per DataModule):

    - *fresh*: nothing to restore (a new run, or a resume already carried out).
    - *continue*: :meth:`load` got a checkpoint saved by every rank of a world of this size. This rank's loader
      state waits in :attr:`rank_state` (torchdata's state: sampler epoch and position, worker snapshots), and
      :attr:`mid_epoch` holds the epoch if it was unfinished.
    - *elastic*: :meth:`load` got a checkpoint saved by every rank inside an epoch, and this run differs in world
      size, ``num_workers`` or ``batch_size``: :attr:`elastic` holds the epoch and every old rank's sampler
      position; the samples no old rank consumed are split over this run's ranks
      (:meth:`~lightning_fastdata.loading.sampler.EpochSampler.continue_epoch`), the next epochs are whole.
    - *restart*: the checkpoint lacks some rank's state (saved by one rank on an exception), or its sampler had
      another seed or dataset length: :attr:`restart_epoch` restarts from its beginning on every rank (warned).

    Transitions:

    - *fresh* -> *continue*, *elastic* or *restart*: :meth:`load`, from the DataModule's ``load_state_dict``.
    - *continue* / *elastic* / *restart* -> *fresh*: :meth:`apply`, from ``train_dataloader()`` when the loader is
      built. It loads the rank's state (or continues the epoch from the old ranks' positions, or sets the restart
      epoch on the sampler), reopens a mid-epoch epoch in Lightning's counters (an elastic one also shifts the
      epoch's batch count so that it ends with this loader's last batch). It marks the loader restored: the fit loop's
      own load that follows (rank 0's state for every rank; see
      :mod:`~lightning_fastdata.datamodules.lightning_compat`) is ignored (:class:`ResumableLoader`).

    :meth:`save` builds the checkpoint's content and changes no state. It includes the train dataset's identity
    (:mod:`~lightning_fastdata.loading.index.identity`), and :meth:`apply` refuses, naming what changed, to resume on
    data that differ from it: a position in another dataset's permutation would train the wrong samples.
    """

    def __init__(self) -> None:
        self.rank_state: dict[str, Any] | None = None
        self.mid_epoch: int | None = None
        self.restart_epoch: int | None = None
        self.elastic: dict[str, Any] | None = None
        self._fallback: dict[str, Any] | None = None  # *continue*'s elastic twin, for another batch size/workers
        self.data: dict[str, Any] | None = None  # the identity of the data the checkpoint's state describes

    @property
    def state(self) -> str:
        """``"fresh"``, ``"continue"``, ``"elastic"`` or ``"restart"``."""
        if self.rank_state is not None:
            return "continue"
        if self.elastic is not None:
            return "elastic"
        return "restart" if self.restart_epoch is not None else "fresh"

    def save(self, loader: ResumableLoader | None, interrupted: bool) -> dict[str, Any]:
        """Every rank's loader state (gathered: Lightning writes only rank 0's checkpoint).

        A checkpoint saved because a step failed (``interrupted``: ``OnExceptionCheckpoint``) holds the state
        *before* the failed batch, so that batch is trained after resume. Such a save may run on one rank only, so
        under DDP nothing is gathered then (a collective would wait forever for the others): the checkpoint holds
        this rank's state alone, and a resume from it restarts the epoch. Saves by ``ModelCheckpoint`` run on every
        rank and gather.
        """
        if loader is None:
            return {}
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
        identity = getattr(loader.dataset, "identity", None)
        return {
            "data": identity().state() if identity is not None else None,
            "loader_states": states,
            "world_size": world_size,
            "epoch": epoch,
            "mid_epoch": mid_epoch,
            # what an elastic resume compares: another batch size or worker count continues by samples
            "batch_size": loader.batch_size,
            "num_workers": loader.num_workers,
            "batches_done": done,
        }

    def load(self, saved: dict[str, Any], world_size: int, rank: int) -> None:
        """Keep what :meth:`save` wrote until :meth:`apply` (*fresh* -> *continue*, *elastic* or *restart*).

        The world size decides here; :meth:`apply` turns a *continue* into an *elastic* resume when the new loader's
        ``batch_size`` or ``num_workers`` differs from the checkpoint's (the effective values are known only then).
        """
        states = saved.get("loader_states")
        if not states:
            return
        epoch = int(saved["epoch"])
        self.rank_state, self.mid_epoch, self.restart_epoch, self.elastic = None, None, None, None
        self.data = saved.get("data")
        if all(s is not None for s in states):
            positions = [_sampler_position(s, saved.get("batch_size") or 1) for s in states]
            elastic = None
            if saved.get("mid_epoch") and all(p is not None for p in positions):
                elastic = {"epoch": epoch, "positions": positions, "saved": saved}
            if len(states) == world_size:
                self.rank_state = states[rank]
                self.mid_epoch = epoch if saved.get("mid_epoch") else None
                self._fallback = elastic
                return
            if not saved.get("mid_epoch"):  # an epoch-boundary checkpoint from another world size
                self.restart_epoch = epoch + 1  # the next epoch starts whole (torchdata's state is not loaded)
                return
            if elastic is not None:
                self.elastic = elastic
                return
            why = "holds no EpochSampler position"
        else:
            why = "lacks some ranks' state (saved by one rank on an exception)"
        rank_zero_warn(
            f"The checkpoint's loader state {why}: epoch {epoch} restarts from its beginning (its samples seen before "
            "the checkpoint are seen again). Resume from a checkpoint saved on all ranks (ModelCheckpoint) for an "
            "exact continuation."
        )
        self.restart_epoch = epoch

    def apply(self, loader: ResumableLoader, trainer: Any) -> None:
        """Carry out a pending resume on the new train loader (*continue* / *elastic* / *restart* -> *fresh*).

        Called when the loader is built rather than left to Lightning's fit loop: that one restores rank 0's state
        on every rank, and none at all if ``configure_optimizers`` loaded the data early (Lightning #20550).

        Raises:
            ValueError: If the loader's dataset is not the data the checkpoint's state was saved for (named).
        """
        identity = getattr(loader.dataset, "identity", None)
        if self.state != "fresh" and identity is not None:
            check_same_data(self.data, identity(), loader.dataset.describe)
        if self.rank_state is not None and self._fallback is not None:
            saved = self._fallback["saved"]
            if saved.get("batch_size") not in (None, loader.batch_size) or saved.get("num_workers") not in (
                None,
                loader.num_workers,
            ):
                self.rank_state, self.elastic = None, self._fallback
        self._fallback = None
        if self.rank_state is not None:
            loader.load_state_dict(self.rank_state)
            epoch = self.mid_epoch
            if epoch is not None and reopen_epoch(trainer, epoch):
                rank_zero_info(f"lightning_fastdata: resuming inside epoch {epoch}, where the checkpoint's loader was.")
        elif self.elastic is not None:
            self._continue_elastic(loader, trainer)
        elif self.restart_epoch is not None:
            loader.sampler.set_epoch(self.restart_epoch)
        else:
            return
        loader.restored_by_owner()
        self.rank_state, self.mid_epoch, self.restart_epoch, self.elastic = None, None, None, None

    def _continue_elastic(self, loader: ResumableLoader, trainer: Any) -> None:
        """Continue the interrupted epoch on this world: the samples no old rank consumed, split over the new ranks."""
        assert self.elastic is not None
        sampler, epoch, positions = loader.sampler, self.elastic["epoch"], self.elastic["positions"]
        saved = self.elastic["saved"]
        for position in positions:
            sampler.check_compatible(position)  # another seed or dataset size: an error saying so
        before = positions[0].get("consumed")
        mask = None
        if before:
            mask = np.unpackbits(np.frombuffer(before, dtype=np.uint8), count=sampler.slots).astype(bool)
        consumed = sampler.consumed_mask([int(p["yielded"]) for p in positions], epoch, mask)
        sampler.continue_epoch(epoch, consumed)
        batch = loader.batch_size or 1
        left = sampler.epoch_length()
        steps = left // batch if loader.drop_last else -(-left // batch)
        skipped = len(loader) - steps  # the epoch ends with this loader's last batch, in Lightning's counters
        reopened = reopen_epoch(trainer, epoch)
        shift_batches_done(trainer, skipped - int(saved.get("batches_done") or 0))
        rank_zero_info(
            f"lightning_fastdata: continuing epoch {epoch} on {sampler.num_replicas} rank(s) (the checkpoint is from "
            f"{len(positions)} rank(s), batch size {saved.get('batch_size')}, {saved.get('num_workers')} worker(s)): "
            f"{int(consumed.sum())} of its {sampler.length} samples were trained before it, {left} per rank are left "
            f"({steps} step(s)){' (reopened)' if reopened else ''}."
        )


def _sampler_position(state: Mapping[str, Any] | None, batch_size: int) -> dict[str, Any] | None:
    """This rank's :class:`~lightning_fastdata.loading.sampler.EpochSampler` position in a torchdata loader state.

    With sparse snapshots (``snapshot_every_n_steps``) the sampler state inside is the last snapshot's; the batches
    of ``batch_size`` returned after it (torchdata replays them on load) were consumed too, and are added to
    ``yielded``.
    """
    found = sampler_state(state)
    if found is None:
        return None
    position, steps_since = found
    position["yielded"] = int(position["yielded"]) + steps_since * batch_size
    return position
