"""Exact mid-epoch resume: one conformance helper for every DataModule (torchdata's run_test_save_load_state style).

Run N steps uninterrupted, recording each step's labels and per-image checksums (which identify the sample
and its augmentation); run again, stop at step k with a checkpoint, resume in a fresh process, and require the
concatenated records to equal the uninterrupted ones exactly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_fastdata import convert_folder_to_hdf5
from lightning_fastdata.testing import make_image_folder

HELPER = Path(__file__).with_name("helpers") / "resume_run.py"
STEPS = 12  # 39 images, batch 8: 5 steps per epoch, so 12 steps cross two epoch boundaries


def run(cfg: dict[str, Any], expect_kill: bool = False) -> None:
    out = subprocess.run([sys.executable, str(HELPER), json.dumps(cfg)], capture_output=True, text=True, timeout=240)
    if expect_kill:
        assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    else:
        assert out.returncode == 0, out.stderr[-3000:]


def records(path: Path, rank: int = 0) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in Path(f"{path}.rank{rank}").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "rank"} for line in lines]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = make_image_folder(tmp_path_factory.mktemp("resume") / "src", num_classes=3, per_class=13, size=(40, 30))
    h5 = convert_folder_to_hdf5(root, root.parent / "src.h5", mode="encoded", processes=1, progress=False)
    return {"folder": str(root), "hdf5": str(h5), "cache": str(root)}


_UNINTERRUPTED: dict[tuple, Path] = {}


def uninterrupted(base: dict[str, Any], tmp_path: Path) -> Path:
    """The reference run, once per (kind, workers, devices) for the whole module."""
    key = (base["kind"], base["workers"], base["devices"], base.get("snapshot"))
    if key not in _UNINTERRUPTED:
        record = tmp_path / "full"
        run({**base, "max_steps": STEPS, "record": str(record)})
        _UNINTERRUPTED[key] = record
    return _UNINTERRUPTED[key]


def conformance(tmp_path: Path, kind: str, source: str, workers: int, k: int, devices: int = 1, **extra: Any) -> None:
    """The helper every stateful loader goes through."""
    base = {"kind": kind, "source": source, "workers": workers, "devices": devices, "cache_dir": str(tmp_path / "c")}
    if "snapshot" in extra:
        base["snapshot"] = extra.pop("snapshot")
    full_record = uninterrupted(base, tmp_path)
    run({**base, "max_steps": k, "record": str(tmp_path / "part"), "save_every": k, "ckpt_dir": str(tmp_path / "ck")})
    ckpt = tmp_path / "ck" / "last.ckpt"
    run({**base, "max_steps": STEPS, "record": str(tmp_path / "part"), "ckpt_path": str(ckpt), **extra})
    for rank in range(devices):
        full, part = records(full_record, rank), records(tmp_path / "part", rank)
        assert [r["step"] for r in part] == list(range(STEPS))
        assert part == full, f"rank {rank}: resumed run differs from the uninterrupted one"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", [2, 5, 8], ids=["in-first-epoch", "epoch-boundary", "later-epoch"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["folder", "hdf5", "cache"])
def test_resume_is_exact(tmp_path: Path, sources: dict[str, str], kind: str, workers: int, k: int) -> None:
    conformance(tmp_path, kind, sources[kind], workers, k)


@pytest.mark.timeout(600)
def test_resume_when_configure_optimizers_reads_estimated_stepping_batches(tmp_path: Path, sources: dict) -> None:
    """Lightning #20550: touching estimated_stepping_batches loads the data before the checkpoint is restored."""
    conformance(tmp_path, "folder", sources["folder"], 2, 8, stepping=True, max_epochs=3)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("snapshot", [3, 4])
def test_resume_is_exact_with_sparse_snapshots(tmp_path: Path, sources: dict[str, str], snapshot: int) -> None:
    """Checkpoints between snapshots: the loader replays the batches since the last snapshot."""
    conformance(tmp_path, "folder", sources["folder"], 2, 7, snapshot=snapshot)
