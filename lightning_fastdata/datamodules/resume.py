"""The train loader's resume state machine, in one object: what a checkpoint holds and what a resume does with it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_fastdata.datamodules.lightning_compat import reopen_epoch
from lightning_fastdata.loading.loaders import PrefetchingStatefulDataLoader

__all__ = ["LoaderResume", "ResumableLoader", "quiet_torchdata_in_order"]


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
    """The train loader: prefetching and stateful; restored per rank by :class:`LoaderResume`, not by Lightning.

    Lightning's fit loop loads rank 0's loader state into every rank's loader after ``train_dataloader()``;
    :meth:`LoaderResume.apply` has already loaded this rank's own state then, and sets :attr:`skip_next_load`.
    """

    skip_next_load = False

    def state_dict(self) -> dict[str, Any]:
        """The state after the batch last returned (torchdata's in_order=False warning is said once, elsewhere)."""
        with nullcontext() if self.exact_state else quiet_torchdata_in_order():
            return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load ``state_dict``, unless :class:`LoaderResume` restored this rank's own state just before."""
        if self.skip_next_load:
            self.skip_next_load = False
            return
        super().load_state_dict(state_dict)


class LoaderResume:
    """What a checkpoint asked of the train loader, from ``load_state_dict`` until the loader is built.

    States (one instance per DataModule):

    - *fresh*: nothing to restore (a new run, or a resume already carried out).
    - *continue*: :meth:`load` got a checkpoint saved by every rank of a world of this size. This rank's loader
      state waits in :attr:`rank_state` (torchdata's state: sampler epoch and position, worker snapshots), and
      :attr:`mid_epoch` holds the epoch if it was unfinished.
    - *restart*: the checkpoint is from another world size, or lacks some rank's state (saved by one rank on an
      exception): :attr:`restart_epoch` restarts from its beginning on every rank (warned in :meth:`load`).

    Transitions:

    - *fresh* -> *continue* or *restart*: :meth:`load`, from the DataModule's ``load_state_dict``.
    - *continue* / *restart* -> *fresh*: :meth:`apply`, from ``train_dataloader()`` when the loader is built. It
      loads the rank's state (or sets the restart epoch on the sampler), reopens a mid-epoch epoch in Lightning's
      counters, and makes the loader ignore the fit loop's own load that follows (rank 0's state for every rank;
      see :mod:`~lightning_fastdata.datamodules.lightning_compat`).

    :meth:`save` builds the checkpoint's content and changes no state.
    """

    def __init__(self) -> None:
        self.rank_state: dict[str, Any] | None = None
        self.mid_epoch: int | None = None
        self.restart_epoch: int | None = None

    @property
    def state(self) -> str:
        """``"fresh"``, ``"continue"`` or ``"restart"``."""
        return "continue" if self.rank_state is not None else "restart" if self.restart_epoch is not None else "fresh"

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
        return {"loader_states": states, "world_size": world_size, "epoch": epoch, "mid_epoch": mid_epoch}

    def load(self, saved: dict[str, Any], world_size: int, rank: int) -> None:
        """Keep what :meth:`save` wrote for this rank until :meth:`apply` (*fresh* -> *continue* or *restart*)."""
        states = saved.get("loader_states")
        if not states:
            return
        epoch = int(saved["epoch"])
        if len(states) == world_size and all(s is not None for s in states):
            self.rank_state, self.restart_epoch = states[rank], None
            self.mid_epoch = epoch if saved.get("mid_epoch") else None
            return
        why = (
            f"is from {len(states)} rank(s), this run has {world_size}"
            if len(states) != world_size
            else "lacks some ranks' state (saved by one rank on an exception)"
        )
        rank_zero_warn(
            f"The checkpoint's loader state {why}: epoch {epoch} restarts from its beginning (its samples seen before "
            "the checkpoint are seen again). Resume with the same number of devices, from a checkpoint saved on all "
            "ranks (ModelCheckpoint), for an exact continuation."
        )
        self.rank_state, self.mid_epoch, self.restart_epoch = None, None, epoch

    def apply(self, loader: ResumableLoader, trainer: Any) -> None:
        """Carry out a pending resume on the new train loader (*continue* / *restart* -> *fresh*).

        Called when the loader is built rather than left to Lightning's fit loop: that one restores rank 0's state
        on every rank, and none at all if ``configure_optimizers`` loaded the data early (Lightning #20550).
        """
        if self.rank_state is not None:
            loader.load_state_dict(self.rank_state)
            epoch = self.mid_epoch
            if epoch is not None and reopen_epoch(trainer, epoch):
                rank_zero_info(f"lightning_fastdata: resuming inside epoch {epoch}, where the checkpoint's loader was.")
        elif self.restart_epoch is not None:
            loader.sampler.set_epoch(self.restart_epoch)
        else:
            return
        loader.skip_next_load = True
        self.rank_state, self.mid_epoch, self.restart_epoch = None, None, None
