from __future__ import annotations

from pathlib import Path

import pytest

from lightning_fastdata import CpuBudget, resolve_num_workers
from lightning_fastdata.callbacks.meter import DataWaitMeter
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
    # step 0 (no reference point yet: measured from its own start, no wait): starts at 10, ends at 11
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
    assert stats.steps == 3 and stats.samples == 24  # every step counts
    assert stats.data_wait_fraction == pytest.approx(1.0 / 9.0)
    assert stats.samples_per_sec == pytest.approx(24 / 9.0)
    assert meter.window().steps == 0 and meter.total().steps == 3
    now[0] += 100  # validation ran: not waiting for training data
    meter.reset_reference()  # the next epoch starts: its first batch is fetched from here
    now[0] += 2
    meter.step_start(8)
    now[0] += 1
    meter.step_end()
    total = meter.total()
    assert total.steps == 4 and total.wait_s == pytest.approx(3.0) and total.total_s == pytest.approx(12.0)
