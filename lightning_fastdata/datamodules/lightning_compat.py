"""Every Lightning internal the package reads or writes, in one place.

Each function names the internal it touches and what it relies on; ``tests/datamodules/test_lightning_compat.py``
pins each behaviour, so that a Lightning upgrade that changes one fails there first, by name.

- ``ModelCheckpoint._every_n_train_steps`` (read): the checkpoint interval in steps, which has no public
  accessor; used to snapshot the loader when checkpoints are taken (:func:`checkpoint_step_intervals`).
- ``trainer.fit_loop.epoch_progress`` (written): when ``max_steps`` stops a run inside an epoch, Lightning still
  counts that epoch as processed, so a resume would start the next one (:func:`reopen_epoch`).
- ``trainer.fit_loop.epoch_loop.batch_progress.current`` (written), and the checkpoint being restored
  (``trainer._checkpoint_connector._loaded_checkpoint["loops"]``, written while it is pending): the batches an
  epoch has done, which Lightning compares with ``len(train_dataloader)`` to end the epoch; an epoch continued on
  another world size has fewer batches left than its new length minus the batches done before
  (:func:`shift_batches_done`).
- The order of ``fit_loop.setup_data()``: the DataModule's ``train_dataloader()`` is called before the fit loop
  loads the checkpoint's loader state into that loader (``_load_combined_loader_states``), and that state is rank
  0's on every rank. :class:`~lightning_fastdata.datamodules.resume.LoaderResume` restores each rank's own state
  when the loader is built and marks it restored; the loader ignores the fit loop's load that follows, before its
  first iteration (:class:`~lightning_fastdata.datamodules.resume.ResumableLoader`).
- ``trainer._results`` (read): the values the module logged this step, their ``meta.prog_bar``/``meta.on_step``
  and the logged tensor (``_forward_cache``); Lightning turns each progress-bar value into a number after every
  training step, a wait for the device when the tensor is on one (:func:`step_progress_bar_values`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["checkpoint_step_intervals", "reopen_epoch", "shift_batches_done", "step_progress_bar_values"]


def checkpoint_step_intervals(trainer: Any) -> list[int] | None:
    """The ``every_n_train_steps`` of the Trainer's checkpoint callbacks that have one.

    Returns ``None`` if a checkpoint callback does not expose it (a Lightning without
    ``ModelCheckpoint._every_n_train_steps``, or another class): the caller cannot know the interval.
    """
    intervals = []
    for callback in trainer.checkpoint_callbacks if trainer is not None else []:
        if not hasattr(callback, "_every_n_train_steps"):
            return None
        if callback._every_n_train_steps:
            intervals.append(int(callback._every_n_train_steps))
    return intervals


def reopen_epoch(trainer: Any, epoch: int) -> bool:
    """Count ``epoch`` as started but not processed, if Lightning counted it as processed; returns whether it did.

    When ``max_steps`` stops a run in the middle of an epoch, Lightning still ends the epoch (its counters say
    "processed", "completed") and saves ``last.ckpt`` so; resumed from it, the fit loop would start the next
    epoch while the loader still serves the interrupted one. Called before the fit loop derives its restart stage
    from these counters (from ``train_dataloader()``, inside ``setup_data``).
    """
    progress = getattr(getattr(trainer, "fit_loop", None), "epoch_progress", None)
    if progress is None or progress.current.started != epoch + 1 or progress.current.processed != epoch + 1:
        return False
    for tracker in (progress.total, progress.current):
        if tracker.completed == tracker.processed:
            tracker.completed -= 1
        tracker.processed -= 1
    return True


_BATCH_FIELDS = ("ready", "started", "processed", "completed")


def shift_batches_done(trainer: Any, delta: int) -> str:
    """Add ``delta`` to the batches the current epoch counts as done; returns where (``"live"``, ``"pending"``, ``""``).

    Lightning ends a training epoch when its batch counter reaches ``len(train_dataloader)``; an epoch continued on
    another world size (or batch size) has a different number of batches left than that length minus the
    counter restored from the checkpoint, so the counter is moved by the difference. The counters are restored
    from the checkpoint *after* ``train_dataloader()`` when ``configure_optimizers`` loads the data early
    (Lightning #20550): then the checkpoint that is about to be restored is changed instead (``"pending"``).
    """
    if not delta or getattr(trainer, "fit_loop", None) is None:
        return ""
    loaded = getattr(getattr(trainer, "_checkpoint_connector", None), "_loaded_checkpoint", None) or {}
    loop_state = loaded.get("loops", {}).get("fit_loop", {})
    pending = loop_state.get("epoch_loop.batch_progress") if isinstance(loop_state, dict) else None
    if pending is not None:
        for field in _BATCH_FIELDS:
            pending["current"][field] += delta
        return "pending"
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    for field in _BATCH_FIELDS:
        setattr(current, field, getattr(current, field) + delta)
    return "live"


def step_progress_bar_values(trainer: Any) -> dict[str, str] | None:
    """The values logged on this training step with ``prog_bar=True``: each name and its tensor's device.

    Returns ``None`` where Lightning keeps its logged values elsewhere (no ``trainer._results`` of the shape read).
    """
    results = getattr(trainer, "_results", None)
    if results is None or not hasattr(results, "valid_items"):
        return None
    found = {}
    for _, metric in results.valid_items():
        meta, value = getattr(metric, "meta", None), getattr(metric, "_forward_cache", None)
        if meta is None:
            return None
        device = getattr(value, "device", None)
        if meta.prog_bar and meta.on_step and device is not None:
            found[str(meta.name)] = str(device)
    return found
