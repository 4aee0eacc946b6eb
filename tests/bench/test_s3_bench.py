"""``python -m benchmarks.s3`` end to end at tiny sizes, against the real local S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_s3_bench_times_every_row_and_says_where_the_cpu_went(tmp_path: Path) -> None:
    out_json = tmp_path / "s3.json"
    args = ["--images", "64", "--batch-size", "16", "--size", "32", "--repeats", "1", "--min-seconds", "0.3"]
    pin = len(os.sched_getaffinity(0)) >= 2  # the loader on one CPU, the server and the proxy on another
    args += ["--pin"] if pin else []
    # a run that hangs (seen twice in full-suite runs under load, never alone) says where it waits: its stacks
    cmd = [sys.executable, "-m", "benchmarks.s3", *args, "--json", str(out_json), "--watchdog", "240"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"the s3 bench ran past 280 s; its stacks at 240 s:\n{err.stderr!r}"[-8000:]) from None
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r["loader"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert "ImageFolderDataModule (s3, +20 ms/request)" in rows and "torchvision ImageFolder (local)" in rows
    for name, row in rows.items():
        assert row["images_per_s"] > 0 and row["img_s_per_loader_core"] > 0, name
        assert 0 <= row["cpu_share_server"] <= 1 and 0 <= row["cpu_share_proxy"] <= 1, name
    # the server works for the bucket rows only; the proxy only for the rows that go through it
    assert (
        rows["ImageFolderDataModule (s3, direct)"]["cpu_share_server"]
        > rows["ImageFolderDataModule (local)"]["cpu_share_server"]
    )
    assert rows["ImageFolderDataModule (s3, +20 ms/request)"]["cpu_share_proxy"] > 0.01
    assert rows["ImageFolderDataModule (s3, direct)"]["cpu_share_proxy"] < 0.01
    assert "img/s per loader core" in out.stdout
    # one GET per image streamed: the read-ahead fetches nothing twice, a file-by-file loader nothing less
    for name in ("ImageFolderDataModule (s3, +20 ms/request)", "ImageFolderDataModule (s3, +20 ms, 1 in flight)"):
        assert rows[name]["requests_per_image"] == pytest.approx(1.0, abs=0.02), name
    assert rows["ImageFolderDataModule (s3, direct)"]["requests_per_image"] == 0  # it bypasses the proxy
    # data bigger than the local disk: the compact cache is built from the bucket once, smaller than the originals
    result = json.loads(out_json.read_text())
    assert result["pinned"] == pin
    assert "HDF5DataModule, compact cache built from s3 (local disk)" in rows
    assert 0 < result["compact_cache"]["bytes_per_image"] < result["bytes_per_image"]
    assert result["compact_cache"]["build_images_per_s"] > 0
    try:
        import litdata  # noqa: F401
    except ImportError:
        assert "litdata is not installed" in out.stdout
    else:  # the peer on the same bucket: it downloads chunks (a few GETs for the whole set), not objects
        assert rows["LitData (s3, +20 ms/request, cache < data)"]["requests_per_image"] < 0.5


def _weed_children(pid: int) -> list[int]:
    """The ``weed`` processes whose parent is ``pid`` (processes that end while being read are skipped)."""
    from benchmarks.s3 import _parent_of

    found = []
    for entry in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            if _parent_of(entry) == pid and b"weed" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(entry)
        except OSError:
            continue
    return found


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_terminated_s3_suite_stops_its_server(tmp_path: Path) -> None:
    """The s3 suite (what `python -m benchmarks.loaders --suites s3` runs) SIGTERMed mid-run (a scheduler's kill)
    leaves no S3 server behind. Run as its module with 16 images: the harness would first make and time its own
    1,536."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.s3", "--images", "16", "--repeats", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},  # the lab is the checkout's
    )
    weed: list[int] = []
    try:
        deadline = time.monotonic() + 150
        while not weed and time.monotonic() < deadline and proc.poll() is None:
            weed = _weed_children(proc.pid)
            time.sleep(0.2)
        assert weed, "the suite never started its S3 server"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 15
        while os.path.exists(f"/proc/{weed[0]}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{weed[0]}"), f"the S3 server {weed[0]} outlived the terminated suite"
    finally:  # whatever failed, nothing of this run is left running
        proc.kill()
        proc.wait()
        for pid in weed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_s3_suites_cpu_accounting_sees_a_process_burn_cpu() -> None:
    """What the suite's "where the CPU went" columns are made of, in the fast tier (the slow tests run the suite)."""
    from benchmarks import litdata_rows, s3

    before, busy = s3._process_cpu_s(os.getpid()), s3._machine_busy_s()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert s3._process_cpu_s(os.getpid()) - before >= 0.2
    assert s3._machine_busy_s() - busy >= 0.2
    assert s3._stat_fields(2**22 + 7) == []  # no such process: nothing, not an error
    assert litdata_rows.available() in (True, False)
