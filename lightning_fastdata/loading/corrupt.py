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

import torch
from torch.utils.data import get_worker_info

from lightning_fastdata.errors import CORRUPT_IMAGE_ADVICE, DataError

__all__ = ["EPOCH_ROWS", "reset_skips", "skip_corrupt", "skip_counts", "skips_in"]

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
