from __future__ import annotations

from pathlib import Path

import pytest

from lightning_fastdata import CpuBudget, resolve_num_workers
from lightning_fastdata.loading.meter import DataWaitMeter
from lightning_fastdata.loading.workers import _read_cgroup_quota


@pytest.mark.parametrize(
    ("affinity", "quota", "devices", "expected"),
    [
        (2, None, 1, 1),
        (16, None, 1, 15),
        (16, 4.0, 1, 3),
        (16, 2.5, 1, 1),
        (16, None, 4, 3),
        (8, None, 8, 0),
        (1, None, 1, 0),
    ],
)
def test_auto_workers(affinity: int, quota: float | None, devices: int, expected: int) -> None:
    assert resolve_num_workers("auto", devices, CpuBudget(affinity, quota)) == expected


def test_explicit_workers_win_and_bad_values_raise() -> None:
    assert resolve_num_workers(5, 8, CpuBudget(1)) == 5
    with pytest.raises(ValueError, match="non-negative"):
        resolve_num_workers(-1)
    with pytest.raises(ValueError, match="'auto'"):
        resolve_num_workers("many")


def test_cgroup_quota_files(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert _read_cgroup_quota(str(tmp_path)) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _read_cgroup_quota(str(tmp_path)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert _read_cgroup_quota(str(v1)) == 3.0
    assert CpuBudget.detect(str(tmp_path / "none")).usable >= 1


def test_meter_exact_under_a_fake_clock() -> None:
    now = [0.0]
    meter = DataWaitMeter(clock=lambda: now[0])
    # step 0 (warm-up, not counted): starts at 10, ends at 11
    now[0] = 10.0
    meter.step_start(8)
    now[0] = 11.0
    meter.step_end()
    # step 1: waits 1 s, computes 3 s; step 2: waits 0 s, computes 4 s
    for wait, compute in ((1.0, 3.0), (0.0, 4.0)):
        now[0] += wait
        meter.step_start(8)
        now[0] += compute
        meter.step_end()
    stats = meter.window()
    assert stats.steps == 2 and stats.samples == 16
    assert stats.data_wait_fraction == pytest.approx(1.0 / 8.0)
    assert stats.samples_per_sec == pytest.approx(16 / 8.0)
    assert meter.window().steps == 0 and meter.total().steps == 2
    meter.reset_reference()  # e.g. validation ran: the next step only re-anchors
    now[0] += 100
    meter.step_start(8)
    now[0] += 1
    meter.step_end()
    assert meter.total().steps == 2
