"""The background build's pace: a share of busy CPUs, idle ones taken whole (``loading/jpeg/pace.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightning_fastdata.demos import make_image_folder
from lightning_fastdata.loading.index.files import scan_image_folder
from lightning_fastdata.loading.jpeg import pace as pace_module
from lightning_fastdata.loading.jpeg.entropy_index import entropy_index_folder
from lightning_fastdata.loading.jpeg.entropy_index_build import build_entropy_index
from lightning_fastdata.loading.jpeg.pace import FREE_BURST_S, MIN_PAUSE_S, InProcess, Pace, idle_cpu_seconds
from lightning_fastdata.loading.storage.local import LocalStorage


class _Machine:
    """A clock, this build's CPU time and the CPUs' idle seconds, advanced by the test (the pacing arithmetic)."""

    def __init__(self, idle_cpus: float) -> None:
        self.now = self.cpu = self.idle_s = 0.0
        self.idle_cpus = idle_cpus  # CPUs idle while the build sleeps
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s
        self.idle_s += s * self.idle_cpus

    def work(self, cpu_s: float) -> None:
        self.cpu += cpu_s
        self.now += cpu_s

    def pace(self, share_cpus: float, knows_idle: bool = True) -> Pace:
        return Pace(
            share_cpus,
            idle=(lambda: self.idle_s) if knows_idle else (lambda: None),
            sleep=self.sleep,
            clock=lambda: self.now,
            cpu_time=lambda: self.cpu,
        )


def test_on_busy_cpus_the_build_takes_its_share_and_no_more() -> None:
    m = _Machine(idle_cpus=0.1)  # a saturated loader: a tenth of a CPU idle at most
    p = m.pace(share_cpus=0.05)
    for _ in range(20):
        m.work(0.032)  # one piece: 32 files of ~1 ms
        p.step()
    assert not p.free
    assert m.slept == pytest.approx([0.032 * 19] * 20)  # 32 ms of work, then 19 times that asleep: 5%
    assert m.cpu / m.now == pytest.approx(0.05)
    m.work(0.001)  # a tiny piece still pauses at least MIN_PAUSE_S, long enough to read idle time
    p.step()
    assert m.slept[-1] == MIN_PAUSE_S


def test_idle_cpus_are_taken_whole_until_the_loader_wants_them_back() -> None:
    m = _Machine(idle_cpus=1.0)  # a spare CPU while the build sleeps
    p = m.pace(share_cpus=0.05)
    m.work(0.032)
    p.step()  # the first pause is the share's, and sees the idle CPU
    assert p.free and len(m.slept) == 1
    for _ in range(int(FREE_BURST_S / 0.032)):  # then bursts of FREE_BURST_S with short looks in between
        m.work(0.032)
        assert p.step() == 0.0
    m.work(0.032)
    p.step()
    assert m.slept[-1] == MIN_PAUSE_S and p.free
    m.idle_cpus = 0.2  # the loader took the CPU back: at the next look, back to the share
    for _ in range(int(FREE_BURST_S / 0.032) + 1):
        m.work(0.032)
        p.step()
    assert not p.free and m.slept[-1] == MIN_PAUSE_S
    m.work(0.032)
    p.step()
    assert m.slept[-1] == pytest.approx(0.032 * 19)


def test_without_idle_figures_only_the_share_is_used() -> None:
    m = _Machine(idle_cpus=2.0)
    p = m.pace(share_cpus=0.25, knows_idle=False)  # no /proc/stat, or a cgroup quota below the affinity set
    for _ in range(5):
        m.work(0.1)
        p.step()
    assert not p.free and m.cpu / m.now == pytest.approx(0.25)


def test_idle_seconds_are_read_for_the_cpus_this_process_may_use() -> None:
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat here: the pace uses its share only (tested above)")
    mine = frozenset(os.sched_getaffinity(0))
    before = idle_cpu_seconds(mine)
    everything, start = idle_cpu_seconds(), time.monotonic()
    time.sleep(0.2)
    after = idle_cpu_seconds(mine)
    elapsed = time.monotonic() - start
    assert before is not None and after is not None and everything is not None
    cpus = os.cpu_count() or 1
    # idle time grows by at most the elapsed time per CPU (plus a clock tick each), and ours are among all CPUs
    assert 0 < before <= after <= everything + (elapsed + 0.02) * cpus
    assert idle_cpu_seconds(frozenset()) == 0.0
    p = Pace.for_this_process(share=0.025)
    assert 0 < p.share_cpus <= min(1.0, 0.025 * len(mine))  # the usable CPUs: the affinity set, capped by a quota


def test_a_paced_build_sleeps_its_share_and_builds_the_same_index(tmp_path: Path) -> None:
    """A real build (this process's CPU time, the real clock and sleep), paced at a quarter of a CPU with no idle
    figures: it slept at least three times the CPU time it used, and its index is the unpaced build's."""
    from lightning_fastdata.loading.jpeg import entropy_index_build as module

    root = make_image_folder(tmp_path / "data", num_classes=2, per_class=40, size=(320, 240))
    index = scan_image_folder(str(root))
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        time.sleep(s)

    cpu0 = time.process_time()
    paced = Pace(0.25, idle=lambda: None, sleep=sleep)
    folder = entropy_index_folder(tmp_path / "paced", index)
    folder.parent.mkdir()
    built = module._build_locked(index, LocalStorage(str(root)), folder, 0, False, pace=paced)
    used = time.process_time() - cpu0
    assert len(slept) == -(-len(index) // 32)  # a pause after each piece of 32 files
    assert sum(slept) >= 3 * used * 0.8  # (1/0.25 - 1) x the work; the joining of the pieces is not paced
    unpaced = build_entropy_index(index, LocalStorage(str(root)), tmp_path / "unpaced", processes=1, progress=False)
    assert unpaced is not None
    assert [built.get(i) for i in range(len(index))] == [unpaced.get(i) for i in range(len(index))]
    assert pace_module.BUILD_SHARE == 0.025 and isinstance(InProcess(paced).imap(len, []), Iterator)
