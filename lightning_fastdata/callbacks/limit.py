"""What limited a training run, from measured facts: the verdict ``DataWaitMonitor`` gives, with advice that fits.

The facts (:class:`RunFacts`) are measured over a run's training steps: the wall time, the wait between steps
(fetching a batch, moving it, the DataModule's device hooks), of that the device half's host time (this package's
DataModules time their ``on_after_batch_transfer``), the training thread's CPU time, and the loader workers' CPU
time. :func:`run_verdict` reads them, framework-free:

- ``"decode"``: the workers were saturated (their CPU time near their count) and steps waited for data (on a CUDA
  device, with a DataModule that can, the advice starts with decoding there: ``decode_on="device"``);
- ``"training_thread"``: on an accelerator, the training thread was busy nearly all the time while the accelerator
  was not (where its utilisation can be read): its host work per step (the device half, the training step's own
  calls) is what the device waits for, not the data. A thread that spins in CUDA's synchronisation while the GPU
  computes counts as busy too, so a busy accelerator (``device_busy``) makes the verdict the model's;
- ``"loader"``: steps waited for data with ``num_workers=0``;
- ``"transfer"``: steps waited, with neither the workers nor the training thread saturated: fetching and moving
  batches (pinned memory, prefetch, storage);
- ``"model"``: little waiting, no saturated host part: the model's own step is the limit (what one wants).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SATURATED", "Limit", "RunFacts", "Verdict", "run_verdict"]

#: A part counts as saturated at this share of its cores over the run (a thread at this share of one core).
SATURATED = 0.85

Limit = Literal["model", "decode", "training_thread", "loader", "transfer"]


@dataclass(frozen=True)
class RunFacts:
    """What was measured over a run's training steps (``None``: not measurable here).

    Attributes:
        steps: Training steps counted.
        wall_s: Their wall time, waits included.
        wait_s: The time between steps: fetching, moving and the DataModule's device hooks.
        hook_s: Of it, the DataModule's ``on_after_batch_transfer`` (the device half: augmentation, normalisation).
        main_thread_cpu_s: The training thread's CPU time over ``wall_s``.
        workers: The train loader's worker processes.
        workers_cpu_s: Their CPU time over ``wall_s``.
        accelerator: Whether the model trains on an accelerator (the training thread only launches its work).
        device_busy: The share of the time the accelerator ran kernels (NVML's utilisation, sampled over the run);
            ``None``: not readable here (no NVML, no CUDA).
        device_decode: The DataModule decodes JPEGs in its workers and could decode them on this (CUDA) device
            instead (``decode_on="device"``).
    """

    steps: int
    wall_s: float
    wait_s: float
    hook_s: float | None = None
    main_thread_cpu_s: float | None = None
    workers: int = 0
    workers_cpu_s: float | None = None
    accelerator: bool = False
    device_busy: float | None = None
    device_decode: bool = False

    @property
    def wait_fraction(self) -> float:
        """The share of the wall time spent between steps."""
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def main_thread_share(self) -> float | None:
        """The training thread's CPU time as a share of the wall time (1.0 when busy all the time)."""
        return None if self.main_thread_cpu_s is None or self.wall_s <= 0 else self.main_thread_cpu_s / self.wall_s

    @property
    def busy_workers(self) -> float | None:
        """How many cores the workers kept busy (their CPU time over the wall time)."""
        return None if self.workers_cpu_s is None or self.wall_s <= 0 else self.workers_cpu_s / self.wall_s

    def per_step_ms(self, seconds: float) -> float:
        """``seconds`` over the run, per step, in ms."""
        return 1000.0 * seconds / max(self.steps, 1)


@dataclass(frozen=True)
class Verdict:
    """The limit of a run, and what to say about it."""

    limit: Limit
    message: str


def run_verdict(facts: RunFacts, threshold: float = 0.2) -> Verdict:
    """Which part limited the run (module docstring), with the measured facts and the advice that fits.

    ``threshold``: the wait fraction above which a run counts as waiting for data.
    """
    waiting = facts.wait_fraction > threshold
    busy, share = facts.busy_workers, facts.main_thread_share
    said = f"{100 * facts.wait_fraction:.0f}% of the time between steps"
    if share is not None:
        said += f", the training thread busy {100 * share:.0f}% of the time"
    if busy is not None and facts.workers:
        said += f", the {facts.workers} workers {busy:.1f} cores busy"
    if facts.device_busy is not None:
        said += f", the accelerator busy {100 * facts.device_busy:.0f}% of the time"
    said += "."
    if waiting and facts.workers and busy is not None and busy >= SATURATED * facts.workers:
        gpu = (
            "decode the JPEGs on the GPU (decode_on='device' on the DataModule: nvJPEG, the workers only read and "
            "draw the crops), "
            if facts.device_decode
            else ""
        )
        return Verdict(
            "decode",
            f"Decoding is the limit: {said} The workers are saturated: {gpu}train from TensorCacheDataModule (decode "
            "once, no decode per epoch), let the entropy index be built (ImageFolderDataModule's default), or give "
            "the run more CPUs.",
        )
    device_busy = facts.device_busy is not None and facts.device_busy >= SATURATED
    if facts.accelerator and share is not None and share >= SATURATED and not device_busy:
        hook = facts.per_step_ms(facts.hook_s or 0.0)
        host = facts.per_step_ms(facts.main_thread_cpu_s or 0.0)
        return Verdict(
            "training_thread",
            f"The training thread is the limit, not the data: {said} It spends {host:.1f} ms of host time per step "
            f"(the device half of the batch {hook:.1f} ms, the training step and the rest {host - hook:.1f} ms), "
            "and the accelerator waits for it. What helps: fewer host calls per step: a compiled model "
            "(torch.compile, mode='reduce-overhead' replays CUDA graphs), a device half with fewer ops, no "
            "per-step .item() or logging of device values; leave it a CPU of its own (fewer workers).",
        )
    if waiting and not facts.workers:
        return Verdict(
            "loader",
            f"Loading in the training process is the limit: {said} The loader has num_workers=0: set "
            "num_workers='auto' (or > 0) to load in parallel with the step.",
        )
    if waiting:
        return Verdict(
            "transfer",
            f"Fetching and moving batches is the limit: {said} Neither the workers nor the training thread are "
            "saturated: pin host memory (pin_memory=True), prefetch to the device (FastDataCallback(prefetch=True)), "
            "and check the storage (a network file system or bucket: an HDF5 file or a tensor cache on local disk).",
        )
    spinning = " (the training thread's CPU time is its wait for the accelerator)" if device_busy and share else ""
    return Verdict("model", f"The model's step is the limit, not the data: {said}{spinning}")
