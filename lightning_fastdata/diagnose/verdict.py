"""The doctor's verdict: which option, how many workers, and why, from the measured rates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_fastdata.diagnose.options import BASELINE
from lightning_fastdata.diagnose.report import Option, duration

__all__ = ["NOISE", "choose_option", "choose_workers", "expected_rate", "wait_fraction"]

#: Rates within this fraction of each other are a tie: short runs on a shared machine vary this much.
NOISE = 0.10


def expected_rate(rate: float, dataset_gb: float, kb: float, ram_gb: float, cold_mb_s: float, devices: int) -> float:
    """A rank's rate on the whole data set: the measured (warm) rate, unless the data cannot stay in the page cache.

    Then every epoch reads them from storage, shared by the node's ``devices`` ranks, at most at the cold rate.
    """
    if dataset_gb <= 0.8 * ram_gb or not np.isfinite(cold_mb_s):
        return rate
    return min(rate, cold_mb_s * 1e3 / kb / devices)


def wait_fraction(rate: float, batch_size: int, step_ms: float | None, overlapped: bool = True) -> float | None:
    """The fraction of a step spent waiting for data when loading runs at ``rate`` beside a ``step_ms`` step.

    With workers loading overlaps the step and only the excess is waited for; with ``num_workers=0`` (not
    ``overlapped``) every batch is loaded in the training process between steps.
    """
    if step_ms is None:
        return None
    load_ms = 1000 * batch_size / rate
    if not overlapped:
        return load_ms / (load_ms + step_ms)
    return max(0.0, (load_ms - step_ms) / load_ms)


def choose_option(
    options: Sequence[Option],
    data_gb: float,
    ram_gb: float,
    free_gb: float,
    batch_size: int,
    step_ms: float | None,
    overlapped: bool = True,
) -> tuple[Option, str]:
    """The one option to use and why.

    With ``step_ms``: the one with the fewest steps (then the least to build and store) that keeps the model busy.
    Otherwise, or if none does: among the options within :data:`NOISE` of the fastest that fits this machine's
    disk, the one with the fewest steps (a cache that builds itself over a file to convert first), then the
    faster; so a tie measured by noise does not flip the recommendation between runs.
    """
    usable = [o for o in options if o.key != BASELINE]
    fits = [o for o in usable if not o.build_s or o.dataset_gb < 0.9 * free_gb] or usable[:1]
    ram_note = f"RAM {ram_gb:.0f} GB, free disk {free_gb:.0f} GB, whole data set {data_gb:.1f} GB"
    if step_ms is not None:
        enough = [o for o in fits if wait_fraction(o.expected_per_s, batch_size, step_ms, overlapped) == 0.0]
        if enough:
            best = min(enough, key=lambda o: (o.steps, o.build_s, o.dataset_gb))
            need = 1000 * batch_size / step_ms
            built = f"{best.dataset_gb:.1f} GB to build once" if best.build_s else "nothing to build"
            return best, (
                f"the simplest option that keeps up ({built}): {best.expected_per_s:.0f} images/s per rank, the model "
                f"needs {need:.0f} at {step_ms:g} ms per step of {batch_size} ({ram_note})"
            )
    fastest = max(fits, key=lambda o: o.expected_per_s)
    near = [o for o in fits if o.expected_per_s >= (1 - NOISE) * fastest.expected_per_s]
    best = min(near, key=lambda o: (o.steps, -o.expected_per_s))
    if best is fastest:
        why = f"the fastest option that fits this machine ({ram_note})"
    else:
        why = (
            f"within {NOISE:.0%} of the fastest that fits this machine ({fastest.name}, "
            f"{fastest.expected_per_s:.0f} images/s per rank), with fewer steps to set up ({ram_note})"
        )
    if best.expected_per_s < 0.9 * best.images_per_s:
        why += "; the data do not stay in RAM, so the storage's cold read rate limits it"
    if best.build_s:
        why += f"; it is built once ({best.dataset_gb:.1f} GB, ~{duration(best.build_s)})"
    return best, why


def choose_workers(
    rates: dict[int, float], workers: int, share: int, cap: float, batch_size: int, step_ms: float | None
) -> tuple[int, str]:
    """The worker count per rank for the config, and the words added to the reason (``""``: keep ``"auto"``).

    Chosen from 1 .. ``share - 1``: 0 loads in the training process, serial with the step, and a worker on every
    CPU leaves none for the training step (the timed loader alone does not show that cost). ``cap`` is the
    storage's limit if the data exceed RAM; it holds at any worker count.
    """
    eligible = [w for w in rates if 1 <= w <= max(1, share - 1)]

    def wait_at(w: int) -> float:
        return wait_fraction(min(rates[w], cap), batch_size, step_ms, overlapped=w > 0) or 0.0

    best_w = max(eligible, key=lambda w: rates[w], default=workers)
    if step_ms is not None and eligible:  # the least wait; the faster on a tie
        best_w = min(eligible, key=lambda w: (round(wait_at(w), 2), -rates[w]))
        better = wait_at(best_w) < wait_at(workers) - 0.02
    else:
        better = rates[best_w] > (1 + NOISE) * rates[workers]
    if best_w == workers or not better:
        return workers, ""
    return best_w, (
        f"; {best_w} worker{'s' if best_w > 1 else ''} per rank measured {rates[best_w]:.0f} images/s against "
        f"{rates[workers]:.0f} with num_workers='auto' ({workers}), so the config sets num_workers={best_w}"
    )
