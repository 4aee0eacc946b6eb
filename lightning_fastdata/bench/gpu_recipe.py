"""The GPU check's ``recipe`` part: torchvision's reference recipe fed to ResNet-50, and where the host's time goes.

See :mod:`lightning_fastdata.bench.gpu` (the parts, ``scripts/gpu-check.sh``). The first GPU run (2026-11-26, one
H100) fed the model at 0.15 of its device-resident rate with the training process busy and its loader workers idle,
so this part also records the host's share during the fit: CPU cores of the training process and of its reaped
children (the loader workers), the training process's busiest threads (CPU seconds by thread name: one busy
Python thread, or many of torch's intra-op threads), the augmentation hook's host time per batch and the device its
batches were on, and ``torch.profiler``'s table of a few steps of the second epoch. Its variants
(:data:`VARIANTS`, ``--recipe-variants``) train the recipe less one piece each, with ``torch.set_num_threads(1)``
in the training process (``one-torch-thread``), or with the policy in the loader workers (``policy-in-workers``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from torchvision.transforms import v2

from lightning_fastdata import FastDataCallback, ImageFolderDataModule
from lightning_fastdata.bench.gpu_fit import BaselineData, Settings, SyntheticData, common_args, cuda_available, fit
from lightning_fastdata.bench.recipe import device_cost
from lightning_fastdata.bench.recorder import GRAIN, OpRecorder, format_rows
from lightning_fastdata.callbacks.monitor import DataWaitMonitor
from lightning_fastdata.recipe import load_recipe, reference_loader

__all__ = ["VARIANTS", "ReferenceData", "busiest_threads", "check_variants", "recipe", "thread_cpu_s"]


def recipe(s: Settings) -> dict[str, Any]:
    """The reference recipe's fed ratio on this GPU, its reference loader's, and where the host's time goes."""
    check_variants(s.recipe_variants)  # before the fits: an unknown name costs no GPU time
    made, _ = load_recipe("recipe_torchvision")
    r = replace(s, image_size=min(s.image_size, int(made.pop("image_size"))))  # 176, or --quick's size
    num_classes = len(BaselineData(r).classes)
    phases: dict[str, float] = {}  # wall seconds of each phase (the first GPU run's timeline could not be told apart)
    began = time.perf_counter()
    synthetic = fit(r, SyntheticData(r, num_classes), DataWaitMonitor(print_summary=False))["img_s"]
    phases["synthetic_fit"] = round(time.perf_counter() - began, 1)
    dm = ImageFolderDataModule(r.root, **common_args(r), **made)
    began = time.perf_counter()
    row, host = _fit_with_host(r, dm, profile=True)
    phases["fed_fit"] = round(time.perf_counter() - began, 1)
    # the user's alternative today: torchvision's reference loader of the recipe (PIL, v2 in the workers, mixing in
    # collate_fn, pinned), fed to the same model with Lightning's own transfer
    began = time.perf_counter()
    reference = fit(r, ReferenceData(r, made), DataWaitMonitor(print_summary=False))
    phases["reference_fit"] = round(time.perf_counter() - began, 1)
    reference["fed_ratio"] = reference["img_s"] / synthetic
    print(f"gpu-check recipe: the reference loader {reference['img_s']:.0f} img/s ({reference['fed_ratio']:.2f})")
    variants = []
    for name in s.recipe_variants:  # the recipe less one piece each: which piece costs the fed rate
        args = VARIANTS[name](dict(made))
        began = time.perf_counter()
        with _AROUND.get(name, contextlib.nullcontext)():
            v_row, v_host = _fit_with_host(
                r, ImageFolderDataModule(r.root, **common_args(r), **args), profile=False, **_CALLBACK.get(name, {})
            )
        phases[f"variant {name}"] = round(time.perf_counter() - began, 1)
        ratio = v_row["img_s"] / synthetic
        variants.append({"variant": name, **v_row, "fed_ratio": ratio, "host": v_host})
        print(f"gpu-check recipe variant {name}: {v_row['img_s']:.0f} img/s ({ratio:.2f}); {v_host}")
    # the device half alone: batches as they leave the loader, on the device, through on_after_batch_transfer
    device = torch.device("cuda" if cuda_available() else "cpu")
    dm.setup("fit")
    began = time.perf_counter()
    ms = device_cost(dm, batches=10, device=device, warmup=2)
    phases["device_cost"] = round(time.perf_counter() - began, 1)
    out = {
        "image_size": r.image_size,
        "synthetic_img_s": synthetic,
        **row,
        "fed_ratio": row["img_s"] / synthetic,
        "reference": reference,
        "vs_reference": row["img_s"] / reference["img_s"],
        "device_augment_ms_per_batch": ms,
        "device_augment_device": device.type,
        "batch_size": r.batch_size,
        "host": host,
        "variants": variants,
        "phase_seconds": phases,
    }
    print(f"gpu-check recipe: phases (s): {phases}")
    print(f"gpu-check recipe: host during the fit: { {k: v for k, v in host.items() if k not in ('profile', 'ops')} }")
    print("gpu-check recipe: the training process's ops over a few steps (* batch-sized on the host):")
    print(format_rows(host["ops"]))
    print(
        f"gpu-check recipe: {row['img_s']:.0f} img/s fed, {synthetic:.0f} device-resident ({out['fed_ratio']:.2f}), "
        f"{out['vs_reference']:.2f}x torchvision's reference loader; device augmentation {ms:.2f} ms per batch of "
        f"{r.batch_size} on the {device.type}"
    )
    return out


class ReferenceData(pl.LightningDataModule):
    """torchvision's reference loader of a recipe (:func:`~lightning_fastdata.recipe.reference_loader`), pinned."""

    def __init__(self, s: Settings, made: dict[str, Any]) -> None:
        super().__init__()
        self.s, self.made = s, made
        self.classes = BaselineData(s).classes

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        recipe = {**self.made, "image_size": self.s.image_size}
        return reference_loader(self.s.root, recipe, self.s.batch_size, self.s.workers, pin_memory=cuda_available())


def _without(*keys: str) -> Any:
    return lambda made: {k: v for k, v in made.items() if k not in keys}


def _policy_in_workers(made: dict[str, Any]) -> dict[str, Any]:
    """The recipe with its device policies run per sample in the loader workers, as torchvision's own objects.

    What the shipped config's commented ``train_transforms`` block trains.
    """
    policies = [t.to_torchvision() for t in made.get("device_transforms") or []]
    rest = _without("device_transforms")(made)
    return {**rest, "train_transforms": policies[0] if len(policies) == 1 else v2.Compose(policies)}


#: ``--recipe-variants``: the shipped recipe's DataModule arguments less one piece.
VARIANTS = {
    "no-policy": _without("device_transforms"),
    "no-batch-transforms": _without("batch_transforms"),
    "no-repeats": _without("repeated_augmentations"),
    "crop-flip-only": lambda made: {},
    "one-torch-thread": dict,  # the whole recipe; the training process's torch ops on one thread (_AROUND)
    "all-torch-threads": dict,  # the whole recipe; FastDataCallback(host_threads=None): torch's own thread count
    "policy-in-workers": _policy_in_workers,
}


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


#: What a variant changes around its fit rather than in the DataModule's arguments.
_AROUND = {"one-torch-thread": _one_torch_thread}
#: What a variant changes in FastDataCallback's arguments.
_CALLBACK: dict[str, dict[str, Any]] = {
    "one-torch-thread": {"host_threads": None},
    "all-torch-threads": {"host_threads": None},
}


def check_variants(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` if each is a key of :data:`VARIANTS`.

    Raises:
        ValueError: Naming the unknown ones and the choices.
    """
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown recipe variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    return names


def _fit_with_host(
    r: Settings, dm: ImageFolderDataModule, profile: bool, **callback: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fed fit's row, and where the host's time went during it (see the module docstring).

    With ``profile``, also ``torch.profiler``'s table of a few steps of the second epoch and the op recorder's
    table (:class:`~lightning_fastdata.bench.recorder.OpRecorder`) of a few steps of the first.
    """
    hook = _HookTimer(dm)
    threads_before = thread_cpu_s()
    self_before, children_before, began = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN), time.time()
    profiler = _StepProfiler(start=r.steps, steps=max(1, min(5, r.steps - 1)))  # the 2nd epoch's first steps
    recorder = _StepRecorder(start=min(10, r.steps // 2), steps=3)
    threads = _ThreadCount()
    row = fit(
        r,
        dm,
        FastDataCallback(print_summary=False, **callback),
        extra_callbacks=[threads, profiler, recorder] if profile else [threads],
    )
    wall = time.time() - began
    host: dict[str, Any] = {
        "training_process_cores": round((_cpu_s(resource.RUSAGE_SELF) - self_before) / wall, 2),
        "workers_cores": round((_cpu_s(resource.RUSAGE_CHILDREN) - children_before) / wall, 2),
        "torch_threads": threads.seen,
        "busiest_threads": busiest_threads(threads_before, thread_cpu_s()),
        **hook.summary(),
    }
    if profile:  # torch.profiler over a few steps of the second epoch: the host's ops by their own CPU time
        host["profile"] = profiler.table
        host["ops_by_device"] = recorder.by_device
        host["ops"] = recorder.rows
    hook.restore()
    return row, host


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of this process so far: ``{tid: (name, seconds)}`` (empty where ``/proc`` is not)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()  # from the state, the stat's third field, on
                out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / ticks)  # utime, stime
    return out


def busiest_threads(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], top: int = 8
) -> list[list[Any]]:
    """The ``top`` threads by CPU seconds between two :func:`thread_cpu_s` readings, then the rest in one row.

    Each row is ``[name, tid, seconds]`` (the OS's thread name: torch's and the loader's threads have their own;
    Python's are named after the process); the last ``["(N others)", None, seconds]``. Threads that ended in
    between are not counted.
    """
    spent = sorted(
        ((name, tid, round(s - before.get(tid, (name, 0.0))[1], 2)) for tid, (name, s) in after.items()),
        key=lambda t: -t[2],
    )
    rows: list[list[Any]] = [list(t) for t in spent[:top]]
    if len(spent) > top:
        rows.append([f"({len(spent) - top} others)", None, round(sum(t[2] for t in spent[top:]), 2)])
    return rows


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class _StepProfiler(pl.Callback):
    """``torch.profiler`` over ``steps`` training steps from global step ``start``; ``table``: its top ops."""

    def __init__(self, start: int, steps: int) -> None:
        self.start, self.steps = start, steps
        self.table: list[str] = []
        self._profile: Any = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        if trainer.global_step == self.start and self._profile is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if cuda_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities)
            self._profile.__enter__()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._profile is not None and not self.table and trainer.global_step >= self.start + self.steps:
            self._stop()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._profile is not None and not self.table:  # a run shorter than asked: what it profiled
            self._stop()

    def _stop(self) -> None:
        self._profile.__exit__(None, None, None)
        text = self._profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
        self.table = text.splitlines()


class _ThreadCount(pl.Callback):
    """Torch's intra-op thread count while training (after FastDataCallback's ``on_train_start``)."""

    seen: int | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        self.seen = torch.get_num_threads()


class _StepRecorder(pl.Callback):
    """:class:`~lightning_fastdata.bench.recorder.OpRecorder` over ``steps`` training steps after step ``start``.

    It starts at the end of step ``start`` and stops at the end of step ``start + steps``: what it sees includes
    the loader's ``next``, the transfer and its hooks, forward, loss, ``backward``'s call and the optimiser step
    (the backward pass's kernels are launched from autograd's own thread, which a dispatch mode does not see).
    """

    def __init__(self, start: int, steps: int, elements: int = GRAIN) -> None:
        self.start, self.steps, self.elements = start, steps, elements
        self.rows: list[dict[str, Any]] = []
        self.by_device: dict[str, int] = {}
        self._recorder: OpRecorder | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.current_epoch != 0:
            return
        if trainer.global_step == self.start and self._recorder is None and not self.rows:
            self._recorder = OpRecorder()
            self._recorder.__enter__()
        elif self._recorder is not None and trainer.global_step >= self.start + self.steps:
            self._stop()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._recorder is not None:
            self._stop()

    def _stop(self) -> None:
        recorder, self._recorder = self._recorder, None
        assert recorder is not None
        recorder.__exit__(None, None, None)
        self.rows = recorder.table(self.elements, top=30)
        self.by_device = recorder.calls_by_device()


class _HookTimer:
    """Times ``dm.on_after_batch_transfer`` (host wall time per training batch) and notes its batches' device."""

    def __init__(self, dm: ImageFolderDataModule) -> None:
        self.dm = dm
        self.seconds: list[float] = []
        self.devices: set[str] = set()
        original = dm.on_after_batch_transfer

        def timed(batch: Any, dataloader_idx: int) -> Any:  # a function: Lightning's is_overridden reads __code__
            began = time.perf_counter()
            out = original(batch, dataloader_idx)
            if dm.trainer is not None and dm.trainer.training:
                self.seconds.append(time.perf_counter() - began)
                self.devices.add(str(batch[0].device))
            return out

        dm.on_after_batch_transfer = timed  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        ms = sorted(1000 * x for x in self.seconds) or [float("nan")]
        return {"augment_host_ms_median": round(ms[len(ms) // 2], 2), "augment_batch_devices": sorted(self.devices)}

    def restore(self) -> None:
        del self.dm.on_after_batch_transfer
