"""The GPU check's ``recipe`` part: torchvision's reference recipe fed to ResNet-50, and where the host's time goes.

See :mod:`benchmarks.gpu` (the parts, ``scripts/gpu-check.sh``: its ``diagnose`` and ``prove``
commands). The timed fits carry no profiler: the model on device-resident batches, the recipe through the folder
module with ``FastDataCallback``, torchvision's reference loader of the recipe (:class:`ReferenceData`: PIL, v2 in
the workers, MixUp/CutMix in ``collate_fn``, pinned, Lightning's own transfer), and the variants
(:data:`VARIANTS`, ``--recipe-variants``: the recipe less one piece each, or with torch's threads left at one per
CPU). Each timed fit also records, at no cost worth naming, the host's share: CPU cores of the training process and
of its reaped children (the loader workers), torch's intra-op thread count while training, the training
process's busiest threads by name, the augmentation hook's host time per batch and the device its batches were
on, and the host timeline of a step (:class:`_StepTimeline`: waiting for the batch, the augmentation hook, the
training step's own host time, and the step's GPU time by CUDA events).

Then one short untimed fit (``--recipe-diagnose``, on by default) records what costs too much to time with:
every torch op of the training process's thread over three steps of its first epoch
(:class:`~benchmarks.recorder.OpRecorder`: op, device, elements, calling frame; batch-sized work
on the host listed first) and ``torch.profiler``'s table of a few steps of its second epoch. The first GPU runs
timed the recipe with the profiler on, which alone cost 2.6x (1,282 vs 3,286-3,468 img/s on 2026-11-27).

What the runs found (one H100, 16 CPUs, 15 workers, 2026-11-27): with torch's default of 16 intra-op threads in
the training process beside 15 busy workers, the threads took 5 of the 16 CPUs and the recipe fed 2,104 img/s;
capped at the one CPU the workers leave (``FastDataCallback(host_threads="auto")``), 3,286-3,468, with the
training process's one thread saturated.
"""

from __future__ import annotations

import contextlib
import copy
import os
import resource
import statistics
import time
from dataclasses import replace
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
from torchvision.transforms import v2

from benchmarks.gpu_fit import BaselineData, Settings, SyntheticData, common_args, cuda_available, fit
from benchmarks.recorder import GRAIN, OpRecorder, format_rows
from lightning_fastdata import FastDataCallback, ImageFolderDataModule
from lightning_fastdata.bench.recipe import device_cost
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

    def timed(name: str, run: Any) -> Any:
        began = time.perf_counter()
        out = run()
        phases[name] = round(time.perf_counter() - began, 1)
        return out

    # the model alone: a steady rate needs far fewer steps than an ImageNet-length epoch
    short = replace(r, steps=min(r.steps, SYNTHETIC_STEPS))
    synthetic = timed(
        "synthetic_fit", lambda: fit(short, SyntheticData(short, num_classes), DataWaitMonitor(print_summary=False))
    )
    synthetic = synthetic["img_s"]
    dm = ImageFolderDataModule(r.root, **common_args(r), **made)
    row, host = timed("fed_fit", lambda: _fit_with_host(r, dm))
    # the user's alternative today: torchvision's reference loader of the recipe, fed to the same model
    ref = replace(r, epochs=r.reference_epochs or r.epochs)
    reference = timed("reference_fit", lambda: fit(ref, ReferenceData(ref, made), DataWaitMonitor(print_summary=False)))
    reference["fed_ratio"] = reference["img_s"] / synthetic
    reference["epochs"] = ref.epochs
    variants = []
    for name in s.recipe_variants:  # the recipe less one piece each: which piece costs the fed rate
        args = VARIANTS[name](dict(made))
        v_dm = ImageFolderDataModule(r.root, **common_args(r), **args)
        if name in _MODULE:
            _MODULE[name](v_dm)
        v_row, v_host = timed(f"variant {name}", partial(_fit_with_host, r, v_dm, **_CALLBACK.get(name, {})))
        variants.append({"variant": name, **v_row, "fed_ratio": v_row["img_s"] / synthetic, "host": v_host})
    out = {
        "image_size": r.image_size,
        "synthetic_img_s": synthetic,
        **row,
        "fed_ratio": row["img_s"] / synthetic,
        "reference": reference,
        "vs_reference": row["img_s"] / reference["img_s"],
        "batch_size": r.batch_size,
        "host": host,
        "variants": variants,
    }
    if r.recipe_diagnose:  # untimed: the op recorder and the profiler cost too much to time with
        d = replace(r, steps=min(r.steps, DIAGNOSE_STEPS))
        d_dm = ImageFolderDataModule(d.root, **common_args(d), **made)
        out["diagnose"] = timed("diagnose_fit", lambda: _fit_with_host(d, d_dm, diagnose=True)[1])
    # the device half alone: batches as they leave the loader, on the device, through on_after_batch_transfer
    device = torch.device("cuda" if cuda_available() else "cpu")
    dm.setup("fit")
    out["device_augment_ms_per_batch"] = timed("device_cost", lambda: device_cost(dm, 10, device=device, warmup=2))
    out["device_augment_device"] = device.type
    out["phase_seconds"] = phases
    print(summary(out))
    return out


#: Steps per epoch of the device-resident fit (the model's rate is steady long before an ImageNet-length epoch).
SYNTHETIC_STEPS = 100
#: Steps per epoch of the untimed diagnose fit (its recorder runs over steps 10-13 of the first epoch).
DIAGNOSE_STEPS = 20


def summary(out: dict[str, Any]) -> str:
    """The recipe part's table: each fed row's rate, its ratio to device-resident batches and to the reference."""
    ref = out["reference"]["img_s"]
    rows = [("device-resident batches (the rate to feed)", out["synthetic_img_s"], 1.0, None, None, None, None)]
    for name, row, host in [
        ("ours: the recipe, policy on the device", out, out["host"]),
        ("torchvision's reference loader", out["reference"], None),
        *[(f"ours, variant {v['variant']}", v, v["host"]) for v in out["variants"]],
    ]:
        rows.append(
            (
                name,
                row["img_s"],
                row["img_s"] / out["synthetic_img_s"],
                row["img_s"] / ref,
                row["data_wait"],
                None if host is None else host["torch_threads"],
                None if host is None else host["training_process_cores"],
            )
        )
    lines = [
        f"gpu-check recipe ({out['image_size']} px, batch {out['batch_size']}, {out.get('timed_steps')} timed steps):",
        f"{'':<46} {'img/s':>7} {'fed':>5} {'vs ref':>6} {'wait':>5} {'threads':>7} {'cores':>5}",
    ]

    def cell(v: Any, fmt: str, width: int) -> str:
        return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"

    for name, img_s, fed, vs, wait, threads, cores in rows:
        lines.append(
            f"{name:<46} {img_s:>7.0f} {cell(fed, '.2f', 5)} {cell(vs, '.2f', 6)} {cell(wait, '.2f', 5)} "
            f"{cell(threads, 'd', 7)} {cell(cores, '.2f', 5)}"
        )
    timeline = out["host"].get("timeline_ms") or {}
    if timeline:
        lines.append(f"ours, host ms per step (median): {timeline}")
    if "diagnose" in out:
        d = out["diagnose"]
        lines.append(f"diagnose fit: calls that made the host wait for the GPU over 3 recorded steps: {d.get('waits')}")
        lines.append(f"diagnose fit: ops by device {d.get('ops_by_device')}; the training process's ops:")
        lines.append(format_rows(d.get("ops", [])[:20]))
    lines.append(f"phases (s): {out['phase_seconds']}")
    return "\n".join(lines)


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


def _static_policy(made: dict[str, Any]) -> dict[str, Any]:
    """The whole recipe with its device policies' rounds in static shapes (every op over the whole batch:
    :mod:`~lightning_fastdata.augment.graphed.static`; the same pixels, a fixed number of launches per batch)."""
    policies = [copy.copy(t) for t in made.get("device_transforms") or []]
    for policy in policies:
        if hasattr(policy, "shapes"):
            policy.shapes = "static"
    return {**made, "device_transforms": policies}


#: ``--recipe-variants``: the shipped recipe's DataModule arguments less one piece (or one piece another way).
VARIANTS = {
    "no-policy": _without("device_transforms"),
    "no-batch-transforms": _without("batch_transforms"),
    "no-repeats": _without("repeated_augmentations"),
    "crop-flip-only": lambda made: {},
    "one-torch-thread": dict,  # the whole recipe; FastDataCallback(host_threads=1): torch's ops on one thread
    "all-torch-threads": dict,  # the whole recipe; FastDataCallback(host_threads=None): torch's own thread count
    "policy-in-workers": _policy_in_workers,
    "static-policy": _static_policy,
    "graphed": dict,  # the whole recipe; FastDataCallback(device_half="graphed"): captured as a CUDA graph
    # the policy in the workers with 13 and 14 workers a rank (the default leaves one CPU: 15 of 16; _MODULE)
    "policy-in-workers-13w": _policy_in_workers,
    "policy-in-workers-14w": _policy_in_workers,
}


def _workers(count: int) -> Any:
    """The variant's loader with ``count`` workers a rank (the rule to ship counts the training process's threads)."""

    def set_workers(dm: ImageFolderDataModule) -> None:
        dm.num_workers = count

    return set_workers


#: What a variant changes on the DataModule it trains from, once made.
_MODULE: dict[str, Any] = {
    "policy-in-workers-13w": _workers(13),
    "policy-in-workers-14w": _workers(14),
}

#: What a variant changes in FastDataCallback's arguments.
_CALLBACK: dict[str, dict[str, Any]] = {
    "graphed": {"device_half": "graphed"},
    "one-torch-thread": {"host_threads": 1},
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
    r: Settings, dm: ImageFolderDataModule, diagnose: bool = False, **callback: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fed fit's row, and where the host's time went during it (see the module docstring).

    With ``diagnose``, also the op recorder's table of three steps of the first epoch and ``torch.profiler``'s of
    a few steps of the second: then the row's rate is not a measurement.
    """
    hook = _HookTimer(dm)
    threads_before = thread_cpu_s()
    self_before, children_before, began = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN), time.time()
    timeline = _StepTimeline(hook)
    extra: list[pl.Callback] = [timeline]
    if diagnose:
        profiler = _StepProfiler(start=r.steps, steps=max(1, min(5, r.steps - 1)))  # the 2nd epoch's first steps
        recorder = _StepRecorder(start=min(10, r.steps // 2), steps=3)
        extra += [profiler, recorder]
    row = fit(r, dm, FastDataCallback(print_summary=False, **callback), extra_callbacks=extra)
    wall = time.time() - began
    host: dict[str, Any] = {
        "training_process_cores": round((_cpu_s(resource.RUSAGE_SELF) - self_before) / wall, 2),
        "workers_cores": round((_cpu_s(resource.RUSAGE_CHILDREN) - children_before) / wall, 2),
        "torch_threads": timeline.threads,
        "busiest_threads": busiest_threads(threads_before, thread_cpu_s()),
        **hook.summary(),
        "timeline_ms": timeline.summary(row["gpu_step_ms"]),
    }
    if diagnose:
        host["profile"] = profiler.table
        host["ops_by_device"] = recorder.by_device
        host["ops"] = recorder.rows
        host["waits"] = recorder.waits  # calls that made the training thread wait for the GPU, over the steps
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


class _StepTimeline(pl.Callback):
    """Host milliseconds of each training step by phase, as medians, beside the step's GPU time.

    ``fetch``: from the end of one step to the start of the next, less the augmentation hook (the loader's
    ``next``, the transfer, Lightning's hooks); ``augment``: the hook (:class:`_HookTimer`); ``step``: from
    ``on_train_batch_start`` to ``on_train_batch_end`` (forward, loss, backward's call, the optimiser: host time,
    the GPU runs behind); ``gpu_step``: the timer's GPU time of a timed step (``gpu_step_ms``). When the host's
    three add up to more than ``gpu_step``, the training process's thread, not the GPU, sets the pace. Also notes
    torch's intra-op thread count while training (after ``FastDataCallback.on_train_start``).
    """

    def __init__(self, hook: _HookTimer) -> None:
        self.hook = hook
        self.threads: int | None = None
        self.rows: list[tuple[float, float, float]] = []  # (fetch + augment, augment, step) seconds
        self._ended: float | None = None  # when the last step ended (None: an epoch starts)
        self._before: float | None = None
        self._began = 0.0
        self._hooks_seen = 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ended = None  # the wait across an epoch boundary is not a step's

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        self.threads = torch.get_num_threads()
        self._began, self._before = time.perf_counter(), self._ended

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        now = time.perf_counter()
        augment = self.hook.seconds[-1] if len(self.hook.seconds) > self._hooks_seen else 0.0
        self._hooks_seen = len(self.hook.seconds)
        if self._before is not None:
            self.rows.append((self._began - self._before, augment, now - self._began))
        self._ended = now

    def summary(self, gpu_step_ms: float | None) -> dict[str, float] | None:
        """Median milliseconds per step: ``fetch``, ``augment``, ``step`` (host), and ``gpu_step`` where given."""
        if not self.rows:
            return None
        wait, augment, step = (statistics.median(col) * 1000 for col in zip(*self.rows))
        out = {"fetch": round(wait - augment, 2), "augment": round(augment, 2), "step": round(step, 2)}
        if gpu_step_ms is not None:
            out["gpu_step"] = gpu_step_ms
        return out


class _StepRecorder(pl.Callback):
    """:class:`~benchmarks.recorder.OpRecorder` over ``steps`` training steps after step ``start``.

    It starts at the end of step ``start`` and stops at the end of step ``start + steps``: what it sees includes
    the loader's ``next``, the transfer and its hooks, forward, loss, ``backward``'s call and the optimiser step
    (the backward pass's kernels are launched from autograd's own thread, which a dispatch mode does not see).
    """

    def __init__(self, start: int, steps: int, elements: int = GRAIN) -> None:
        self.start, self.steps, self.elements = start, steps, elements
        self.rows: list[dict[str, Any]] = []
        self.by_device: dict[str, int] = {}
        self.waits: dict[str, int] = {}
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
        self.waits = dict(recorder.waits)


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
