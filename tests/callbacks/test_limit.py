"""Which part limited a run: each verdict from measured facts, and the facts measured on real processes."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from lightning_fastdata import ImageClassifier, ImageFolderDataModule
from lightning_fastdata.callbacks.limit import RunFacts, run_verdict
from lightning_fastdata.callbacks.meter import DataWaitStats
from lightning_fastdata.callbacks.monitor import DataWaitMonitor, HostUsage
from lightning_fastdata.loading.workers import process_cpu_seconds
from lightning_fastdata.testing import cpu_trainer


def facts(**kw: float) -> RunFacts:
    base = dict(steps=100, wall_s=10.0, wait_s=1.0, hook_s=0.2, main_thread_cpu_s=5.0, workers=15)
    return RunFacts(**{**base, "workers_cpu_s": 60.0, "accelerator": True, **kw})  # type: ignore[arg-type]


def test_saturated_workers_and_a_wait_say_decode() -> None:
    v = run_verdict(facts(wait_s=4.0, workers_cpu_s=14.0 * 10))
    assert (
        v.limit == "decode" and "the 15 workers 14.0 cores busy" in v.message and "TensorCacheDataModule" in v.message
    )


def test_a_busy_training_thread_on_an_accelerator_says_so_with_its_host_ms() -> None:
    """The GPU run of 2026-11-27: 7.6 of 15 worker cores busy, the training thread at one core, 45 ms of host time per
    step of which the device half 10.35 ms: the old advice said "JPEG decode is the likely limit"."""
    v = run_verdict(facts(wall_s=4.55, wait_s=1.2, hook_s=1.03, main_thread_cpu_s=4.54, workers_cpu_s=7.6 * 4.55))
    assert v.limit == "training_thread"
    assert "the training thread busy 100% of the time, the 15 workers 7.6 cores busy" in v.message
    assert "45.4 ms of host time per step" in v.message and "the device half of the batch 10.3 ms" in v.message
    assert "torch.compile" in v.message and "decode" not in v.message.lower()
    # the same facts on a CPU Trainer: the training thread computes the model there, so it is not a verdict
    on_cpu = facts(wall_s=4.55, wait_s=1.2, main_thread_cpu_s=4.54, workers_cpu_s=7.6 * 4.55, accelerator=False)
    assert run_verdict(on_cpu).limit == "transfer"


def test_a_wait_without_workers_says_loader_and_one_with_idle_parts_says_transfer() -> None:
    assert run_verdict(facts(wait_s=5.0, workers=0, workers_cpu_s=None)).limit == "loader"
    v = run_verdict(facts(wait_s=5.0, main_thread_cpu_s=3.0, workers_cpu_s=30.0))
    assert v.limit == "transfer" and "pin_memory=True" in v.message and "prefetch=True" in v.message


def test_little_waiting_and_no_saturated_part_says_the_model() -> None:
    v = run_verdict(facts(wait_s=0.5))
    assert v.limit == "model" and "5% of the time between steps" in v.message
    # unmeasurable parts (no /proc, a foreign loader) are left out of the facts, not guessed
    assert run_verdict(facts(wait_s=0.5, main_thread_cpu_s=None, workers_cpu_s=None)).limit == "model"


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_cpu_time_of_worker_processes_is_read_from_the_system() -> None:
    context = multiprocessing.get_context("fork")
    busy, idle = context.Process(target=_spin, args=(0.6,)), context.Process(target=time.sleep, args=(0.6,))
    busy.start()
    idle.start()
    time.sleep(0.5)
    spun, slept = process_cpu_seconds([busy.pid or 0]), process_cpu_seconds([idle.pid or 0])
    busy.join()
    idle.join()
    assert spun is not None and slept is not None
    assert spun >= 0.1 and spun > 5 * slept  # a loaded machine gives the spinner less than its 0.5 s
    assert process_cpu_seconds([busy.pid or 0]) == 0.0  # gone: counts nothing


def test_host_usage_takes_the_shares_over_the_sampled_spans() -> None:
    wall, thread = [0.0], [0.0]
    usage = HostUsage(every=1, clock=lambda: wall[0], thread_clock=lambda: thread[0])
    usage.start(list, 0.0)
    for _ in range(4):  # each step: 50 ms of wall time, 45 ms of it on the training thread, 10 ms in the hook
        wall[0] += 0.05
        thread[0] += 0.045
        usage.sample(list, hook_s=wall[0] / 5)
    usage.close()
    got = usage.facts(DataWaitStats(steps=4, samples=1024, wait_s=0.02, total_s=0.2), workers=0, accelerator=True)
    assert got.main_thread_share == pytest.approx(0.9) and got.hook_s == pytest.approx(0.04)
    assert got.workers_cpu_s is None and run_verdict(got).limit == "training_thread"


def test_a_busy_accelerator_makes_a_spinning_training_thread_the_models_step() -> None:
    """CUDA's synchronisation spins on the CPU while the GPU computes: the training thread looks busy either way. With
    the accelerator's utilisation sampled (NVML), a busy GPU is the model's step, an idle one the thread's."""
    wall, thread = [0.0], [0.0]
    for gpu, limit in ((0.97, "model"), (0.35, "training_thread")):
        usage = HostUsage(every=2, clock=lambda: wall[0], thread_clock=lambda: thread[0])
        usage.start(list, 0.0)
        for _ in range(6):  # every step: the thread 98% busy (spinning, or launching)
            wall[0] += 0.1
            thread[0] += 0.098
            usage.sample(list, 0.0, lambda gpu=gpu: gpu)  # type: ignore[misc]
        usage.close()
        stats = DataWaitStats(steps=6, samples=6 * 64, wait_s=0.01, total_s=0.6)
        got = usage.facts(stats, workers=0, accelerator=True)
        assert got.device_busy == pytest.approx(gpu) and len(usage.device_samples) == 3  # every 2nd step
        verdict = run_verdict(got)
        assert verdict.limit == limit and f"the accelerator busy {round(100 * gpu)}%" in verdict.message
    unread = HostUsage(every=1)
    unread.start(list, 0.0)
    unread.sample(list, 0.0, lambda: None)  # no NVML: no fact, the verdict as before
    assert unread.facts(stats, workers=0, accelerator=True).device_busy is None


@pytest.mark.timeout(180)
def test_the_monitor_measures_a_real_fit_and_names_no_limit_it_did_not_see(image_folder: Path) -> None:
    """A CPU fit with 2 workers: the training thread's and the workers' CPU time are measured, the device hook timed;
    on a CPU Trainer the training thread is never the verdict (it computes the model)."""
    dm = ImageFolderDataModule(str(image_folder), image_size=16, batch_size=4, num_workers=2, val_fraction=0)
    monitor = DataWaitMonitor()
    monitor.usage.every = 2
    cpu_trainer(monitor, epochs=2).fit(ImageClassifier(num_classes=3), dm)
    stats = monitor.meter.total()
    got = monitor.usage.facts(stats, workers=2, accelerator=False)
    assert stats.steps == 20 and got.main_thread_share is not None and 0 < got.main_thread_share <= 1.05
    assert got.busy_workers is not None and got.busy_workers >= 0 and got.hook_s and got.hook_s > 0
    assert dm.transfer.train_hook_s == pytest.approx(got.hook_s)  # every step's hook, each epoch's first one too
    assert monitor.verdict(stats, monitor_trainer(dm)).limit != "training_thread"


def monitor_trainer(dm: ImageFolderDataModule) -> object:
    return dm.trainer
