"""Corrupt images skipped (``on_corrupt="skip"``): counted across the loader's processes, bounded per epoch.

A dataset holds one :func:`skip_counts` tensor in shared memory (each copy of it, each worker, writes its own cell:
column 0 the main process, ``1 + worker id`` a worker; a row per epoch, modulo :data:`EPOCH_ROWS`, and one for keys
without an epoch), so the main process reads what every worker skipped. :func:`skip_corrupt` is what a dataset does
with a corrupt image: raise (``on_corrupt="raise"``), or log it, count it, and raise past ``max_corrupt_fraction`` of
the epoch's samples. A read that failed is never a corrupt image (:class:`~lightning_fastdata.errors.StorageError`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch.utils.data import get_worker_info

from lightning_fastdata.errors import CORRUPT_IMAGE_ADVICE, DataError

__all__ = ["EPOCH_ROWS", "SkipReport", "reset_skips", "skip_corrupt", "skip_counts", "skips_in"]

log = logging.getLogger("lightning_fastdata")

#: Epochs the counts keep apart (an epoch's row is ``epoch % EPOCH_ROWS``; the last row: keys without an epoch).
EPOCH_ROWS = 8
_MAX_SLOTS = 64


def skip_counts() -> torch.Tensor:
    """A new table of counts, in shared memory (so a worker's counts are the main process's)."""
    return torch.zeros((EPOCH_ROWS + 1, _MAX_SLOTS), dtype=torch.int64).share_memory_()


def skips_in(counts: torch.Tensor, epoch: int | None = None) -> int:
    """The images skipped in ``epoch`` (``None``: in all), over every process."""
    return int(counts.sum() if epoch is None else counts[epoch % EPOCH_ROWS].sum())


def reset_skips(counts: torch.Tensor, epoch: int | None = None) -> None:
    """Set the counts of ``epoch`` (``None``: all) back to zero."""
    (counts if epoch is None else counts[epoch % EPOCH_ROWS]).zero_()


def skip_corrupt(
    counts: torch.Tensor,
    on_corrupt: str,
    max_corrupt_fraction: float,
    epoch: int | None,
    err: BaseException,
    name: str,
    samples: int,
) -> None:
    """A corrupt image met in ``epoch`` (``name``: what messages call it; ``samples``: the epoch's).

    Raises:
        BaseException: ``err`` itself with ``on_corrupt="raise"``.
        DataError: Once the epoch's skips pass ``max_corrupt_fraction`` of ``samples`` (naming the last one).
    """
    if on_corrupt == "raise":
        raise err
    info = get_worker_info()
    row = EPOCH_ROWS if epoch is None else epoch % EPOCH_ROWS
    counts[row, 0 if info is None else 1 + info.id % (_MAX_SLOTS - 1)] += 1
    skipped = int(counts[row].sum())
    limit = math.ceil(max_corrupt_fraction * samples)
    # the file's error without its advice (to skip such files: this user does) or its full stop
    reason = str(err).removesuffix(CORRUPT_IMAGE_ADVICE).rstrip(". ")
    if skipped > limit:
        where = "this pass over the data" if epoch is None else f"epoch {epoch}"
        raise DataError(
            f"{skipped} corrupt image(s) skipped in {where}, more than max_corrupt_fraction="
            f"{max_corrupt_fraction:g} of its {samples} samples allows ({limit}); the last: {name}: {reason}. So many "
            "point to the data as a whole (a wrong format, a bad conversion, a truncated copy): fix them, or raise "
            "max_corrupt_fraction (1 never stops)."
        ) from None  # its reason is quoted above; its own text would repeat the advice
    log.warning("Skipped corrupt image %s (on_corrupt='skip'): %s.", name, reason)


class SkipReport:
    """A DataModule's word on each training epoch's skipped images: how many, once the epoch is over (rank zero).

    ``on_corrupt="skip"`` logs each image as it is skipped; :meth:`batch_seen` (each training batch) says the count of
    the epoch before once a new one starts, :meth:`close` (teardown) the last one's; each count is then cleared.
    """

    def __init__(self) -> None:
        self.epoch = -1

    def batch_seen(self, trainer: Any, dataset: Any) -> None:
        """A batch arrived: in a new training epoch, report the one before."""
        if trainer is not None and trainer.training and trainer.current_epoch != self.epoch:
            self.close(dataset)
            self.epoch = trainer.current_epoch

    def close(self, dataset: Any) -> None:
        """Report the epoch being counted (if any) and stop counting."""
        if self.epoch < 0:
            return
        from lightning.pytorch.utilities import rank_zero_warn

        count = getattr(dataset, "skipped_count", lambda epoch: 0)(self.epoch)
        if count:
            rank_zero_warn(f"Epoch {self.epoch}: skipped {count} corrupt image(s) (on_corrupt='skip'); see the log.")
            dataset.reset_skipped_count(self.epoch)
        self.epoch = -1

    @staticmethod
    def on_device(trainer: Any, splits: tuple[Any, Any, Any, Any], index: int, err: OSError) -> None:
        """An image the device decode found corrupt: the dataset being read raises or skips it (its ``on_corrupt``).

        ``splits``: the train, val, test and predict datasets; with none to ask, ``err`` is raised.
        """
        train, val, test, predict = splits
        key: Any = index
        if trainer is None or trainer.training:
            dataset, key = train, (index if trainer is None else (trainer.current_epoch, index))
        else:
            dataset = predict if trainer.predicting else test if trainer.testing else val
        skip = getattr(dataset, "skip_sample", None)
        if skip is None:
            raise err
        skip(key, index, err)
